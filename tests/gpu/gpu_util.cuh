// Helpers shared by the GPU tests: skip cleanly with no GPU, fresh random bf16 data, poisoned
// outputs, and the relative error against a double-precision reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "tileweave/util/cuda_check.hpp"

namespace tw::test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Skips (never passes) a GPU test on a machine with no GPU.
#define TW_REQUIRE_GPU()                                                                         \
  do {                                                                                           \
    if (!::tw::test::have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine: GPU test skipped"; \
  } while (0)

// Compute capability 9.0 exactly (sm_90a: wgmma, setmaxnreg), not merely a GPU.
inline bool have_sm90a() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}
// Skips a test of an sm_90a-only op (`what`) elsewhere.
#define TW_REQUIRE_SM90A(what)                                                                            \
  do {                                                                                                    \
    TW_REQUIRE_GPU();                                                                                     \
    if (!::tw::test::have_sm90a()) GTEST_SKIP() << what << " is sm_90a only: not a compute capability 9.0 GPU"; \
  } while (0)

// A fresh seed per call (from the test's random device) unless TW_TEST_SEED pins one.
inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("TW_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}() * 0x9E3779B97F4A7C15ull + std::random_device{}();
}

// The seed of a randomized shape grid: TW_SHAPE_SEED, else 16 -- the same grid every run by default,
// any other seed a grid no test names.
inline uint64_t shape_seed() {
  if (const char* v = std::getenv("TW_SHAPE_SEED")) return std::strtoull(v, nullptr, 10);
  return 16;
}

// Host copy of a bf16 tensor: the rounded values, as float, for the reference.
struct HostBf16 {
  std::vector<__nv_bfloat16> bits;
  std::vector<float> val;
};

inline HostBf16 random_bf16(size_t n, std::mt19937_64& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.f, scale);
  HostBf16 h;
  h.bits.resize(n);
  h.val.resize(n);
  for (size_t i = 0; i < n; ++i) {
    h.bits[i] = __float2bfloat16(d(rng));
    h.val[i] = __bfloat162float(h.bits[i]);
  }
  return h;
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { TW_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(count, 1) * sizeof(T))); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  void upload(const std::vector<T>& h) { TW_CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    TW_CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // 0xFF bytes: NaN in bf16, fp16 and fp32, so an element nobody wrote fails the check.
  void poison() { TW_CUDA_CHECK(cudaMemset(ptr, 0xFF, n * sizeof(T))); }
};

// out[r, c] = sum_j a[r, j] * w[c, j] in double: the reference for Linear layers (w [n, k] as in
// PyTorch), a naive kernel independent of the code under test. TA: __nv_bfloat16 or double.
// Runs enqueue(st) captured in a CUDA graph, launched once and waited for (launch order and
// dependencies as a decode step's graph would have them).
template <class F>
void run_in_graph(cudaStream_t st, F&& enqueue) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  TW_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  enqueue(st);
  TW_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  TW_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  TW_CUDA_CHECK(cudaGraphLaunch(e, st));
  TW_CUDA_CHECK(cudaStreamSynchronize(st));
  TW_CUDA_CHECK(cudaGraphExecDestroy(e));
  TW_CUDA_CHECK(cudaGraphDestroy(g));
}

template <class TA>
__global__ void ref_linear_bf16w(const TA* a, const __nv_bfloat16* w, double* out, int64_t m, int64_t n, int64_t k) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= m * n) return;
  const int64_t r = i / n, c = i % n;
  double s = 0;
  for (int64_t j = 0; j < k; ++j) {
    double av;
    if constexpr (std::is_same_v<TA, __nv_bfloat16>) av = double(__bfloat162float(a[r * k + j])); else av = a[r * k + j];
    s += av * double(__bfloat162float(w[c * k + j]));
  }
  out[i] = s;
}

// ||out - ref|| / ||ref||; any non-finite output makes it infinite.
inline double rel_error(const std::vector<__nv_bfloat16>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double o = __bfloat162float(out[i]);
    if (!std::isfinite(o)) return INFINITY;
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ||a - b|| / ||b|| over n floats (b the reference); infinite if `a` holds a non-finite value.
inline double rel_error(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace tw::test
