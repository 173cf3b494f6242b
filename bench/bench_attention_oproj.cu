// Attention -> o_proj: the one-launch executor (AttentionOproj) against our attention launch
// followed by a cuBLASLt o_proj GEMM (two kernels captured in one CUDA graph), on Llama-3-8B
// shapes (32 query heads, 8 KV heads, d = 128, hidden 4096; RoPE + append), B in {1, 16, 64} x
// L in {4096, 32768}. K/V and Wo sets are rotated (>= 512 MB in rotation where memory allows) so
// L2 holds none of what a replay reads; the floor is measured in the same run. Every variant's
// output is checked against the two-kernel baseline.
//   bench_attention_oproj [--quick]
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cublas_baseline.cuh"
#include "harness.cuh"
#include "tileweave/ops/attention_oproj.hpp"

namespace {

using bf16 = __nv_bfloat16;

__global__ void empty_kernel() {}

constexpr int kHq = 32, kHkv = 8, kD = 128;
constexpr int64_t kHidden = 4096, kQd = int64_t(kHq) * kD;

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const auto gpu = tw::bench::current_gpu();
  const auto floor = tw::bench::measure_floor(gpu);
  std::printf("%s: floor %.3f TB/s (bulk %.3f, 16-byte loads %.3f)\n", gpu.prop.name, floor.tbps(), floor.bulk_tbps,
              floor.vec_tbps);
  tw::bench::ResultFile result("bench_attention_oproj", gpu, floor);
  const double empty_us = tw::bench::time_us([](int, cudaStream_t st) { empty_kernel<<<264, 128, 0, st>>>(); }, 1);
  result.doc["empty_launch_us"] = empty_us;
  result.doc["shape"] = {{"num_q_heads", kHq}, {"num_kv_heads", kHkv}, {"head_dim", kD}, {"hidden", kHidden},
                         {"dtype", "bf16"},    {"rope", true},        {"append", true}, {"residual", false}};
  std::printf("empty kernel, graph replay: %.2f us\n", empty_us);

  cublasLtHandle_t lt;
  tw::bench::cublas_check(cublasLtCreate(&lt), "cublasLtCreate");
  const size_t lt_ws_bytes = size_t(32) << 20;
  void* lt_ws;
  TW_CUDA_CHECK(cudaMalloc(&lt_ws, lt_ws_bytes));

  struct Case {
    int batch, len;
  };
  std::vector<Case> cases;
  for (int b : {1, 16, 64})
    for (int l : {4096, 32768}) cases.push_back({b, l});
  if (quick) cases = {{1, 4096}, {16, 32768}};

  std::printf("%4s %6s %4s %9s %9s %10s %9s %8s %9s %7s  %s\n", "B", "L", "sets", "attn_us", "gemm_us", "2kernel_us",
              "fused_us", "speedup", "floor_us", "floor%", "variants (us)");
  for (const Case& c : cases) {
    const int batch = c.batch, len = c.len;
    const int64_t kv_elems = int64_t(batch) * kHkv * len * kD;  // per K (or V) and set
    const int64_t w_elems = kHidden * kQd;
    const int64_t kv_bytes = 2 * kv_elems * 2, w_bytes = w_elems * 2;
    const int sets = int(std::clamp<int64_t>((int64_t(512) << 20) / (kv_bytes + w_bytes) + 1, 1, 64));
    size_t free_bytes = 0, total_bytes = 0;
    TW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (int64_t(sets) * (kv_bytes + w_bytes) + (int64_t(2) << 30) > int64_t(free_bytes)) {
      std::printf("%4d %6d skipped: does not fit\n", batch, len);
      continue;
    }
    bf16 *kv, *w, *q, *kv_new, *o, *y_ref, *y;
    TW_CUDA_CHECK(cudaMalloc(&kv, size_t(sets) * 2 * kv_elems * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&w, size_t(sets) * w_elems * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&q, size_t(batch) * kQd * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&kv_new, size_t(batch) * kHkv * kD * 2 * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&o, size_t(batch) * kQd * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&y_ref, size_t(batch) * kHidden * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&y, size_t(batch) * kHidden * sizeof(bf16)));
    tw::bench::fill_noise_bf16(kv, size_t(sets) * 2 * kv_elems, 1);
    tw::bench::fill_noise_bf16(w, size_t(sets) * w_elems, 2, 1.f / 64.f);  // 1/sqrt(K): y of unit scale
    tw::bench::fill_noise_bf16(q, size_t(batch) * kQd, 3);
    tw::bench::fill_noise_bf16(kv_new, size_t(batch) * kHkv * kD * 2, 4);
    TW_CUDA_CHECK(cudaDeviceSynchronize());

    tw::DecodeAttentionShape shape;
    shape.batch = batch;
    shape.num_q_heads = kHq;
    shape.num_kv_heads = kHkv;
    shape.head_dim = kD;
    shape.max_seq_len = len;
    const std::vector<int> lens(batch, len);
    const bf16* v_new = kv_new + size_t(batch) * kHkv * kD;
    auto k_of = [&](int s) { return kv + size_t(s) * 2 * kv_elems; };
    auto w_of = [&](int s) { return w + size_t(s) * w_elems; };

    // The baseline: our attention launch (its own planner: the standalone defaults), then cuBLASLt.
    const tw::DecodeAttention attn(shape, lens);
    const tw::bench::LtGemm gemm(lt, batch, kHidden, kQd, lt_ws, lt_ws_bytes);
    auto run_attn = [&](int s, cudaStream_t st) { attn.run({q, kv_new, v_new, k_of(s), k_of(s) + kv_elems, o}, st); };
    auto run_gemm = [&](int s, cudaStream_t st) { gemm.run(o, w_of(s), y_ref, st); };
    const int reps = kv_bytes > (int64_t(4) << 30) ? 30 : 100;
    auto time = [&](const std::function<void(int, cudaStream_t)>& f) { return tw::bench::time_us(f, sets, 10, reps); };
    const double attn_us = time(run_attn), gemm_us = time(run_gemm);
    const double two_us = time([&](int s, cudaStream_t st) {
      run_attn(s, st);
      run_gemm(s, st);
    });
    run_attn(0, nullptr);
    run_gemm(0, nullptr);
    TW_CUDA_CHECK(cudaDeviceSynchronize());

    // The fused op: default options, then a few variants on the same data.
    auto time_fused = [&](const tw::AttentionOproj& op, double* err) {
      auto launch = [&](int s, cudaStream_t st) {
        op.run({q, kv_new, v_new, k_of(s), k_of(s) + kv_elems, w_of(s), nullptr, y}, st);
      };
      TW_CUDA_CHECK(cudaMemset(y, 0xFF, size_t(batch) * kHidden * sizeof(bf16)));
      launch(0, nullptr);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      *err = std::max(*err, tw::bench::rel_diff_bf16(y, y_ref, size_t(batch) * kHidden));
      return time(launch);
    };
    double err = 0;
    const tw::AttentionOproj fused(shape, kHidden, lens);
    const double fused_us = time_fused(fused, &err);
    const auto& G = fused.graph().graph;
    const tw::Op& op_o = G.op(fused.graph().op_oproj);
    nlohmann::json variants = nlohmann::json::object();
    auto variant = [&](const std::string& name, tw::AttentionOprojOptions opt, tw::DecodeAttentionShape sh) {
      const tw::AttentionOproj v(sh, kHidden, lens, {}, opt);
      const tw::Op& vo = v.graph().graph.op(v.graph().op_oproj);
      const bool same = v.blocks_per_sm() == fused.blocks_per_sm() && vo.tiling.split_k == op_o.tiling.split_k &&
                        v.attention().num_tiles() == fused.attention().num_tiles();
      variants[name] = same ? fused_us : time_fused(v, &err);
    };
    if (!quick) {
      for (int split : {1, 2, 4, 8, 16}) {
        tw::AttentionOprojOptions opt;
        opt.split_k = split;
        variant("split" + std::to_string(split), opt, shape);
      }
      tw::AttentionOprojOptions one;
      one.blocks_per_sm = 1;
      variant("blocks1", one, shape);
      // Attention planned for one tile per SM (tiles cut at pairs): the second block of each SM
      // starts on o_proj tiles at once (their first weight stages out, then waiting).
      tw::DecodeAttentionShape attn1 = shape;
      attn1.tiles_per_sm = 1;
      variant("attn_tiles_per_sm1", {}, attn1);
      // Two tiles per SM, each pair cut into the same whole number of tiles (fewer merges).
      const int npairs = batch * kHkv, slots = 2 * gpu.prop.multiProcessorCount;
      if (npairs <= slots) {
        tw::DecodeAttentionShape aligned = shape;
        aligned.num_tiles = npairs * (slots / npairs);
        variant("attn_pair_aligned", {}, aligned);
      }
    }

    const double floor_us = double(kv_bytes + w_bytes) / (floor.tbps() * 1e6);
    std::printf("%4d %6d %4d %9.2f %9.2f %10.2f %9.2f %7.3fx %9.2f %6.1f%%  %s\n", batch, len, sets, attn_us, gemm_us,
                two_us, fused_us, two_us / fused_us, floor_us, 100.0 * floor_us / fused_us, variants.dump().c_str());
    std::fflush(stdout);
    result.add({{"B", batch},
                {"L", len},
                {"sets", sets},
                {"kv_bytes", kv_bytes},
                {"wo_bytes", w_bytes},
                {"attention_us", attn_us},
                {"cublaslt_oproj_us", gemm_us},
                {"attention_plus_cublaslt_us", two_us},
                {"fused_us", fused_us},
                {"speedup_vs_two_kernels", two_us / fused_us},
                {"floor_us", floor_us},
                {"pct_floor", 100.0 * floor_us / fused_us},
                {"variants_us", variants},
                {"max_rel_diff_vs_two_kernels", err},
                {"attention_tiles", fused.attention().num_tiles()},
                {"attention_tiles_standalone", attn.num_tiles()},
                {"oproj_tiles", op_o.num_tiles},
                {"oproj_split_k", op_o.tiling.split_k},
                {"grid", fused.grid()},
                {"smem_bytes", fused.smem_bytes()}});
    if (!(err < 2e-2)) std::printf("  WARNING: fused output differs from the two-kernel baseline: %.3g\n", err);
    for (bf16* p : {kv, w, q, kv_new, o, y_ref, y}) TW_CUDA_CHECK(cudaFree(p));
  }
  TW_CUDA_CHECK(cudaFree(lt_ws));
  cublasLtDestroy(lt);
  std::printf("wrote %s\n", result.write(gpu).c_str());
  return 0;
}
