// FFN benchmark: the fused executor (several orders / sync policies) against (a) unfused cuBLASLt
// GEMMs + an elementwise SiLU*mul and (b) the CuSync-style two-kernel version, with the
// streaming-read floor measured in the same run. Weights are rotated so L2 holds none of them.
//   bench_ffn [--models 8b,70b,chain,D:F,D:F:plain] [--ms 1,4,16,64,128,256] [--reps 100] [--variants 'spec;spec;...']
//   a variant spec is key=value pairs joined by ',' (bench/ffn_variant.hpp: mainloop, order, sync, bk,
//   sg, sd, bps, ks, ds, pw, ov, splits, rows, ww; unset = FfnOptions' default), e.g.
//   mainloop=sm90,order=kslices/col_major,sd=28
//   bench_ffn --profile spec --models 8b --ms 16   runs one variant 3 times for ncu and prints
//   the traffic model's DRAM bytes for its schedule
//   bench_ffn --trace spec --models 8b --ms 16   records one launch's tile timeline per case (sm90),
//   prints where the time went and writes ffn_trace_<model>_m<M>.json (scripts/plot_trace.py draws it)
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cublas_baseline.cuh"
#include "ffn_variant.hpp"
#include "harness.cuh"
#include "tile_trace.cuh"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/ops/ffn.hpp"

using namespace tw;
using namespace tw::bench;
using bf16 = __nv_bfloat16;

namespace {

__global__ void fill_random(bf16* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // Sum of two uniforms: roughly bell-shaped, never zero-heavy.
    const float u = (float(z & 0xffffff) + float((z >> 24) & 0xffffff)) / float(1 << 24) - 1.f;
    p[i] = __float2bfloat16(u * scale * 1.7f);
  }
}

struct Model {
  std::string name;
  int64_t d, f;
  bool gated;
};

struct Variant {
  std::string name;
  FfnOptions opt;
};

// The traffic model's prediction for the schedule the executor runs: L2-sized cache, the grid's
// blocks as tiles in flight, 32-byte sectors, cold start (the benchmark rotates weights likewise).
TrafficReport predict(const FusedFfn& ffn, const Gpu& gpu) {
  CacheConfig c;
  c.capacity_bytes = gpu.prop.l2CacheSize;
  c.in_flight = ffn.grid();
  c.line_bytes = 32;
  return simulate(ffn.graph().graph, ffn.schedule(), c);
}

}  // namespace

// One launch of the fused FFN with its tile timeline recorded (the third, the L2 flushed before each;
// tile_trace.cuh): prints where the time went and writes the timeline as JSON.
void trace_case(const Gpu& gpu, const Floor& floor, const Model& md, int64_t m, const std::string& spec) {
  const int64_t n1 = (md.gated ? 2 : 1) * md.f;
  bf16 *wgu = dev_alloc<bf16>(n1 * md.d), *wd = dev_alloc<bf16>(md.d * md.f), *x = dev_alloc<bf16>(m * md.d),
       *y = dev_alloc<bf16>(m * md.d);
  fill_random<<<1024, 256>>>(wgu, n1 * md.d, 17, 1.f / std::sqrt(float(md.d)));
  fill_random<<<1024, 256>>>(wd, md.d * md.f, 1017, 1.f / std::sqrt(float(md.f)));
  fill_random<<<256, 256>>>(x, m * md.d, 99, 1.f);
  FfnOptions opt = parse_ffn_variant(spec);
  opt.trace = true;
  FusedFfn ffn({m, md.d, md.f, md.gated}, opt);
  if (ffn.uses_packed_weights()) {  // pack in place of the originals
    bf16 *pgu = dev_alloc<bf16>(ffn.packed_size().gate_up), *pd = dev_alloc<bf16>(ffn.packed_size().down);
    ffn.pack(wgu, wd, pgu, pd, 0);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    TW_CUDA_CHECK(cudaFree(wgu));
    TW_CUDA_CHECK(cudaFree(wd));
    wgu = pgu, wd = pd;
  }
  const TracedLaunch tl = trace_cold_launch(gpu, ffn.plan(), [&](cudaStream_t st) { ffn.run(x, wgu, wd, y, st); });
  const nlohmann::json header = {{"benchmark", "ffn_trace"}, {"model", md.name}, {"d", md.d}, {"f", md.f},
                                 {"gated", md.gated}, {"m", m}, {"variant", spec}};
  const double wbytes = double(n1 * md.d + md.d * md.f) * 2;
  const nlohmann::json doc = tile_timeline_json(header, md.name + " M=" + std::to_string(m) + " '" + spec + "'", gpu,
                                                floor, ffn.graph().graph, ffn.grid(), tl, wbytes);
  const char* dir = std::getenv("TW_RESULTS_DIR");
  write_tile_timeline(doc, std::filesystem::path(dir ? dir : "bench/results") / gpu.slug,
                      "ffn_trace_" + md.name + "_m" + std::to_string(m));
  for (void* q : {(void*)wgu, (void*)wd, (void*)x, (void*)y}) TW_CUDA_CHECK(cudaFree(q));
}

int main(int argc, char** argv) {
  std::string models_arg = "8b,70b,chain", ms_arg = "1,4,16,64,128,256";
  int reps = 100;
  std::string profile_spec, trace_spec;
  // Both tile bodies with their defaults, and the sm90 body on weights in the packed layout.
  // ov=1 (overlap_previous) changes only the back-to-back time: each launch then starts on the SMs
  // the one before leaves.
  std::vector<std::string> variant_specs = {"mainloop=sm80", "mainloop=sm90", "mainloop=sm90,pw=1", "mainloop=sm90,pw=1,ov=1"};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--models") && i + 1 < argc) models_arg = argv[++i];
    else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) ms_arg = argv[++i];
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc) variant_specs = split_list(argv[++i], ';');
    else if (!std::strcmp(argv[i], "--profile") && i + 1 < argc) profile_spec = argv[++i];
    else if (!std::strcmp(argv[i], "--trace") && i + 1 < argc) trace_spec = argv[++i];
    else {
      std::fprintf(stderr, "bench_ffn: unknown argument '%s'\nusage: bench_ffn [--models 8b,70b,chain,D:F[:plain]] [--ms 1,16] [--reps 100]\n"
                   "                 [--variants 'key=value,...;key=value,...']  (keys: mainloop order sync bk sg sd bps ks ds pw ov splits rows ww)\n"
                   "                 [--profile variant]   (one variant, 3 launches, for ncu)\n"
                   "                 [--trace variant]     (one variant's tile timeline per case)\n", argv[i]);
      return 2;
    }
  }
  std::vector<Model> models;
  for (const auto& m : split_list(models_arg)) {
    if (m == "8b") models.push_back({"llama3-8b", 4096, 14336, true});
    else if (m == "70b") models.push_back({"llama3-70b", 8192, 28672, true});
    else if (m == "chain") models.push_back({"chain-16x14336x4096", 4096, 14336, false});
    else if (int64_t d = 0, f = 0; std::sscanf(m.c_str(), "%lld:%lld", (long long*)&d, (long long*)&f) == 2 && d > 0 && f > 0) {
      const bool plain = m.size() > 6 && m.compare(m.size() - 6, 6, ":plain") == 0;
      models.push_back({(plain ? "mlp-" : "ffn-") + std::to_string(d) + "x" + std::to_string(f), d, f, !plain});
    } else {
      std::fprintf(stderr, "bench_ffn: unknown model '%s' (8b, 70b, chain, or D:F / D:F:plain for any shape)\n", m.c_str());
      return 2;
    }
  }
  std::vector<int64_t> ms;
  try {
    for (int m : parse_counts(ms_arg, "--ms")) ms.push_back(m);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "bench_ffn: %s\n", e.what());
    return 2;
  }
  std::vector<Variant> variants;
  try {
    for (const auto& spec : variant_specs) variants.push_back({spec, parse_ffn_variant(spec)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ffn: %s\n", e.what());
    return 2;
  }

  if (!trace_spec.empty()) {
    const Gpu gpu = current_gpu();
    const Floor floor = measure_floor(gpu);  // the traced launch's bandwidth is read against it
    for (const Model& md : models)
      for (int64_t m : ms) trace_case(gpu, floor, md, m, trace_spec);
    return 0;
  }

  if (!profile_spec.empty()) {
    // For ncu: three launches of one fused variant per case (profile the third), and the model's
    // prediction for its schedule, nothing else on the GPU.
    const Gpu gpu = current_gpu();
    for (const Model& md : models)
      for (int64_t m : ms) {
        const int64_t n1 = (md.gated ? 2 : 1) * md.f;
        bf16 *wgu = dev_alloc<bf16>(n1 * md.d), *wd = dev_alloc<bf16>(md.d * md.f), *x = dev_alloc<bf16>(m * md.d),
             *y = dev_alloc<bf16>(m * md.d);
        fill_random<<<1024, 256>>>(wgu, n1 * md.d, 17, 1.f / std::sqrt(float(md.d)));
        fill_random<<<1024, 256>>>(wd, md.d * md.f, 1017, 1.f / std::sqrt(float(md.f)));
        fill_random<<<256, 256>>>(x, m * md.d, 99, 1.f);
        FusedFfn ffn({m, md.d, md.f, md.gated}, parse_ffn_variant(profile_spec));
        const TrafficReport r = predict(ffn, gpu);
        std::printf("PREDICT %s M=%lld %s: model dram_read %.1f MB, dram_write %.1f MB, weights %.1f MB\n", md.name.c_str(),
                    (long long)m, profile_spec.c_str(), r.dram_read / 1e6, r.dram_write / 1e6, (n1 * md.d + md.d * md.f) * 2 / 1e6);
        // The L2 is flushed between launches by streaming a buffer larger than it.
        char* flush = dev_alloc<char>(size_t(gpu.prop.l2CacheSize) * 4);
        for (int i = 0; i < 3; ++i) {
          TW_CUDA_CHECK(cudaMemset(flush, i, size_t(gpu.prop.l2CacheSize) * 4));
          ffn.run(x, wgu, wd, y, 0);
        }
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        for (void* p : {(void*)wgu, (void*)wd, (void*)x, (void*)y, (void*)flush}) TW_CUDA_CHECK(cudaFree(p));
      }
    return 0;
  }

  const Gpu gpu = current_gpu();
  const Floor floor = measure_floor(gpu);
  std::printf("GPU %s, %d SMs, L2 %.0f MiB; floor: bulk %.3f TB/s, vec %.3f TB/s\n", gpu.prop.name,
              gpu.prop.multiProcessorCount, gpu.prop.l2CacheSize / 1048576.0, floor.bulk_tbps, floor.vec_tbps);
  ResultFile rf("ffn", gpu, floor);
  rf.doc["method"] = "us: one launch per CUDA-graph replay, median of per-replay events; seq_us: the sets' launches back "
                     "to back in one graph (>= 8), graph time / launches; weights rotated over sets so L2 holds none";

  cublasLtHandle_t lt;
  cublas_check(cublasLtCreate(&lt), "cublasLtCreate");
  const size_t lt_ws_bytes = size_t(32) << 20;
  void* lt_ws = dev_alloc<char>(lt_ws_bytes);
  cudaStream_t s2;
  TW_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

  struct Row {
    std::string model;
    int64_t m;
    double floor_us, unfused, cusync, best;
    std::string best_name;
    double unfused_seq, best_seq;
    std::string best_seq_name;
  };
  std::vector<Row> rows;

  for (const Model& md : models) {
    const int64_t n1 = (md.gated ? 2 : 1) * md.f;
    const double wbytes = double(n1 * md.d + md.d * md.f) * 2;
    const FfnWeightSets ws(md.d, md.f, md.gated, gpu.prop.l2CacheSize);
    const int sets = ws.sets;
    const std::vector<bf16*>&wgu = ws.gate_up, &wd = ws.down;
    for (int64_t m : ms) {
      bf16* x = dev_alloc<bf16>(m * md.d);
      bf16* y_ref = dev_alloc<bf16>(m * md.d);
      bf16* y = dev_alloc<bf16>(m * md.d);
      bf16* gu = dev_alloc<bf16>(m * n1);
      bf16* h = dev_alloc<bf16>(m * md.f);
      fill_random<<<256, 256>>>(x, m * md.d, 99 + m, 1.f);
      TW_CUDA_CHECK_LAUNCH();
      const double floor_us = wbytes / (floor.tbps() * 1e12) * 1e6;

      LtGemm g1(lt, m, n1, md.d, lt_ws, lt_ws_bytes), g2(lt, m, md.d, md.f, lt_ws, lt_ws_bytes);
      auto unfused = [&](int s, cudaStream_t st) {
        g1.run(x, wgu[s], md.gated ? gu : h, st);
        if (md.gated) silu_mul_kernel<<<(m * md.f / 2 + 255) / 256, 256, 0, st>>>(gu, h, m, md.f);
        g2.run(h, wd[s], y_ref, st);
      };
      const double t_unfused = time_us(unfused, sets, 10, reps), t_unfused_seq = time_us_seq(unfused, sets);
      // Diagnostic: the floor kernel reading exactly these weights (two launches, like the op's
      // two weight streams): what one pass over this many bytes costs, ramp-up and tail included.
      auto stream = [&](int s, cudaStream_t st) {
        for (auto [p, n] : {std::pair<const bf16*, int64_t>{wgu[s], n1 * md.d}, {wd[s], md.d * md.f}})
          stream_read(gpu, p, uint64_t(n) * 2, st);
      };
      const double t_stream = time_us(stream, sets, 10, reps), t_stream_seq = time_us_seq(stream, sets);
      unfused(0, 0);
      TW_CUDA_CHECK(cudaDeviceSynchronize());

      const FfnShape shape{m, md.d, md.f, md.gated};
      // CuSync-style runs the sm80 tiles: the consumer kernel's blocks must fit beside the producer's
      // (sm90 tiles take a whole SM each, so the two kernels would simply run one after the other).
      FfnOptions two_opt;
      two_opt.mainloop = "sm80";
      two_opt.order = "op_by_op_column";
      FusedFfn two(shape, two_opt);
      const double t_cusync = time_us([&](int s, cudaStream_t st) { two.run_two_kernels(x, wgu[s], wd[s], y, st, s2); }, sets, 10, reps);

      double best = 1e30, best_seq = 1e30;
      std::string best_name, best_seq_name;
      nlohmann::json fused = nlohmann::json::array();
      for (const auto& v : variants) {
        std::unique_ptr<FusedFfn> made;
        try {
          made = std::make_unique<FusedFfn>(shape, v.opt);
        } catch (const InvalidArgument& e) {  // a variant that does not apply to this shape
          fused.push_back({{"variant", v.name}, {"skipped", e.what()}});
          continue;
        }
        const FusedFfn& ffn = *made;
        // Packed variants stream copies of the weight sets in the packed layout (made once, as at
        // model load; not timed).
        std::vector<bf16*> pgu, pd;
        if (ffn.uses_packed_weights())
          for (int s = 0; s < sets; ++s) {
            pgu.push_back(dev_alloc<bf16>(ffn.packed_size().gate_up));
            pd.push_back(dev_alloc<bf16>(ffn.packed_size().down));
            ffn.pack(wgu[s], wd[s], pgu[s], pd[s], 0);
          }
        TW_CUDA_CHECK(cudaDeviceSynchronize());  // the timing stream does not wait on stream 0
        auto w1 = [&](int s) { return pgu.empty() ? wgu[s] : pgu[s]; };
        auto w2 = [&](int s) { return pd.empty() ? wd[s] : pd[s]; };
        std::fprintf(stderr, "  %s M=%lld %-40s", md.name.c_str(), (long long)m, v.name.c_str());
        auto run = [&](int s, cudaStream_t st) { ffn.run(x, w1(s), w2(s), y, st); };
        const double t = time_us(run, sets, 10, reps), ts = time_us_seq(run, sets);
        std::fprintf(stderr, " %8.1f us, back to back %8.1f us\n", t, ts);  // progress (the table comes at the end)
        ffn.run(x, w1(0), w2(0), y, 0);
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        const double err = rel_diff_bf16(y, y_ref, m * md.d);
        const auto& G = ffn.graph().graph;
        const TrafficReport model = predict(ffn, gpu);
        fused.push_back({{"variant", v.name}, {"us", t}, {"seq_us", ts}, {"seq_pct_floor", 100 * floor_us / ts},
                         {"seq_speedup_vs_unfused", t_unfused_seq / ts}, {"model_dram_read_bytes", model.dram_read},
                         {"model_dram_write_bytes", model.dram_write}, {"tbps", wbytes / t * 1e-6}, {"pct_floor", 100 * floor_us / t},
                         {"speedup_vs_unfused", t_unfused / t}, {"speedup_vs_cusync", t_cusync / t},
                         {"rel_diff_vs_cublas", err}, {"tiles", G.num_tiles()}, {"grid", ffn.grid()},
                         {"split_gate_up", G.op(ffn.graph().op_gate_up).tiling.split_k},
                         {"split_down", G.op(ffn.graph().op_down).tiling.split_k},
                         {"mainloop", ffn.uses_sm90() ? "sm90" : "sm80"}, {"order", ffn.schedule().name},
                         {"packed_weights", ffn.uses_packed_weights()}});
        for (bf16* p : pgu) TW_CUDA_CHECK(cudaFree(p));
        for (bf16* p : pd) TW_CUDA_CHECK(cudaFree(p));
        if (err > 2e-2) std::printf("  WARNING %s M=%lld %s: rel diff vs cuBLAS %.3g\n", md.name.c_str(), (long long)m, v.name.c_str(), err);
        if (t < best) best = t, best_name = v.name;
        if (ts < best_seq) best_seq = ts, best_seq_name = v.name;
      }
      rf.add({{"model", md.name}, {"m", m}, {"d", md.d}, {"ffn", md.f}, {"gated", md.gated}, {"weight_bytes", wbytes},
              {"floor_us", floor_us}, {"weights_stream_us", t_stream}, {"unfused_cublaslt_us", t_unfused}, {"cusync_style_us", t_cusync},
              {"fused", fused}, {"best_fused_us", best}, {"best_fused", best_name},
              {"best_pct_floor", 100 * floor_us / best}, {"best_speedup_vs_unfused", t_unfused / best},
              {"best_speedup_vs_cusync", t_cusync / best}, {"weights_stream_seq_us", t_stream_seq},
              {"unfused_cublaslt_seq_us", t_unfused_seq}, {"best_seq_us", best_seq}, {"best_seq", best_seq_name},
              {"best_seq_pct_floor", 100 * floor_us / best_seq}, {"best_seq_speedup_vs_unfused", t_unfused_seq / best_seq}});
      rows.push_back({md.name, m, floor_us, t_unfused, t_cusync, best, best_name, t_unfused_seq, best_seq, best_seq_name});
      for (void* p : {(void*)x, (void*)y_ref, (void*)y, (void*)gu, (void*)h}) TW_CUDA_CHECK(cudaFree(p));
    }
  }
  const std::string path = rf.write(gpu);
  std::printf("\n%-22s %5s %9s %10s %10s %10s %6s %8s %8s  %s\n", "model", "M", "floor us", "cuBLASLt", "CuSync-st",
              "fused", "%floor", "x unfus", "x cusync", "best variant");
  for (const auto& r : rows)
    std::printf("%-22s %5lld %9.1f %10.1f %10.1f %10.1f %5.1f%% %8.3f %8.3f  %s\n", r.model.c_str(), (long long)r.m,
                r.floor_us, r.unfused, r.cusync, r.best, 100 * r.floor_us / r.best, r.unfused / r.best, r.cusync / r.best,
                r.best_name.c_str());
  std::printf("\nback to back (launches in one graph, time per launch):\n%-22s %5s %9s %10s %10s %6s %8s  %s\n", "model",
              "M", "floor us", "cuBLASLt", "fused", "%floor", "x unfus", "best variant");
  for (const auto& r : rows)
    std::printf("%-22s %5lld %9.1f %10.1f %10.1f %5.1f%% %8.3f  %s\n", r.model.c_str(), (long long)r.m, r.floor_us,
                r.unfused_seq, r.best_seq, 100 * r.floor_us / r.best_seq, r.unfused_seq / r.best_seq, r.best_seq_name.c_str());
  std::printf("floor %.3f TB/s (bulk %.3f, vec %.3f); results: %s\n", floor.tbps(), floor.bulk_tbps, floor.vec_tbps, path.c_str());
  return 0;
}
