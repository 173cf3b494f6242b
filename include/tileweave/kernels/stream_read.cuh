// The memory floor: kernels that only stream-read a buffer. Every "% of floor" in tileweave is
// bytes / (the best of these, measured in the same run). DESIGN.md §3: on the H200 the bulk-copy
// form reads 4.68 TB/s, the 16-byte-load form 4.65; a library reduction (4.0) is no floor.
#pragma once

#include <cuda/ptx>
#include <cstdint>

namespace tw::kernels {

constexpr int kStreamStages = 4;
constexpr int kStreamChunk = 16384;

// One thread per block keeps kStreamStages bulk copies of kStreamChunk bytes in flight into shared
// memory, completed on mbarriers; grid = SM count. Chunks are dealt round-robin across blocks so
// that concurrently read addresses stay close (DRAM page locality).
__global__ void stream_read_bulk(const char* src, uint64_t nchunks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bar[kStreamStages];
  if (threadIdx.x != 0) return;
  namespace ptx = cuda::ptx;
  for (int s = 0; s < kStreamStages; ++s) ptx::mbarrier_init(&bar[s], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  auto issue = [&](int s, uint64_t c) {
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bar[s], kStreamChunk);
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + s * kStreamChunk, src + c * kStreamChunk,
                       kStreamChunk, &bar[s]);
  };
  for (int s = 0; s < kStreamStages; ++s) {
    const uint64_t c = blockIdx.x + uint64_t(s) * gridDim.x;
    if (c < nchunks) issue(s, c);
  }
  for (uint64_t it = 0;; ++it) {
    const uint64_t c = blockIdx.x + it * gridDim.x;
    if (c >= nchunks) break;
    const int s = it % kStreamStages;
    while (!ptx::mbarrier_try_wait_parity(&bar[s], uint32_t((it / kStreamStages) & 1))) {
    }
    const uint64_t next = c + uint64_t(kStreamStages) * gridDim.x;
    if (next < nchunks) issue(s, next);
  }
#endif
}

// 16-byte loads, 8 in flight per thread; launch >= 2 blocks of 512 threads per SM.
__global__ void stream_read_vec(const int4* src, uint64_t n16, int* sink) {
  int acc = 0;
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n16; i += 8 * stride) {
    int4 v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldcs(src + i + j * stride);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  for (; i < n16; i += stride) {
    int4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fffffff) *sink = acc;  // keeps the loads alive; practically never taken
}

}  // namespace tw::kernels
