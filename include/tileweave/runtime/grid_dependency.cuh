// Programmatic dependent launch, device side. A launch made with the programmatic-serialization
// attribute may start while the kernel before it in the stream still runs: once every block of
// that kernel has called allow_next_launch() or exited, its blocks take the SMs that kernel's
// blocks leave. Until grid_dependency_wait() returns, such a launch may only read what the kernel
// before does not write (each op says what: weights, K/V cache rows) and must write nothing;
// after it, that kernel has finished and its writes are visible. Both are no-ops in a launch made
// without the attribute, and below sm_90.
#pragma once

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

}  // namespace tw::runtime
