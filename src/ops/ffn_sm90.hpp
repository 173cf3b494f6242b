// The fused FFN's Hopper tile body (ffn_sm90.cu), as FusedFfn (ffn.cu) drives it. Internal.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tileweave/runtime/exec_params.hpp"

namespace tw::ffn_sm90 {

// Weight rows per tile: two consumer warpgroups x 64 (wgmma's M). A gated tile holds 64 output
// columns (8 gate rows then their 8 up rows per 16-row group); a plain tile 128.
constexpr int kTileRows = 128;
constexpr int kThreads = 384;  // 1 producer warpgroup + 2 consumer warpgroups

// One GEMM op of the chain.
struct OpArgs {
  __nv_bfloat16* out;  // [m, n] row-major
  float* ws;           // split-K partials: one block of kTileRows * act_rows floats per output tile
  int32_t m, n;        // activation rows, output columns
  int32_t grid_n;      // output column tiles
  int32_t k_stages;    // K / stage width, rounded up
  int32_t slice_stages;  // stages per split-K slice
  int32_t split, silu;
};

// Tensor maps of the launch: w0 (W_gate_up read as interleaved 8-row gate/up groups, one box per
// tile; or the chain's W0 in 128-row boxes), w1 (W_down, 128-row boxes), x and h (boxes of
// act_rows rows).
struct Maps {
  CUtensorMap w0, w1, x, h;
};

// Activation rows per tile (wgmma N) for a batch of m rows: 8, 16, 32, 64, 128 or 256.
int act_rows_for(int64_t m);
// K columns per pipeline stage for that tile height.
int stage_cols_for(int act_rows);
// Dynamic shared memory of the kernel for that tile height (sets the function attribute once).
int prepare_kernel(int act_rows);

CUtensorMap weight_map(const __nv_bfloat16* w, int64_t rows, int64_t cols);
CUtensorMap gate_up_map(const __nv_bfloat16* w_gate_up, int64_t f, int64_t cols);
CUtensorMap act_map(const __nv_bfloat16* a, int64_t rows, int64_t cols, int act_rows);

void launch(const runtime::ExecParams& ep, const Maps& maps, const OpArgs (&ops)[2], int act_rows, int grid,
            cudaStream_t stream);

}  // namespace tw::ffn_sm90
