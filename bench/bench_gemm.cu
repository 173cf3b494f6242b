// Standalone decode GEMM (ops/gemm.hpp, sm90 mainloop) against cuBLASLt, Llama-3 8B/70B FFN shapes,
// M in {1, 4, 16, 64, 128, 256}. Weights rotated over enough sets that L2 holds none of what is
// timed; the streaming-read floor and the bf16 GEMM peak are measured in the same run; the floor of
// a case is max(weight+activation bytes / read floor, 2MNK / GEMM peak). cuBLASLt gets its best of
// the first 8 heuristic algorithms (timed), not just the first.
//   bench_gemm [--quick] [--ms 1,16] [--split-sweep]
//     JSON -> $TW_RESULTS_DIR/<gpu>/gemm.json (or bench/results/<gpu>/); --split-sweep adds the
//     executor on packed weights with K cut in 1, 2, 4 and 8 slices (the default picks its own)
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "harness.cuh"
#include "tileweave/ops/decode_gemm.hpp"
#include "tileweave/ops/gemm.hpp"

namespace {

#define LT_CHECK(x)                                                                      \
  do {                                                                                   \
    cublasStatus_t s_ = (x);                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) throw tw::CudaError(std::string(#x) + " failed: " + \
                                                         std::to_string(int(s_)));       \
  } while (0)

__global__ void fill_random(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = __float2bfloat16((float(z >> 40) / float(1 << 24) - 0.5f) * scale);
  }
}

// Y[M,N] = X[M,K] W[N,K]^T through cuBLASLt: column-major C[N,M] = op(A=W)^T[N,K] * B=X^T[K,M].
struct LtGemm {
  cublasLtHandle_t h;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c;
  void* ws;
  size_t ws_bytes = size_t(64) << 20;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  int best = 0;

  LtGemm(cublasLtHandle_t handle, void* workspace, int M, int N, int K) : h(handle), ws(workspace) {
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, K, N, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, K, M, K));
    LT_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                  sizeof ws_bytes));
    algos.resize(8);
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(h, op, a, b, c, c, pref, 8, algos.data(), &found));
    algos.resize(found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) throw tw::CudaError("cuBLASLt: no algorithm");
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
  }
  void run(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* w, cudaStream_t st, int algo) const {
    const float one = 1.f, zero = 0.f;
    LT_CHECK(cublasLtMatmul(h, op, &one, w, a, x, b, &zero, y, c, y, c, &algos[algo].algo, ws, ws_bytes, st));
  }
};

double rel_diff(const std::vector<__nv_bfloat16>& a, const std::vector<__nv_bfloat16>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tw::bench;
  bool quick = false, split_sweep = false;
  std::vector<int> ms_arg;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--split-sweep")) split_sweep = true;
    else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) {
      try {
        ms_arg = parse_counts(argv[++i], "--ms");
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "bench_gemm: %s\n", e.what());
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--ms 1,16,...] [--split-sweep]\n", argv[0]);
      return 2;
    }
  }
  const Gpu gpu = current_gpu();
  if (!tw::gemm_sm90_supported()) {
    std::printf("bench_gemm: needs an sm_90 GPU, found %s: skipped\n", gpu.prop.name);
    return 0;
  }
  const Floor floor = measure_floor(gpu);
  cublasLtHandle_t lt;
  LT_CHECK(cublasLtCreate(&lt));
  void* lt_ws;
  TW_CUDA_CHECK(cudaMalloc(&lt_ws, size_t(64) << 20));

  // bf16 GEMM peak (TFLOP/s) on random data: cuBLASLt 8192^3, best heuristic algorithm.
  double peak_tflops = 0;
  {
    const int S = 8192;
    __nv_bfloat16 *x, *w, *y;
    TW_CUDA_CHECK(cudaMalloc(&x, size_t(S) * S * 2));
    TW_CUDA_CHECK(cudaMalloc(&w, size_t(S) * S * 2));
    TW_CUDA_CHECK(cudaMalloc(&y, size_t(S) * S * 2));
    fill_random<<<1024, 256>>>(x, size_t(S) * S, 1, 2.f);
    fill_random<<<1024, 256>>>(w, size_t(S) * S, 2, 2.f);
    LtGemm g(lt, lt_ws, S, S, S);
    const double us = time_us([&](int, cudaStream_t st) { g.run(y, x, w, st, 0); }, 1, 3, 15);
    peak_tflops = 2.0 * S * S * double(S) / us * 1e-6;
    TW_CUDA_CHECK(cudaFree(x));
    TW_CUDA_CHECK(cudaFree(w));
    TW_CUDA_CHECK(cudaFree(y));
  }
  std::printf("floor: bulk %.3f TB/s, vec %.3f TB/s; bf16 GEMM peak %.0f TFLOP/s\n", floor.bulk_tbps, floor.vec_tbps,
              peak_tflops);
  ResultFile out("gemm", gpu, floor);
  out.doc["gemm_peak_tflops"] = peak_tflops;
  out.doc["method"] =
      "us: one launch per CUDA-graph replay, median of 60 after 10 warm-up; seq_us: the sets' launches back to back in "
      "one graph, graph time / launches; weights+activations rotated over sets totalling >= 1 GB (L2 holds none); "
      "floor = max(bytes/read floor, flops/GEMM peak); cuBLASLt = best of <= 8 heuristic algos";

  struct Shape {
    const char* name;
    int N, K;
  };
  const std::vector<Shape> shapes = {{"8B gate_up", 28672, 4096},
                                     {"8B down", 4096, 14336},
                                     {"70B gate_up", 57344, 8192},
                                     {"70B down", 8192, 28672}};
  const std::vector<int> Ms = !ms_arg.empty() ? ms_arg : quick ? std::vector<int>{1, 64} : std::vector<int>{1, 4, 16, 64, 128, 256};
  std::vector<std::string> table;
  char line[256];
  for (const Shape& sh : shapes) {
    const size_t wbytes = size_t(sh.N) * sh.K * 2;
    const int sets = int(std::max<size_t>(2, (size_t(1) << 30) / wbytes + 1));
    std::vector<__nv_bfloat16*> W(sets), X(sets), Y(sets), Yr(sets);
    for (int s = 0; s < sets; ++s) {
      TW_CUDA_CHECK(cudaMalloc(&W[s], wbytes));
      TW_CUDA_CHECK(cudaMalloc(&X[s], size_t(256) * sh.K * 2));
      TW_CUDA_CHECK(cudaMalloc(&Y[s], size_t(256) * sh.N * 2));
      TW_CUDA_CHECK(cudaMalloc(&Yr[s], size_t(256) * sh.N * 2));
      fill_random<<<1024, 256>>>(W[s], size_t(sh.N) * sh.K, 100 + s, 0.1f);
      fill_random<<<1024, 256>>>(X[s], size_t(256) * sh.K, 200 + s, 2.f);
    }
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    for (int M : Ms) {
      const double bytes = double(wbytes) + 2.0 * M * sh.K + 2.0 * M * sh.N;
      const double flops = 2.0 * M * double(sh.N) * sh.K;
      const double floor_us = std::max(bytes / floor.tbps() * 1e-6, flops / peak_tflops * 1e-6);
      // cuBLASLt: time each heuristic algorithm briefly, keep the best.
      LtGemm g(lt, lt_ws, M, sh.N, sh.K);
      double lt_us = 1e30;
      int lt_algo = 0;
      for (int a = 0; a < int(g.algos.size()); ++a) {
        double us = time_us([&](int s, cudaStream_t st) { g.run(Yr[s], X[s], W[s], st, a); }, sets, 3, 20);
        if (us < lt_us) lt_us = us, lt_algo = a;
      }
      auto run_lt = [&](int s, cudaStream_t st) { g.run(Yr[s], X[s], W[s], st, lt_algo); };
      lt_us = time_us(run_lt, sets, 10, 60);
      const double lt_seq_us = time_us_seq(run_lt, sets);
      // Ours: the default and the knobs around it; "load only" (skip_mma) is a diagnostic, never
      // the reported time: the operand stream through the same ring with no wgmma and no epilogue.
      struct Variant {
        std::string name;
        tw::GemmOptions opt;
      };
      std::vector<Variant> vs;
      auto add = [&](const std::string& name, auto&& set) {
        tw::GemmOptions o;
        set(o);
        vs.push_back({name, o});
      };
      add("default", [](tw::GemmOptions&) {});
      if (M <= 64) add("k_atoms=2", [](tw::GemmOptions& o) { o.k_atoms = 2; });
      if (M <= 128) add("rows=256", [](tw::GemmOptions& o) { o.tile_rows = 256; });
      add("stages=4", [](tw::GemmOptions& o) { o.stages = 4; });
      add("partials_first", [](tw::GemmOptions& o) { o.partials_first = true; });
      if (M <= 128) add("rows=256,partials_first", [](tw::GemmOptions& o) { o.tile_rows = 256; o.partials_first = true; });
      add("promote_256", [](tw::GemmOptions& o) { o.weights_promote_256 = true; });
      // Each launch overlapping the one before (it changes only the back-to-back time).
      add("overlap", [](tw::GemmOptions& o) { o.overlap_previous = true; });
      add("no_epilogue", [](tw::GemmOptions& o) { o.skip_epilogue = true; });
      add("load_only", [](tw::GemmOptions& o) { o.skip_mma = true; });
      // 256-row tiles read the activations from L2 half as often: do the loads or the math differ?
      if (M <= 128) add("rows=256,no_epilogue", [](tw::GemmOptions& o) { o.tile_rows = 256; o.skip_epilogue = true; });
      if (M <= 128) add("rows=256,load_only", [](tw::GemmOptions& o) { o.tile_rows = 256; o.skip_mma = true; });
      double best_us = 1e30, default_us = 0, load_us = 0, best_seq_us = 1e30;
      std::string best_name, best_seq_name;
      nlohmann::json variants = nlohmann::json::array();
      for (const Variant& v : vs) {
        for (int s = 0; s < sets; ++s) tw::run_gemm(Y[s], X[s], W[s], M, sh.N, sh.K, nullptr, v.opt);  // warm, outside capture
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        auto run = [&](int s, cudaStream_t st) { tw::run_gemm(Y[s], X[s], W[s], M, sh.N, sh.K, st, v.opt); };
        const double us = time_us(run, sets, 10, v.name == "default" ? 60 : 30);
        variants.push_back({{"variant", v.name}, {"us", us}, {"pct_of_floor", 100.0 * floor_us / us}});
        if (v.name == "default" || v.opt.overlap_previous) {
          const double seq = time_us_seq(run, sets);
          variants.back()["seq_us"] = seq;
          if (seq < best_seq_us) best_seq_us = seq, best_seq_name = v.name;
        }
        if (v.name == "load_only") load_us = us;
        const bool diagnostic = v.opt.skip_mma || v.opt.skip_epilogue;
        if (diagnostic) continue;
        if (v.name == "default") default_us = us;
        if (us < best_us) best_us = us, best_name = v.name;
      }
      // The executor's tile body on a one-op graph (tw::DecodeGemm, the FFN's mainloop), on
      // PyTorch-layout and on packed weights (packed copies of the sets, made untimed).
      // "overlap": each launch starts on the SMs the one before leaves and streams its first
      // weights while that one finishes (programmatic dependent launch); it only changes seq_us.
      struct ExecVariant {
        bool packed;
        int split;  // 0 = its own
        bool overlap;
      };
      std::vector<ExecVariant> exec_variants{{false, 0, false}, {true, 0, false}, {true, 0, true}};
      if (split_sweep)
        for (int sp : {1, 2, 4, 8}) exec_variants.push_back({true, sp, false});
      for (auto [packed, split, overlap] : exec_variants) {
        tw::DecodeGemmOptions eo;
        eo.packed_weights = packed;
        eo.split_k = split;
        eo.overlap_previous = overlap;
        tw::DecodeGemm eg(M, sh.N, sh.K, eo);
        std::vector<__nv_bfloat16*> P;
        if (packed)
          for (int s = 0; s < sets; ++s) {
            __nv_bfloat16* p;
            TW_CUDA_CHECK(cudaMalloc(&p, eg.packed_size() * 2));
            eg.pack(W[s], p, 0);
            P.push_back(p);
          }
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        auto w_of = [&](int s) { return packed ? P[s] : W[s]; };
        auto run = [&](int s, cudaStream_t st) { eg.run(Y[s], X[s], w_of(s), st); };
        const double us = time_us(run, sets, 10, 60), seq = time_us_seq(run, sets);
        const std::string name = std::string(packed ? "executor,packed" : "executor") +
                                 (split ? ",split=" + std::to_string(split) : "") + (overlap ? ",overlap" : "");
        if (seq < best_seq_us) best_seq_us = seq, best_seq_name = name;
        eg.run(Y[0], X[0], w_of(0), nullptr);
        g.run(Yr[0], X[0], W[0], nullptr, lt_algo);
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<__nv_bfloat16> a(size_t(M) * sh.N), b(size_t(M) * sh.N);
        TW_CUDA_CHECK(cudaMemcpy(a.data(), Y[0], a.size() * 2, cudaMemcpyDeviceToHost));
        TW_CUDA_CHECK(cudaMemcpy(b.data(), Yr[0], b.size() * 2, cudaMemcpyDeviceToHost));
        variants.push_back({{"variant", name}, {"us", us}, {"seq_us", seq}, {"pct_of_floor", 100.0 * floor_us / us},
                            {"split_k", eg.graph().op(0).tiling.split_k},
                            {"rel_diff_vs_cublaslt", rel_diff(a, b)}});
        if (us < best_us) best_us = us, best_name = name;
        for (auto* p : P) TW_CUDA_CHECK(cudaFree(p));
      }
      // The checked output is the default's (the last non-diagnostic run on set 0 is re-done).
      tw::run_gemm(Y[0], X[0], W[0], M, sh.N, sh.K, nullptr, {});
      // Sanity: ours vs cuBLASLt on set 0 (same inputs).
      g.run(Yr[0], X[0], W[0], nullptr, lt_algo);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<__nv_bfloat16> a(size_t(M) * sh.N), b(size_t(M) * sh.N);
      TW_CUDA_CHECK(cudaMemcpy(a.data(), Y[0], a.size() * 2, cudaMemcpyDeviceToHost));
      TW_CUDA_CHECK(cudaMemcpy(b.data(), Yr[0], b.size() * 2, cudaMemcpyDeviceToHost));
      const double diff = rel_diff(a, b);
      out.add({{"shape", sh.name}, {"M", M}, {"N", sh.N}, {"K", sh.K}, {"bytes", bytes}, {"floor_us", floor_us},
               {"us", default_us}, {"tbps", bytes / default_us * 1e-6}, {"pct_of_floor", 100.0 * floor_us / default_us},
               {"best_variant", best_name}, {"best_us", best_us}, {"load_only_us", load_us}, {"variants", variants},
               {"cublaslt_us", lt_us}, {"cublaslt_algo_rank", lt_algo},
               {"cublaslt_pct_of_floor", 100.0 * floor_us / lt_us}, {"speedup_vs_cublaslt", lt_us / default_us},
               {"best_speedup_vs_cublaslt", lt_us / best_us}, {"rel_diff_vs_cublaslt", diff},
               {"cublaslt_seq_us", lt_seq_us}, {"best_seq_us", best_seq_us}, {"best_seq_variant", best_seq_name},
               {"best_seq_pct_of_floor", 100.0 * floor_us / best_seq_us}, {"best_seq_speedup_vs_cublaslt", lt_seq_us / best_seq_us}});
      std::snprintf(line, sizeof line,
                    "%-12s %4d %7.1f %7.1f %5.2f %5.1f%% %7.1f %5.1f%% %5.2fx | %7.1f %5.2fx %-16s | seq %6.1f %6.1f %5.2fx %-16s "
                    "| load %6.1f %5.1f%% d=%.0e",
                    sh.name, M, floor_us, default_us, bytes / default_us * 1e-6, 100.0 * floor_us / default_us, lt_us,
                    100.0 * floor_us / lt_us, lt_us / default_us, best_us, lt_us / best_us, best_name.c_str(), lt_seq_us,
                    best_seq_us, lt_seq_us / best_seq_us, best_seq_name.c_str(), load_us, 100.0 * floor_us / load_us, diff);
      std::printf("%s\n", line);
      std::fflush(stdout);
      table.push_back(line);
    }
    for (int s = 0; s < sets; ++s) {
      cudaFree(W[s]);
      cudaFree(X[s]);
      cudaFree(Y[s]);
      cudaFree(Yr[s]);
    }
  }
  const std::string path = out.write(gpu);
  std::printf("\n%s (%s): floor %.3f TB/s, GEMM peak %.0f TFLOP/s -> %s\n", gpu.prop.name, utc_now().c_str(),
              floor.tbps(), peak_tflops, path.c_str());
  std::printf("%-12s %4s %7s %7s %5s %6s %7s %6s %6s | %7s %6s %-16s | seq: %6s %6s %6s %-16s | %s\n", "shape", "M", "floor",
              "ours", "TB/s", "%floor", "cublas", "%floor", "vs_cub", "best", "vs_cub", "best variant", "cublas", "best",
              "vs_cub", "best variant", "load-only (diagnostic)");
  for (auto& l : table) std::printf("%s\n", l.c_str());
  cublasLtDestroy(lt);
  cudaFree(lt_ws);
  return 0;
}
