// The library baseline: bf16 GEMMs through cuBLASLt (heuristic's first choice, 32 MiB workspace,
// as PyTorch configures it) and the elementwise SiLU*mul that an unfused FFN runs between them.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "harness.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw::bench {

inline void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + " failed: cublas status " + std::to_string(int(s)));
}

// Y[M, N] = X[M, K] . W[N, K]^T, all row-major bf16 (column-major: Y^T = W^T(op T) . X^T).
class LtGemm {
 public:
  LtGemm(cublasLtHandle_t h, int64_t m, int64_t n, int64_t k, void* workspace, size_t ws_bytes)
      : h_(h), ws_(workspace), ws_bytes_(ws_bytes) {
    cublas_check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
    cublas_check(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
    cublas_check(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, k, n, k), "layout A");
    cublas_check(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, k, m, k), "layout B");
    cublas_check(cublasLtMatrixLayoutCreate(&c_, CUDA_R_16BF, n, m, n), "layout C");
    cublasLtMatmulPreference_t pref;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes_,
                                                      sizeof ws_bytes_), "pref workspace");
    int found = 0;
    cublas_check(cublasLtMatmulAlgoGetHeuristic(h_, desc_, a_, b_, c_, c_, pref, 1, &algo_, &found), "heuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (!found) throw std::runtime_error("cuBLASLt found no algorithm for " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(a_);
    cublasLtMatrixLayoutDestroy(b_);
    cublasLtMatrixLayoutDestroy(c_);
    cublasLtMatmulDescDestroy(desc_);
  }
  LtGemm(const LtGemm&) = delete;
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y, cudaStream_t st) const {
    const float alpha = 1.f, beta = 0.f;
    cublas_check(cublasLtMatmul(h_, desc_, &alpha, w, a_, x, b_, &beta, y, c_, y, c_, &algo_.algo, ws_, ws_bytes_, st),
                 "cublasLtMatmul");
  }

 private:
  cublasLtHandle_t h_;
  void* ws_;
  size_t ws_bytes_;
  cublasLtMatmulDesc_t desc_{};
  cublasLtMatrixLayout_t a_{}, b_{}, c_{};
  cublasLtMatmulHeuristicResult_t algo_{};
};

// h[M, F] = silu(gu[:, :F]) * gu[:, F:], bf16x2 per thread.
__global__ void silu_mul_kernel(const __nv_bfloat16* gu, __nv_bfloat16* h, int64_t m, int64_t f) {
  const int64_t i = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) * 2;
  if (i >= m * f) return;
  const int64_t r = i / f, c = i % f;
  const float2 g = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gu + r * 2 * f + c));
  const float2 u = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(gu + r * 2 * f + f + c));
  *reinterpret_cast<__nv_bfloat162*>(h + i) =
      __floats2bfloat162_rn(g.x / (1.f + __expf(-g.x)) * u.x, g.y / (1.f + __expf(-g.y)) * u.y);
}

// Tensor-core-bound kernels run the GPU at its power limit, and its clocks settle over a fraction
// of a second: the same attention case measured right after the GEMM peak ran 15-20% slower than
// later in the run (H200, 2026-11-24). Every contender (here, and the peers in
// dit_attention_torch.py) is therefore warmed for kSteadyMs of its own replays before it is
// timed: all are measured in the steady state a DiT's long run of denoising steps sees.
constexpr double kSteadyMs = 300;
inline int steady_warmup(double us_per_run) { return std::max(5, int(kSteadyMs * 1e3 / std::max(us_per_run, 1.0))); }

// bf16 GEMM peak (TFLOP/s): cuBLASLt's first heuristic choice on 8192^3, as bench_gemm measures it.
inline double gemm_peak_tflops() {
  constexpr int S = 8192;
  const size_t n = size_t(S) * S;
  __nv_bfloat16 *x, *w, *y;
  void* ws;
  const size_t ws_bytes = size_t(32) << 20;
  TW_CUDA_CHECK(cudaMalloc(&x, n * sizeof(__nv_bfloat16)));
  TW_CUDA_CHECK(cudaMalloc(&w, n * sizeof(__nv_bfloat16)));
  TW_CUDA_CHECK(cudaMalloc(&y, n * sizeof(__nv_bfloat16)));
  TW_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  fill_noise_bf16(x, n, 11);
  fill_noise_bf16(w, n, 12);
  cublasLtHandle_t lt;
  cublas_check(cublasLtCreate(&lt), "cublasLtCreate");
  double us;
  {
    const LtGemm g(lt, S, S, S, ws, ws_bytes);
    const auto make = [&](int, cudaStream_t st) { g.run(x, w, y, st); };
    us = time_us(make, 1, steady_warmup(time_us(make, 1, 2, 3)), 30);
  }
  cublasLtDestroy(lt);
  for (void* p : {(void*)x, (void*)w, (void*)y, ws}) TW_CUDA_CHECK(cudaFree(p));
  return 2.0 * S * S * double(S) / us * 1e-6;
}

}  // namespace tw::bench
