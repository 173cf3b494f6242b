// The shape sweep of issue 16: FFN and plain-MLP shapes that no model table names, generated from a
// seed, each against cuBLASLt-unfused (two GEMMs and, when gated, the elementwise SiLU*mul) on the
// same weights, with the streaming-read floor measured in the same run. What a user gets: FusedFfn
// with its default options (the planner's tiling, weights as given: `us`, `speedup`), and the same
// on weights packed once for streaming (FfnOptions::packed_weights, ops.ffn_packed: `packed_us`,
// `packed_speedup`, `packed_pct_floor`).
//   bench_sweep [--seed N] [--ffn N] [--ms LIST] [--also SPEC]... [--out DIR]
// --also SPEC (repeatable): a further form, FusedFfn with the options of a variant spec
// (bench/ffn_variant.hpp, e.g. rows=pow2 or order=streamk), timed in the same run:
// `also<i>_us`, `also<i>_speedup`, ... for the i-th; an A/B of options on a grid no one tuned for.
// --ms: the M values the shapes take in turn (default below). Every form also records the traffic
// model's predicted time for its graph and schedule (`model_us`: the simple L2 and the tile replay
// on this GPU's preset, as `tileweave plan` ranks them).
// The grid: N shapes (default 64), gated and plain in turn, d and F multiples of 128 in [1024, 16384]
// drawn from the seed, M through {1, 8, 16, 32, 37, 64, 100, 128, 200, 256, 512, 2048, 4096} in turn
// (a shape per M at least five times). Times are back to back (launches in one CUDA graph, time per
// launch; weight sets rotated so L2 holds none of a launch's weights), as the bars read them, and the
// peer and every form are timed in interleaved rounds (harness.cuh, interleaved_us: no form gains by
// its place in the order).
// Writes sweep.json: per case op, shape, us, peer, peer_us, speedup (peer_us / us), pct_floor,
// memory_bound (M <= 64), the output's difference from cuBLAS; and a summary.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cublas_baseline.cuh"
#include "ffn_variant.hpp"
#include "harness.cuh"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/model/validation.hpp"
#include "tileweave/ops/ffn.hpp"

namespace {

using bf16 = __nv_bfloat16;
using namespace tw::bench;

const std::vector<int64_t> kMs = {1, 8, 16, 32, 37, 64, 100, 128, 200, 256, 512, 2048, 4096};

// The model's time for the op's own graph and schedule (simple L2, tile replay), as the planner ranks.
double predicted_us(const tw::FusedFfn& f, const tw::GpuPreset& preset) {
  const tw::TileGraph& g = f.graph().graph;
  const tw::Schedule& s = f.schedule();
  const tw::TrafficReport r = tw::simulate(g, s, tw::validation_cache_config(preset, f.grid(), false));
  return tw::predict_time(g, s, r, tw::time_params(preset, f.grid())).fused_us;
}

struct Shape {
  int64_t m, d, f;
  bool gated;
};

std::vector<Shape> ffn_grid(uint64_t seed, int count, const std::vector<int64_t>& ms) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dim(8, 128);  // x 128: 1024 .. 16384
  std::vector<Shape> out;
  for (int i = 0; i < count; ++i)
    out.push_back({ms[i % ms.size()], 128 * dim(rng), 128 * dim(rng), i % 2 == 0});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 16;
  int ffn_count = 64;
  std::string out_dir;
  std::vector<std::string> also;
  std::vector<tw::FfnOptions> also_opt;
  std::vector<int64_t> ms = kMs;
  try {
    for (int i = 1; i < argc; ++i) {
      const bool has = i + 1 < argc;
      if (!std::strcmp(argv[i], "--seed") && has) seed = std::stoull(argv[++i]);
      else if (!std::strcmp(argv[i], "--ffn") && has) ffn_count = std::atoi(argv[++i]);
      else if (!std::strcmp(argv[i], "--ms") && has) {
        const std::vector<int> v = parse_counts(argv[++i], "--ms");
        ms.assign(v.begin(), v.end());
      }
      else if (!std::strcmp(argv[i], "--also") && has) also.push_back(argv[++i]), also_opt.push_back(parse_ffn_variant(also.back()));
      else if (!std::strcmp(argv[i], "--out") && has) out_dir = argv[++i];
      else {
        std::fprintf(stderr,
                     "bench_sweep: unknown or incomplete argument '%s'\nusage: bench_sweep [--seed N] [--ffn N] [--ms LIST] "
                     "[--also SPEC]... [--out DIR]\n",
                     argv[i]);
        return 2;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sweep: %s\n", e.what());
    return 2;
  }
  if (ffn_count < 1) {
    std::fprintf(stderr, "bench_sweep: --ffn %d must be >= 1\n", ffn_count);
    return 2;
  }
  if (!out_dir.empty()) setenv("TW_RESULTS_DIR", out_dir.c_str(), 1);
  const Gpu gpu = current_gpu();
  const Floor floor = measure_floor(gpu);
  std::printf("%s: floor %.3f TB/s; seed %llu, %d FFN/MLP shapes\n", gpu.prop.name, floor.tbps(),
              (unsigned long long)seed, ffn_count);
  ResultFile rf("sweep", gpu, floor);
  rf.doc["seed"] = seed;
  if (!also.empty()) rf.doc["also"] = also;
  rf.doc["ms"] = ms;
  const tw::GpuPreset preset = tw::gpu_preset_for_device(gpu.prop.name, gpu.prop.multiProcessorCount, gpu.prop.l2CacheSize);
  rf.doc["method"] = "back to back: the launches of one CUDA graph (>= 8, weight sets in turn so L2 holds none of a "
                     "launch's weights), median graph time / launches; the peer and every form in 3 interleaved "
                     "rounds (harness.cuh, interleaved_us), the median round; ours = FusedFfn with default options on "
                     "unpacked weights; peer = cuBLASLt (heuristic's first algorithm, 32 MiB workspace) for each "
                     "GEMM and, gated, the SiLU*mul kernel between them";

  cublasLtHandle_t lt;
  cublas_check(cublasLtCreate(&lt), "cublasLtCreate");
  const size_t lt_ws_bytes = size_t(32) << 20;
  void* lt_ws = dev_alloc<char>(lt_ws_bytes);

  int n = 0, at_peer = 0, mem_cases = 0, mem_at_floor = 0, prefill = 0, prefill_ok = 0;
  int packed_at_peer = 0, packed_mem_at_floor = 0, packed_prefill_ok = 0;
  std::vector<int> also_at_peer(also.size(), 0), also_faster(also.size(), 0);
  double worst_speedup = 1e30, packed_worst = 1e30;
  std::printf("%4s %-5s %5s %6s %6s %10s %10s %8s %7s %10s %8s %7s", "#", "op", "M", "d", "F", "ours us", "cuBLASLt",
              "speedup", "%floor", "packed us", "speedup", "%floor");
  for (size_t a = 0; a < also.size(); ++a) std::printf(" %9s%zu %8s", "also us ", a, "speedup");
  std::printf("\n");
  for (const Shape& s : ffn_grid(seed, ffn_count, ms)) {
    const int64_t n1 = (s.gated ? 2 : 1) * s.f;
    const double wbytes = double(n1 * s.d + s.d * s.f) * 2;
    const FfnWeightSets ws(s.d, s.f, s.gated, gpu.prop.l2CacheSize);
    const int sets = ws.sets;
    const std::vector<bf16*>&wgu = ws.gate_up, &wd = ws.down;
    bf16 *x = dev_alloc<bf16>(s.m * s.d), *y = dev_alloc<bf16>(s.m * s.d), *y_ref = dev_alloc<bf16>(s.m * s.d),
         *gu = dev_alloc<bf16>(s.m * n1), *h = dev_alloc<bf16>(s.m * s.f);
    fill_noise_bf16(x, size_t(s.m * s.d), 99 + s.m);
    TW_CUDA_CHECK(cudaDeviceSynchronize());

    nlohmann::json c{{"op", s.gated ? "ffn" : "mlp"}, {"m", s.m}, {"d", s.d}, {"f", s.f}, {"gated", s.gated},
                     {"weight_bytes", wbytes}, {"memory_bound", s.m <= 64}};
    const double floor_us = wbytes / (floor.tbps() * 1e12) * 1e6;
    c["floor_us"] = floor_us;
    LtGemm g1(lt, s.m, n1, s.d, lt_ws, lt_ws_bytes), g2(lt, s.m, s.d, s.f, lt_ws, lt_ws_bytes);
    auto unfused = [&](int k, cudaStream_t st) {
      g1.run(x, wgu[k], s.gated ? gu : h, st);
      if (s.gated) silu_mul_kernel<<<(s.m * s.f / 2 + 255) / 256, 256, 0, st>>>(gu, h, s.m, s.f);
      g2.run(h, wd[k], y_ref, st);
    };
    const SeqTimer peer_timer(unfused, sets);
    c["peer"] = "cublaslt_unfused";
    // The forms of ours (the default, packed weights, each --also), recorded under their prefixes;
    // one the op refuses records why, times 0 and counts as a miss.
    struct Form {
      std::string prefix;
      std::unique_ptr<tw::FusedFfn> ffn;
      std::vector<bf16*> pgu, pd;  // packed copies of the sets, made once as at model load
      std::unique_ptr<SeqTimer> timer;
      void run(const FfnWeightSets& w, int k, const bf16* in, bf16* out, cudaStream_t st) const {
        ffn->run(in, pgu.empty() ? w.gate_up[k] : pgu[k], pd.empty() ? w.down[k] : pd[k], out, st);
      }
      ~Form() {
        timer.reset();
        for (bf16* q : pgu) cudaFree(q);
        for (bf16* q : pd) cudaFree(q);
      }
    };
    tw::FfnOptions packed;
    packed.packed_weights = true;
    std::vector<std::pair<std::string, tw::FfnOptions>> specs{{"", {}}, {"packed_", packed}};
    for (size_t a = 0; a < also.size(); ++a) specs.emplace_back("also" + std::to_string(a) + "_", also_opt[a]);
    std::vector<Form> forms(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      Form& f = forms[i];
      f.prefix = specs[i].first;
      try {
        f.ffn = std::make_unique<tw::FusedFfn>(tw::FfnShape{s.m, s.d, s.f, s.gated}, specs[i].second);
      } catch (const tw::InvalidArgument& e) {
        c[f.prefix + "error"] = e.what();
        continue;
      }
      if (f.ffn->uses_packed_weights())
        for (int k = 0; k < sets; ++k) {
          f.pgu.push_back(dev_alloc<bf16>(f.ffn->packed_size().gate_up));
          f.pd.push_back(dev_alloc<bf16>(f.ffn->packed_size().down));
          f.ffn->pack(wgu[k], wd[k], f.pgu[k], f.pd[k], 0);
        }
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      f.timer = std::make_unique<SeqTimer>([&](int k, cudaStream_t st) { f.run(ws, k, x, y, st); }, sets);
    }
    std::vector<const SeqTimer*> timers{&peer_timer};
    for (const Form& f : forms) timers.push_back(f.timer.get());
    const std::vector<double> times = interleaved_us(timers);
    const double peer_us = times[0];
    c["peer_us"] = peer_us;
    unfused(0, 0);  // the reference, on set 0 (the replays left the last set's output)
    for (size_t i = 0; i < forms.size(); ++i) {
      const Form& f = forms[i];
      if (!f.ffn) continue;
      const double t = times[i + 1];
      f.run(ws, 0, x, y, 0);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      c[f.prefix + "us"] = t;
      c[f.prefix + "speedup"] = peer_us / t;
      c[f.prefix + "pct_floor"] = 100 * floor_us / t;
      c[f.prefix + "rel_diff_vs_cublas"] = rel_diff_bf16(y, y_ref, size_t(s.m * s.d));
      c[f.prefix + "mainloop"] = f.ffn->uses_sm90() ? "sm90" : "sm80";
      c[f.prefix + "model_us"] = predicted_us(*f.ffn, preset);
      c[f.prefix + "schedule"] = f.ffn->schedule().name;  // "waves:..." where the planner split only the last waves
    }
    const double us = times[1], packed_us = times[2];
    std::vector<double> also_us(times.begin() + 3, times.end());
    for (size_t a = 0; a < also.size(); ++a)
      if (also_us[a] > 0) also_at_peer[a] += peer_us / also_us[a] >= 1.0, also_faster[a] += also_us[a] < us;
    ++n;
    if (packed_us > 0) {
      const double sp = peer_us / packed_us;
      packed_worst = std::min(packed_worst, sp);
      packed_at_peer += sp >= 1.0;
      if (s.m <= 64 && wbytes >= 64e6) packed_mem_at_floor += floor_us / packed_us >= 0.9;
      if (s.m >= 2048) packed_prefill_ok += sp >= 1.05;
    } else {
      packed_worst = 0;
    }
    if (us > 0) {
      const double sp = peer_us / us;
      worst_speedup = std::min(worst_speedup, sp);
      at_peer += sp >= 1.0;
      if (s.m <= 64 && wbytes >= 64e6) ++mem_cases, mem_at_floor += floor_us / us >= 0.9;
      if (s.m >= 2048) ++prefill, prefill_ok += sp >= 1.05;
      std::printf("%4d %-5s %5lld %6lld %6lld %10.1f %10.1f %8.3f %6.1f%% %10.1f %8.3f %6.1f%%", n, s.gated ? "ffn" : "mlp",
                  (long long)s.m, (long long)s.d, (long long)s.f, us, peer_us, sp, 100 * floor_us / us, packed_us,
                  packed_us > 0 ? peer_us / packed_us : 0.0, packed_us > 0 ? 100 * floor_us / packed_us : 0.0);
      for (double t : also_us) std::printf(" %10.1f %8.3f", t, t > 0 ? peer_us / t : 0.0);
      std::printf("\n");
    } else {
      if (s.m <= 64 && wbytes >= 64e6) ++mem_cases;
      if (s.m >= 2048) ++prefill;
      worst_speedup = 0;
      std::printf("%4d %-5s %5lld %6lld %6lld  refused: %s\n", n, s.gated ? "ffn" : "mlp", (long long)s.m, (long long)s.d,
                  (long long)s.f, c["error"].get<std::string>().c_str());
    }
    std::fflush(stdout);
    rf.add(c);
    forms.clear();  // the graphs first: they name the buffers below
    for (void* p : {(void*)x, (void*)y, (void*)y_ref, (void*)gu, (void*)h}) TW_CUDA_CHECK(cudaFree(p));
  }
  rf.doc["summary"] = {{"cases", n},
                       {"at_or_above_peer", at_peer},
                       {"worst_speedup", worst_speedup},
                       {"memory_bound_ge_64mb", mem_cases},
                       {"memory_bound_ge_64mb_at_90pct_floor", mem_at_floor},
                       {"prefill_m_ge_2048", prefill},
                       {"prefill_at_1_05x_peer", prefill_ok},
                       {"packed_at_or_above_peer", packed_at_peer},
                       {"packed_worst_speedup", packed_worst},
                       {"packed_memory_bound_ge_64mb_at_90pct_floor", packed_mem_at_floor},
                       {"packed_prefill_at_1_05x_peer", packed_prefill_ok}};
  if (!also.empty()) {
    rf.doc["summary"]["also_at_or_above_peer"] = also_at_peer;
    rf.doc["summary"]["also_faster_than_default"] = also_faster;
  }
  const std::string path = rf.write(gpu);
  std::printf("\n%d cases: %d at or above cuBLASLt-unfused (worst %.3fx); memory-bound >= 64 MB: %d of %d at >= 90%% of the "
              "floor; prefill (M >= 2048): %d of %d at >= 1.05x\npacked weights: %d at or above (worst %.3fx); "
              "memory-bound >= 64 MB: %d of %d at >= 90%%; prefill: %d of %d at >= 1.05x -> %s\n",
              n, at_peer, worst_speedup, mem_at_floor, mem_cases, prefill_ok, prefill, packed_at_peer, packed_worst,
              packed_mem_at_floor, mem_cases, packed_prefill_ok, prefill, path.c_str());
  for (size_t a = 0; a < also.size(); ++a)
    std::printf("also%zu '%s': %d at or above cuBLASLt-unfused, %d of %d faster than the default\n", a, also[a].c_str(),
                also_at_peer[a], also_faster[a], n);
  return 0;
}
