// The fused FFN's Hopper tile body (ffn_sm90.cu), as FusedFfn (ffn.cu) drives it. Internal.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/kernels/sm90/tile_shape.hpp"
#include "tileweave/runtime/exec_params.hpp"

namespace tw::ffn_sm90 {

using sm90::kTileRows;  // a gated tile holds 64 output columns: 8 gate rows then their 8 up rows per 16-row group
using sm90::act_rows_for;
using sm90::stage_cols_for;
constexpr int kThreads = 384;  // 1 producer warpgroup + 2 consumer warpgroups

constexpr int kMaxSlices = 64;  // split-K slices per op (the slice table lives in the kernel parameters)

// One GEMM op of the chain.
struct OpArgs {
  __nv_bfloat16* out;  // [m, n] row-major
  float* ws;           // split-K partials: one block of kTileRows * act_rows floats per output tile
  int32_t m, n;        // activation rows, output columns
  int32_t grid_n;      // output column tiles
  int32_t split, silu;
  int32_t act;  // plain columns: FfnActivation of the output (kernels::ffn_activate)
  const __nv_bfloat16* w_packed;  // weights in the packed layout, or null: read through the tensor maps
  int32_t packed_atoms;           // 64-column blocks per tile in the packed layout
  // 1 when another op of the launch reads this op's output: its tiles then fence and release their
  // counter. The last op's tiles skip both: the GPU-scope release waits until the tile's stores
  // have left the SM (the epilogue took 1.8 us at M = 1 and 4.4 us at M = 64 in the 8B timelines,
  // H200), and the last of those waits is the launch's tail. The launch's end publishes them.
  int32_t publish;
  // First K stage of each split-K slice; slice_start[split] = K / stage width, rounded up. Slices
  // may be uneven (small ones at the end of the schedule shorten the launch's tail).
  int16_t slice_start[kMaxSlices + 1];
};

// Tensor maps of the launch: w0 (W_gate_up read as interleaved 8-row gate/up groups, one box per
// tile; or the chain's W0 in 128-row boxes), w1 (W_down, 128-row boxes), x and h (boxes of
// act_rows rows).
struct Maps {
  CUtensorMap w0, w1, x, h;
};

// Dynamic shared memory of the kernel for that tile height (sets the function attribute once).
int prepare_kernel(int act_rows);

// Tiles of more than 64 activation rows: their slices' partial sums (up to 128 KiB of reductions a
// tile) are what the consumers waited on before their arrival, and the split finisher takes that
// wait off them (H200, bench_sweep seeds 16 and 2026 against the last-arriver protocol, three runs:
// 0.971-0.973x the time in geomean at M = 65-512, 0.995-0.998x in prefill). At 64 rows and fewer it
// was 1.002-1.005x (a traced gated FFN d = 6400, F = 4096 at M = 37: 60.8 against 55.0 us): a
// tile's slices run together there, and the fixed slice waits for the others where the last to
// arrive would not.
inline bool split_finisher_pays(int act_rows) { return act_rows > 64; }

// The packed weight layout (FusedFfn::pack): tile by tile (a tile's kTileRows rows in the order the
// tensor maps deliver them: plain rows, or W_gate_up's interleaved 8-gate/8-up groups), each tile
// as packed_atoms(cols) blocks of 64 columns, each block kTileRows x 128 bytes already in the
// 128-byte swizzle of the wgmma operand, zero-padded. A pipeline stage is then one bulk copy of
// contiguous bytes, where the tensor map reads 128 rows of 128 or 256 bytes each: on the H200 the
// contiguous stream is ~3% faster for the same bytes (DRAM pages opened per byte).
int64_t packed_atoms(int64_t cols);  // ceil(cols / 64), rounded up to even (a stage holds 1 or 2)
int64_t packed_tiles(int64_t rows, bool gate_up_pairs);  // rows: F for paired W_gate_up
// w [rows, cols] (paired: [2 * rows, cols] = [gate; up]) into out[packed_tiles * packed_atoms * kTileRows * 64].
void pack_weights(const __nv_bfloat16* w, __nv_bfloat16* out, int64_t rows, int64_t cols, bool gate_up_pairs,
                  cudaStream_t stream);

// Operands of the ops on this body: non-null device pointers, 16-byte aligned (TMA and bulk copies
// need it). Throws InvalidArgument naming `op` and the operand.
void check_operand(const char* op, const void* p, const char* name);

// The SMs the tiles are spread over (132 where no GPU is visible, e.g. the CLI).
int sm_count();

CUtensorMap weight_map(const __nv_bfloat16* w, int64_t rows, int64_t cols);
CUtensorMap gate_up_map(const __nv_bfloat16* w_gate_up, int64_t f, int64_t cols);
CUtensorMap act_map(const __nv_bfloat16* a, int64_t rows, int64_t cols, int act_rows);

// overlap: launch with programmatic stream serialisation, so the launch's blocks start on the SMs
// the previous kernel in the stream leaves and stream their first tile's weights before waiting
// for that kernel to finish (runtime/executor.cuh). The caller promises that no kernel writes the
// weights while they are in use.
// ticket_lead: the block's next ticket is drawn when its current tile has this many stages left to
// issue (runtime/ticket_warp.cuh; FfnOptions::ticket_lead).
// split_finisher: each split group's slice of the last K range sums the group and the others'
// arrivals go to a warp of their own (FfnOptions::split_finisher); the schedule must put that slice
// after the group's others (split_finisher_last), and split_finisher_pays says where it is worth it.
void launch(const runtime::ExecParams& ep, const Maps& maps, const OpArgs (&ops)[2], int act_rows, int grid,
            bool overlap, int ticket_lead, bool split_finisher, cudaStream_t stream);

}  // namespace tw::ffn_sm90
