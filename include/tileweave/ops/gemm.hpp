// Standalone decode GEMM on the Hopper weight-streaming mainloop (kernels/sm90/mainloop.cuh):
// Y[M, N] = X[M, K] * W[N, K]^T in bf16 with fp32 accumulation; W is a PyTorch Linear weight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tileweave/graph/tile_graph.hpp"  // tw::InvalidArgument

namespace tw {

// Tuning knobs (the benchmark sweeps them; run_gemm picks the measured default for 0 / default).
struct GemmOptions {
  int k_atoms = 0;     // 64-column slices per pipeline stage: 1 or 2 (2 only with tile_rows 128, M <= 64)
  int tile_rows = 0;   // weight rows per tile: 128 or 256 (256 only for M-slices <= 128)
  int stages = 0;      // ring depth, >= 3 (capped at what fits in shared memory); 0 = all that fit
  int grid = 0;        // persistent CTAs; 0 = one per SM (at most 2 per SM; past what fits at once,
                       // split tiles are summed by their last contributor instead of their first)
  bool partials_first = false;  // a CTA runs its split-K segments before its whole tiles
  bool weights_evict_first = true;  // L2 policy of the weight stream (else evict_normal)
  bool weights_promote_256 = false;  // L2 promotion of the weight boxes: 256 B (else 128 B, measured better)
  bool skip_mma = false;       // diagnostic only: stream the operands, compute nothing, leave Y unwritten
  bool skip_epilogue = false;  // diagnostic only: stream and compute, leave Y unwritten
  // Launch to overlap the kernel before it in the stream (programmatic dependent launch, as
  // DecodeGemmOptions::overlap_previous): CTAs start on the SMs that kernel leaves and stream their
  // first weights before waiting for it; X, Y, the workspace and the counters come after. The
  // caller promises that the kernel before does not write W.
  bool overlap_previous = false;
};

// Requirements (checked before any launch, tw::InvalidArgument otherwise): M >= 1, N >= 1,
// K >= 8 and K % 8 == 0; X, W non-null and 16-byte aligned; Y non-null and 2-byte aligned; the
// device is sm_90 (H100/H200). Any M works (M > 256 runs in slices of 256 rows), any N (a partial
// last weight tile is zero-filled by TMA and masked in the epilogue), any K % 8 == 0.
// Uses a per-device split-K workspace (two 128 KiB fp32 partial slots per CTA, up to 2 CTAs per SM:
// 69 MB on a 132-SM GPU) allocated on
// first use, so the first call for a device must not be inside a stream capture. Calls on
// different streams must not overlap (they share the workspace).
void run_gemm(__nv_bfloat16* Y, const __nv_bfloat16* X, const __nv_bfloat16* W, int M, int N, int K,
              cudaStream_t stream, const GemmOptions& opt = {});

// True when run_gemm can run on the current device (sm_90 with this build's sm_90a code).
bool gemm_sm90_supported();

}  // namespace tw
