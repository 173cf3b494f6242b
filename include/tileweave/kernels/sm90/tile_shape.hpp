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

}  // namespace tw::sm90
