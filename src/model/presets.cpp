#include "tileweave/model/presets.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tw {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The partitioned L2's parameters (a probe's JSON, given as --gpu FILE.json, overrides them): two
// halves with far copies (the A100/H100 whitepapers: "each L2 partition localizes and caches data
// for memory accesses from SMs in the GPCs directly connected to the partition"), 128-byte lines
// of four sectors, 16 ways; tiles drifting by 15% per K-step (bench/l2_probe on the H200: chunk times
// within an SM spread 8.8%) on SMs 0.9% apart in speed (uniform; the GEMM tile timelines recorded on
// the H200, bench/results/h200/timelines: a tile's duration over the others' started with it spreads
// 0.34-0.72% between SMs, median 0.5%, the same SMs slow in every wave -- the probe's 1.2% between
// SMs' stream rates is twice what the kernels' own tiles show); weights read with the
// evict-first policy the tile bodies give them, replaced as the victims of choice: they never push
// the other lines out and live in the ways those leave (L2EvictFirst::Room, 2026-11-28; the earlier
// model, weights pushing other lines out with 0.7 of their bytes, fitted to issue 17's grid, is
// "evict_first": "push" and keeps its weight_push); a K-step's L2 hits take 0.75 of the time of its
// DRAM bytes (hit_time: a tile that hits catches up with the one that fetched, but less than its bytes
// say -- the step is near the tile's machine balance, 0.67 us of compute against 0.46 us for the
// 16 KiB of weights it fetches at 1/132 of 4.68 TB/s, and the recorded timelines show followers no
// closer at their end than at their start; 0.75 is the middle of the plain-GEMM half's plateau, 0.6 to
// 0.9 with the skew above, the FFN half held out: docs/model.md, 2026-11-29); the lines touched
// since a line's last use fall into its set at random only up to 3 a set, the rest evenly (set_fringe:
// a set hash spreads the whole tensors that a long reuse distance covers over every set alike, so a
// re-read over the capacity thrashes; the plain-GEMM half of the grid is flat from 1.5 to 5, 3 is its
// middle, the FFN half held out: docs/model.md, 2026-11-28; 0 is the Poisson model before).
L2Params hopper_l2() {
  L2Params p;
  p.partitions = 2;
  p.far_copies = true;
  p.line_bytes = 128;
  p.ways = 16;
  p.step_jitter = 0.153;
  p.sm_skew = 0.009;
  p.evict_first_weights = true;
  p.weight_push = 0.7;  // used with L2EvictFirst::Push only
  p.evict_first = L2EvictFirst::Room;
  p.hit_time = 0.75;
  p.set_fringe = 3;
  return p;
}
}  // namespace

// L2 sizes as the drivers report them (H200: 60 MiB measured on the lent machine, DESIGN.md §3).
// Read floors measured (H200 4.68 TB/s, H100 3.13); GEMM peak measured on the H200 (716 TFLOP/s,
// torch 8192^3) and assumed the same on the H100 (same SMs and clocks); the launch cost (3 us) is an
// assumption. One SM streams at most ~37 GB/s in the sm90 tile body: an SM issues ~2.3 bulk copies
// per us, and the body's weight copies are 16 KiB boxes (bench/results/h200/stream_patterns.json,
// fewer_sms: 16 / 32 / 64 KiB copies on 33 SMs read 37 / 74 / 119 GB/s each). A GEMM whose tiles
// leave SMs idle streams at that rate per tile: unsplit, the gate/up GEMM of a gated FFN with
// d = 9856, F = 4992 at M = 1 (78 tiles) ran 97.2 us, split in 4 K slices 82.0 (H200, 2026-11-25,
// bench_ffn; the replay with 74 GB/s had ranked the unsplit plan first).
//
// The time replay's constants (model/time_model.hpp), fitted on issue 17's validation grid on the
// H200 (bench/results/h200/model_vs_ncu.json, measured_us; docs/model.md "Predicted time"), each on
// the cases that isolate it:
// - tile_tflops 830, tile_fixed_us 5.5: the sm90 tile's K-step rate (128 weight rows x 256 activation
//   rows x 64 K in 0.67 us per SM) and its per-tile latency not hidden by the weight ring (first
//   stages, epilogue stores, the dependency poll); least squares over the unsplit plain GEMMs
//   (8b-gate-up at every M, 8b-down at M >= 1024: 48 cases), together with overlap_power.
// - overlap_power 3: a K-step takes (compute^3 + memory^3)^(1/3), memory = its DRAM bytes at its
//   share of the floor: with the same FLOPs, gate-up M = 4096 row_major (3.8 GB of DRAM reads) runs
//   6% slower than the orders that read 0.6-1.4 GB, and the max of the roofline says 0%.
// - reduce_tbps 0.65, reduce_block_gbps 35: split-K partial sums (fp32) are added at L2 at 0.65 TB/s
//   for the whole GPU, and the slices adding into one output block one after another at 35 GB/s;
//   fitted on the one-wave split GEMMs (8b-down M = 256 / 512: 128 slices ending together, +25-35 us)
//   and the fused FFN (slices of one block adjacent in row/col orders vs kslices: 8B M = 256 runs
//   205-211 us vs 181).
// - tile_fixed_base_us 2.0: the fixed latency grows with a tile's rows (its epilogue): 2.0 us for a
//   tile of no rows, 5.5 at 256 (64-row tiles 2.9 us). Fitted on the interleaved sweeps of the
//   morning of 2026-11-27 (seeds 16 and 2026, 128 shapes): the default plan's predicted time within
//   15% of the measured on 59 of 60 shapes at M <= 64 (29 of 60 with 5.5 for every tile: rms log
//   error 0.156 -> 0.061, the replay 15% high on average). On the sweeps after the epilogue's store
//   changes (bench/results/h200/sweep*.json, the same afternoon): 53 of 60 at M <= 64 (22 without),
//   44 of 68 above (40); 1.5 us would fit 56 of 60, but its plans are not the ones timed.
//   choose_ffn_splits ranks with it (25 of 85 of its choices at M <= 64 moved): timed beside the
//   plans of 5.5 for every tile in one interleaved run, geomean 1.0008 and 0.9962 of those
//   (sweep_small_tiles_ab*.json): the same speed, a truer prediction. Tiles of 256 rows (issue 17's
//   grid, M >= 256) keep 5.5.
// - slice_restart_us 1.5: a stream-K ticket's next K slice of the same block waits for its first
//   stage (the producer does not run ahead into it): the tile timelines show ~1.3 us per slice
//   (bench/results/h200/ffn_trace_streamk_*.json), and 1.5 fits the measured stream-K / default
//   ratio over the seed-16 sweep's 59 shapes that differ only in the order (rms log error 0.148 ->
//   0.063; model geomean 1.043 -> 1.180 against 1.189 measured; sweep_streamk_fit_ab.json).
// - split_finisher_rows 64: not a fit but the executor's rule (ffn_sm90::split_finisher_pays): the
//   sm90 body sums a split tile of more than 64 rows in its slice of the last K range.
// The H100 takes the H200's (same SMs and L2 design; not measured); the A100 none (roofline only).
GpuPreset gpu_preset(const std::string& name) {
  GpuPreset p;
  p.name = name;
  p.l2 = hopper_l2();
  if (name == "h200") {
    p.l2_bytes = int64_t{60} << 20, p.sms = 132, p.read_tbps = 4.68, p.gemm_tflops = 716;
    p.sm_stream_gbps = 37, p.launch_us = 3;
    p.tile_tflops = 830, p.tile_fixed_us = 5.5, p.overlap_power = 3, p.reduce_tbps = 0.65, p.reduce_block_gbps = 35;
    p.slice_restart_us = 1.5, p.tile_fixed_base_us = 2.0, p.split_finisher_rows = 64;
  } else if (name == "h100") {
    p.l2_bytes = int64_t{50} << 20, p.sms = 132, p.read_tbps = 3.13, p.gemm_tflops = 716;
    p.sm_stream_gbps = 37, p.launch_us = 3;
    p.tile_tflops = 830, p.tile_fixed_us = 5.5, p.overlap_power = 3, p.reduce_tbps = 0.65, p.reduce_block_gbps = 35;
    p.slice_restart_us = 1.5, p.tile_fixed_base_us = 2.0, p.split_finisher_rows = 64;
  } else if (name == "a100") {
    p.l2_bytes = int64_t{40} << 20, p.sms = 108, p.read_tbps = 1.90, p.gemm_tflops = 280;
    p.sm_stream_gbps = 40, p.launch_us = 4;
  } else {
    throw InvalidArgument("unknown GPU preset '" + name + "' (known: " + join(gpu_preset_names()) + ")");
  }
  return p;
}
std::vector<std::string> gpu_preset_names() { return {"h100", "h200", "a100"}; }

GpuPreset gpu_preset_for_device(const std::string& device_name, int sms, int64_t l2_bytes) {
  const bool h200 = device_name.find("H200") != std::string::npos, a100 = device_name.find("A100") != std::string::npos;
  GpuPreset p = gpu_preset(h200 ? "h200" : a100 ? "a100" : "h100");
  if (sms > 0) p.sms = sms;
  if (l2_bytes > 0) p.l2_bytes = l2_bytes;
  return p;
}

GpuPreset gpu_preset_from_json(const std::string& text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw InvalidArgument(what + ": malformed JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw InvalidArgument(what + ": a GPU preset must be a JSON object");
  GpuPreset p = gpu_preset(j.value("base", std::string("h200")));
  // Every value read is range-checked here; the L2 ones again by CacheConfig::validate.
  auto num = [&](const nlohmann::json& o, const char* key, double lo, double hi, double cur) {
    if (!o.contains(key)) return cur;
    if (!o[key].is_number()) throw InvalidArgument(what + ": '" + key + "' must be a number");
    const double v = o[key].get<double>();
    if (!(v >= lo && v <= hi))
      throw InvalidArgument(what + ": '" + key + "' = " + o[key].dump() + " is out of range [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
    return v;
  };
  p.name = j.value("name", p.name);
  p.l2_bytes = static_cast<int64_t>(num(j, "l2_bytes", 1024, double(int64_t{1} << 40), double(p.l2_bytes)));
  p.sms = static_cast<int>(num(j, "sms", 1, 100000, p.sms));
  p.read_tbps = num(j, "read_tbps", 1e-3, 1e3, p.read_tbps);
  p.gemm_tflops = num(j, "gemm_tflops", 1e-3, 1e6, p.gemm_tflops);
  p.sm_stream_gbps = num(j, "sm_stream_gbps", 1e-3, 1e6, p.sm_stream_gbps);
  p.launch_us = num(j, "launch_us", 0, 1e6, p.launch_us);
  p.tile_tflops = num(j, "tile_tflops", 0, 1e6, p.tile_tflops);
  p.tile_fixed_us = num(j, "tile_fixed_us", 0, 1e6, p.tile_fixed_us);
  p.tile_fixed_base_us = num(j, "tile_fixed_base_us", -1, 1e6, p.tile_fixed_base_us);
  p.reduce_tbps = num(j, "reduce_tbps", 0, 1e3, p.reduce_tbps);
  p.reduce_block_gbps = num(j, "reduce_block_gbps", 0, 1e6, p.reduce_block_gbps);
  p.slice_restart_us = num(j, "slice_restart_us", 0, 1e6, p.slice_restart_us);
  p.split_finisher_rows = static_cast<int>(num(j, "split_finisher_rows", 0, 1e6, p.split_finisher_rows));
  p.overlap_power = num(j, "overlap_power", 0, 1e3, p.overlap_power);
  if (j.contains("l2")) {
    const nlohmann::json& l = j["l2"];
    if (!l.is_object()) throw InvalidArgument(what + ": 'l2' must be an object");
    p.l2.partitions = static_cast<int>(num(l, "partitions", 1, 2, p.l2.partitions));
    p.l2.line_bytes = static_cast<int64_t>(num(l, "line_bytes", 1, 1 << 20, double(p.l2.line_bytes)));
    p.l2.ways = static_cast<int>(num(l, "ways", 0, 1024, p.l2.ways));
    p.l2.step_jitter = num(l, "step_jitter", 0, 0.99, p.l2.step_jitter);
    p.l2.sm_skew = num(l, "sm_skew", 0, 0.99, p.l2.sm_skew);
    p.l2.weight_push = num(l, "weight_push", 0, 1, p.l2.weight_push);
    p.l2.hit_time = num(l, "hit_time", 1e-3, 1, p.l2.hit_time);
    p.l2.set_fringe = num(l, "set_fringe", 0, 1e6, p.l2.set_fringe);
    p.l2.seed = static_cast<uint64_t>(num(l, "seed", 0, 1e15, double(p.l2.seed)));
    if (l.contains("evict_first")) {
      if (!l["evict_first"].is_string()) throw InvalidArgument(what + ": 'evict_first' must be \"push\" or \"room\"");
      try {
        p.l2.evict_first = parse_l2_evict_first(l["evict_first"].get<std::string>());
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(what + ": " + e.what());
      }
    }
    for (auto [key, field] : {std::pair<const char*, bool*>{"far_copies", &p.l2.far_copies},
                              {"evict_first_weights", &p.l2.evict_first_weights}})
      if (l.contains(key)) {
        if (!l[key].is_boolean()) throw InvalidArgument(what + ": '" + key + "' must be true or false");
        *field = l[key].get<bool>();
      }
  }
  return p;
}

GpuPreset find_gpu_preset(const std::string& name) {
  if (name.size() < 5 || name.substr(name.size() - 5) != ".json") return gpu_preset(name);
  std::ifstream in(name);
  if (!in) throw InvalidArgument("cannot read GPU preset file '" + name + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return gpu_preset_from_json(ss.str(), "GPU preset file '" + name + "'");
}

FfnShape model_preset(const std::string& name, int64_t m) {
  if (m <= 0) throw InvalidArgument("M (tokens) must be positive, got " + std::to_string(m));
  if (m > (int64_t{1} << 24)) throw InvalidArgument("M (tokens) " + std::to_string(m) + " is absurd");
  if (name == "llama3-8b") return {m, 4096, 14336, true};
  if (name == "llama3-70b") return {m, 8192, 28672, true};
  if (name == "chain") return {m, 4096, 14336, false};
  throw InvalidArgument("unknown model preset '" + name + "' (known: " + join(model_preset_names()) + ")");
}
std::vector<std::string> model_preset_names() { return {"llama3-8b", "llama3-70b", "chain"}; }

}  // namespace tw
