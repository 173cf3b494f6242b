// The attention half of a DiT block in one launch (issue 20 item 4): tw::DitAttentionChain against
// the same chain's parts run apart in the same run -- cuBLASLt's QKV and output GEMMs and this
// project's prefill attention (the per-head norm and RoPE between them not counted: the parts'
// sum is a lower bound on any unfused form built from them) -- with the bf16 GEMM peak and the read
// floor. bench/dit_chain_torch.py times PyTorch eager and torch.compile on the same cases and merges
// them in (speedup_vs_compile, the issue's bar).
//   bench_dit_chain [--cases H:L,...] [--reps N] [--out DIR] [--trace]
//     --trace: after the timed runs, one traced launch per case; each op's tiles, span, mean tile time
//     and mean wait for producers (the JSON row gets them as "timeline")
//     rows op "dit_attention_chain" (d = 128) merged into DIR/dit_attention.json (DIR:
//     $TW_RESULTS_DIR/<gpu> or bench/results/<gpu>), beside bench_dit_attention's rows.
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cublas_baseline.cuh"
#include "harness.cuh"
#include "step_bench.cuh"
#include "tileweave/ops/dit_attention_chain.hpp"
#include "tileweave/ops/prefill_attention.hpp"

namespace {

using bf16 = __nv_bfloat16;
using json = nlohmann::ordered_json;

struct Case {
  int H;
  int L;
};
// Qwen-Image's width (24 x 128) at an image's token counts, and a smaller model's.
const std::vector<Case> kDefaultCases = {{24, 4608}, {24, 8704}, {24, 1024}, {24, 4097}, {16, 8192}};

__global__ void fill_rope(float* t, int64_t L, int D) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= L * (D / 2)) return;
  const int64_t tok = i / (D / 2);
  const int j = int(i % (D / 2));
  const float ang = float(tok % 97) * powf(10000.f, -float(j) / (D / 2));
  t[tok * D + j] = cosf(ang);
  t[tok * D + D / 2 + j] = sinf(ang);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tw::bench;
  int reps = 20;
  bool trace = false;
  std::string out_dir, cases_arg;
  std::vector<int> lags;  // --lags: the chain again with other order lags (DitChainOptions::order_lag)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cases" && i + 1 < argc) cases_arg = argv[++i];
    else if (a == "--reps" && i + 1 < argc) reps = parse_counts(argv[++i], "--reps")[0];
    else if (a == "--out" && i + 1 < argc) out_dir = argv[++i];
    else if (a == "--trace") trace = true;
    else if (a == "--lags" && i + 1 < argc) lags = parse_counts(argv[++i], "--lags");
    else {
      std::fprintf(stderr, "usage: bench_dit_chain [--cases H:L,...] [--reps N] [--out DIR] [--trace] [--lags N,...]\n");
      return 2;
    }
  }
  std::vector<Case> cases = kDefaultCases;
  if (!cases_arg.empty()) {
    cases.clear();
    for (const std::string& s : split_list(cases_arg)) {
      const auto f = split_list(s, ':');
      const auto v = f.size() == 2 ? parse_counts(f[0] + "," + f[1], "--cases") : std::vector<int>{};
      if (v.size() != 2) {
        std::fprintf(stderr, "--cases: '%s' is not H:L\n", s.c_str());
        return 2;
      }
      cases.push_back({v[0], v[1]});
    }
  }
  const Gpu gpu = current_gpu();
  if (out_dir.empty()) {
    const char* dir = std::getenv("TW_RESULTS_DIR");
    out_dir = (std::filesystem::path(dir ? dir : "bench/results") / gpu.slug).string();
  }
  cublasLtHandle_t lt;
  cublas_check(cublasLtCreate(&lt), "cublasLtCreate");
  void* ws;
  const size_t ws_bytes = size_t(32) << 20;
  TW_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  constexpr int D = 128;
  auto steady = [&](const std::function<void(int, cudaStream_t)>& make) {
    return time_us(make, 1, steady_warmup(time_us(make, 1, 1, 3)), reps);
  };
  std::vector<json> rows;
  std::printf("%-4s %-6s %10s %8s %12s %12s %12s %10s\n", "H", "L", "chain_us", "TFLOP/s", "qkv_gemm_us", "attention_us",
              "o_gemm_us", "vs parts");
  for (const Case& c : cases) {
    const int64_t L = c.L, W = int64_t(c.H) * D;
    tw::DitAttentionShape s;
    s.tokens = L;
    s.heads = c.H;
    tw::DitAttentionChain chain(s);
    bf16 *x, *wq, *wo, *y, *qkv, *q, *k, *v, *att, *qn, *kn;
    float* rope;
    for (auto [p, n] : {std::pair<bf16**, int64_t>{&x, L * W}, {&wq, 3 * W * W}, {&wo, W * W}, {&y, L * W}, {&qkv, L * 3 * W},
                        {&q, L * W}, {&k, L * W}, {&v, L * W}, {&att, L * W}, {&qn, D}, {&kn, D}})
      TW_CUDA_CHECK(cudaMalloc(p, size_t(n) * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&rope, size_t(L) * D * sizeof(float)));
    fill_noise_bf16(x, size_t(L * W), 1);
    fill_noise_bf16(wq, size_t(3 * W * W), 2, 0.02f);
    fill_noise_bf16(wo, size_t(W * W), 3, 0.02f);
    fill_noise_bf16(q, size_t(L * W), 4);
    fill_noise_bf16(k, size_t(L * W), 5);
    fill_noise_bf16(v, size_t(L * W), 6);
    fill_noise_bf16(qn, D, 7);
    fill_noise_bf16(kn, D, 8);
    fill_rope<<<int((L * D / 2 + 255) / 256), 256>>>(rope, L, D);
    TW_CUDA_CHECK_LAUNCH();
    tw::DitChainTensors t;
    t.x = x, t.w_qkv = wq, t.q_norm = qn, t.k_norm = kn, t.rope = rope, t.w_o = wo, t.y = y;
    const double us = steady([&](int, cudaStream_t st) { chain.run(t, st); });
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    if (chain.error()) throw std::runtime_error("dit chain: a wait expired");
    // The parts, each timed alone: cuBLASLt GEMMs and this project's attention on q, k, v [L, H, D].
    const LtGemm g_qkv(lt, L, 3 * W, W, ws, ws_bytes), g_o(lt, L, W, W, ws, ws_bytes);
    tw::PrefillAttentionShape as;
    as.num_q_heads = as.num_kv_heads = c.H;
    const tw::PrefillAttention attn(as, {0, int(L)});
    const double qkv_us = steady([&](int, cudaStream_t st) { g_qkv.run(x, wq, qkv, st); });
    const double att_us = steady([&](int, cudaStream_t st) { attn.run({q, k, v, att, nullptr}, st); });
    const double o_us = steady([&](int, cudaStream_t st) { g_o.run(att, wo, y, st); });
    const double parts = qkv_us + att_us + o_us;
    json row = {{"op", "dit_attention_chain"}, {"dtype", "bf16"}, {"H", c.H}, {"d", D}, {"L", c.L}, {"causal", false},
                {"batch", 1}, {"us", us}, {"flops", chain.flops()}, {"tflops", chain.flops() / us * 1e-6},
                {"qkv_gemm_us", qkv_us}, {"attention_us", att_us}, {"o_proj_gemm_us", o_us}, {"parts_us", parts},
                {"speedup_vs_parts", parts / us}};
    std::printf("%-4d %-6d %10.1f %8.0f %12.1f %12.1f %12.1f %9.3fx\n", c.H, c.L, us, chain.flops() / us * 1e-6, qkv_us,
                att_us, o_us, parts / us);
    row["order_lag"] = gpu.prop.multiProcessorCount;
    for (int lag : lags) {
      tw::DitChainOptions o;
      o.order_lag = lag;
      const tw::DitAttentionChain alt(s, o);
      const double lag_us = steady([&](int, cudaStream_t st) { alt.run(t, st); });
      row["lag_us"][std::to_string(lag)] = lag_us;
      std::printf("     order lag %d tickets: %.1f us (%+.1f%% vs the default's)\n", lag, lag_us, 100 * (lag_us / us - 1));
    }
    if (trace) {
      chain.enable_trace();
      chain.run(t, nullptr);
      row["timeline"] = op_timeline(chain.plan(), chain.graph().graph)["ops"];
    }
    rows.push_back(std::move(row));
    for (void* p : {(void*)x, (void*)wq, (void*)wo, (void*)y, (void*)qkv, (void*)q, (void*)k, (void*)v, (void*)att,
                    (void*)qn, (void*)kn, (void*)rope})
      TW_CUDA_CHECK(cudaFree(p));
  }
  TW_CUDA_CHECK(cudaFree(ws));
  cublasLtDestroy(lt);
  const double peak = gemm_peak_tflops(), floor_tbps = measure_floor(gpu).tbps();
  std::printf("%s: bf16 GEMM peak (cuBLASLt 8192^3) %.0f TFLOP/s, read floor %.3f TB/s\n", gpu.prop.name, peak, floor_tbps);
  // Merge into dit_attention.json: this op's cases replaced, every other row kept.
  std::filesystem::create_directories(out_dir);
  const std::filesystem::path path = std::filesystem::path(out_dir) / "dit_attention.json";
  json doc = read_result_doc(path);
  doc["chain_gpu"] = gpu.prop.name;
  doc["chain_date"] = utc_now();
  doc["chain_gemm_peak_tflops"] = peak;
  doc["chain_floor_read_tbps"] = floor_tbps;
  doc["chain_method"] =
      "op dit_attention_chain: tw::DitAttentionChain (QKV projection with per-head RMSNorm + RoPE in its epilogue -> "
      "attention -> output projection, one launch), x and q/k/v noise of unit variance, weights 0.02, no biases; "
      "parts_us = cuBLASLt QKV GEMM + tw::PrefillAttention + cuBLASLt output GEMM, each timed alone (norm and RoPE "
      "not counted); each form after " + std::to_string(int(kSteadyMs)) + " ms of warm-up replays, median of " +
      std::to_string(reps) + " graph replays; chain_gemm_peak_tflops (cuBLASLt 8192^3) in the same run. "
      "torch_eager_us / torch_compile_us: bench/dit_chain_torch.py --merge";
  for (json& r : rows) {
    json* hit = nullptr;
    for (json& e : doc["cases"])
      if (e.value("op", std::string()) == "dit_attention_chain" && e.value("H", 0) == r["H"] && e.value("L", 0) == r["L"])
        hit = &e;
    if (!hit) {
      doc["cases"].push_back(json::object());
      hit = &doc["cases"].back();
    }
    for (const char* stale : {"speedup_vs_compile", "speedup_vs_eager"}) hit->erase(stale);
    hit->update(r);
    if (hit->contains("torch_compile_us"))
      (*hit)["speedup_vs_compile"] = (*hit)["torch_compile_us"].get<double>() / r["us"].get<double>();
  }
  std::ofstream(path) << doc.dump(2) << "\n";
  std::printf("-> %s\n", path.string().c_str());
  return 0;
}
