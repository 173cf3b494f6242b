// Standalone decode GEMM on the Hopper weight-streaming mainloop (kernels/sm90/mainloop.cuh):
// Y[M, N] = X[M, K] * W[N, K]^T in bf16 with fp32 accumulation; W is a PyTorch Linear weight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tileweave/graph/tile_graph.hpp"  // tw::InvalidArgument

namespace tw {

// Tuning knobs (the benchmark sweeps them; run_gemm picks the measured default).
struct GemmOptions {
  int k_atoms = 0;  // 64-column slices per pipeline stage: 1 or 2; 0 = default for the M bucket
  int grid = 0;     // persistent CTAs; 0 = one per SM (at most 4 per SM)
};

// Requirements (checked before any launch, tw::InvalidArgument otherwise): M >= 1, N >= 1,
// K >= 8 and K % 8 == 0; X, W non-null and 16-byte aligned; Y non-null and 2-byte aligned; the
// device is sm_90 (H100/H200). Any M works (M > 256 runs in slices of 256 rows), any N (a partial
// last weight tile is zero-filled by TMA and masked in the epilogue), any K % 8 == 0.
// Uses a per-device split-K workspace allocated (and zeroed) on first use, so the first call for a
// device must not be inside a stream capture. Calls on different streams must not overlap.
void run_gemm(__nv_bfloat16* Y, const __nv_bfloat16* X, const __nv_bfloat16* W, int M, int N, int K,
              cudaStream_t stream, const GemmOptions& opt = {});

// True when run_gemm can run on the current device (sm_90 with this build's sm_90a code).
bool gemm_sm90_supported();

}  // namespace tw
