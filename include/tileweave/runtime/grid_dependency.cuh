// Programmatic dependent launch, device side. A launch made with the programmatic-serialization
// attribute may start while the kernel before it in the stream still runs: once every block of
// that kernel has called allow_next_launch() or exited, its blocks take the SMs that kernel's
// blocks leave. Until grid_dependency_wait() returns, such a launch may only read what the kernel
// before does not write (each op says what: weights, K/V cache rows) and must write nothing;
// after it, that kernel has finished and its writes are visible. Both are no-ops in a launch made
// without the attribute, and below sm_90.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "tileweave/util/cuda_check.hpp"

namespace tw::runtime {

__device__ __forceinline__ void allow_next_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Host: kernel<<<grid, block, smem, stream>>>(args...), launched to overlap the kernel before it
// (programmatic stream serialisation) when `overlap`; the kernel must then keep the rules above.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool overlap,
                   Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = grid;
  lc.blockDim = block;
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  lc.attrs = &attr;
  lc.numAttrs = overlap ? 1 : 0;
  TW_CUDA_CHECK(cudaLaunchKernelEx(&lc, kernel, std::forward<Args>(args)...));
}

}  // namespace tw::runtime
