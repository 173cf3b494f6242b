// sm_90a building blocks shared by the Hopper mainloop: the feature guard, register rebalancing
// between warp roles, named barriers, and mbarrier waits that fail fast instead of hanging.
#pragma once

#include <cuda/ptx>
#include <cstdint>

// wgmma and setmaxnreg exist only on the arch-specific target (sm_90a). Everything Hopper-only
// is compiled under this guard; other targets get a trap so a wrong dispatch fails loudly.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TW_SM90_ENABLED 1
#else
#define TW_SM90_ENABLED 0
#endif

// A wait on an mbarrier that has not completed after this many SM cycles (~1 s at 1.98 GHz) is a
// protocol bug (a missing arrive, wrong expect_tx bytes, a parity off by one): trap so the launch
// fails in about a second instead of holding the GPU until the watchdog. The clock is read only on
// the retry path, so the bound costs nothing in the steady state.
#ifndef TW_SM90_SPIN_LIMIT_CYCLES
#define TW_SM90_SPIN_LIMIT_CYCLES (2000000000ll)
#endif

namespace tw::sm90 {

#if TW_SM90_ENABLED
namespace ptx = cuda::ptx;

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) { ptx::mbarrier_init(bar, count); }

// Out of line: a trap inlined into a warp role's code makes ptxas keep that role at the kernel's
// entry register budget (168 at 384 threads) whatever setmaxnreg gives it, and spill around the
// trap (seen in the decode step's consumers: 165 registers at most and ~300 B of spills; none with
// the trap behind a call). The launch then fails with cudaErrorLaunchFailure.
static __device__ __noinline__ void fail_wait() { __trap(); }

// Bounded parity wait. `what` names the barrier for the reader of the code (and a debugger).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity, const char* what) {
  if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
  const long long t0 = clock64();
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
    // No printf here: a call inside the consumer's loop makes ptxas serialise every wgmma
    // (warning C7510). A trap is enough.
    if (clock64() - t0 > TW_SM90_SPIN_LIMIT_CYCLES) fail_wait();
  }
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar);
}
// One arrive counting for `count` (e.g. a warp releasing a slot for all its peers).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar, uint32_t count) {
  ptx::mbarrier_arrive(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, count);
}

// Producer/consumer warpgroups get different register budgets. Takes effect only with a register
// cap at kernel entry (__launch_bounds__(threads, 1)) and when each warpgroup's role is one branch.
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Four 8x8 bf16 matrices of an mma/wgmma accumulator fragment (register i: lane l's row l / 4,
// columns 2 (l % 4) and + 1 of matrix i) stored transposed: lane 8i + j gives the shared address of
// the stored row j of matrix i, which holds column j of the fragment (8 values, 16 bytes).
__device__ __forceinline__ void stmatrix_x4_trans(void* smem, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(smem))),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Named barrier for a subset of warps (id 0 is __syncthreads'): consumers sync among themselves
// while the producer warp keeps streaming.
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrive without waiting (release: this thread's earlier writes are seen by the threads that
// bar.sync on the same barrier).
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
#endif

}  // namespace tw::sm90
