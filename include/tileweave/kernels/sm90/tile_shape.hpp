// The sm90 weight-streaming tile's shape as the host plans with it (plain C++: the graph builders and
// the traffic model use it without CUDA). kernels/sm90/mainloop.cuh is the device side.
#pragma once

#include <cstdint>

namespace tw::sm90 {

// Weight rows per tile: two consumer warpgroups x 64 (wgmma's M). A tile of paired rows (gate/up, or
// a head's rotary halves) holds 64 output columns and their 64 partners.
constexpr int kTileRows = 128;

// Activation rows per tile (wgmma N) for a batch of m rows: 8, 16, 32, 64, 128 or 256.
constexpr int act_rows_for(int64_t m) {
  return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 ? 128 : 256;
}
// K columns per pipeline stage: two 64-column swizzle atoms up to 64 activation rows, one above (the
// stage's activation bytes grow with the rows; one atom keeps enough stages in shared memory).
constexpr int stage_cols_for(int act_rows) { return act_rows <= 64 ? 128 : 64; }
constexpr int kMaxActRows = 256;
// The decode step's K columns per stage: at 8 rows (B <= 4) four atoms, 64 KiB of weights a copy
// (three stages in the ring instead of six of 32 KiB: the same bytes in flight). An SM's bulk copies
// complete at about a fixed rate per copy, not per byte: one SM alone streams ~74 GB/s in 32 KiB
// copies and ~119 GB/s in 64 KiB ones (bench_stream_patterns, H200), and at small batches most of a
// step's phases stream on fewer SMs than the GPU has (qkv's 96 tiles, gate/up's last wave, tails).
// Measured: -2.1 to -5.7% a step at B = 1-4 (decode_step_wide_stages_ab.json). At 16 and 32 rows
// (B = 5-16) three atoms, 48 KiB a copy, three stages: -0.2 to -2.5% (decode_step_stages_192_ab.json).
// A tile whose K is not a whole number of stages ends on a shorter one, completed with zeros (the step
// kernel's issue_weights; its packed weights are rounded to 2 atoms).
constexpr int step_stage_cols(int act_rows) {
  return act_rows <= 8 ? 256 : act_rows <= 32 ? 192 : stage_cols_for(act_rows);
}

// Every height the FFN / GEMM body runs (a wgmma N of each): the powers of two above, and from 96
// up every multiple of 32.
constexpr bool is_tile_rows(int rows) {
  return rows == 8 || rows == 16 || rows == 32 || rows == 64 || (rows >= 96 && rows <= kMaxActRows && rows % 32 == 0);
}
// Heights fitted to M (FfnOptions::tile_rows "fit"): up to 64 rows the classes of act_rows_for;
// above, the fewest row blocks of at most 256 rows, each the smallest multiple of 32 that holds
// its share. The mainloop computes whole tiles, so padding rows cost as much as real ones: M = 200
// runs one block of 224 rows where act_rows_for gives 256 (12.5% less work), M = 300 two of 160
// where it gives two of 256 (37.5% less), M = 4096 sixteen of 256 either way.
constexpr int fit_act_rows(int64_t m) {
  if (m <= 64) return act_rows_for(m);
  const int64_t blocks = (m + kMaxActRows - 1) / kMaxActRows, share = (m + blocks - 1) / blocks;
  return static_cast<int>((share + 31) / 32 * 32);
}

}  // namespace tw::sm90
