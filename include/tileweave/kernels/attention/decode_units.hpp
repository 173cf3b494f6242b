// The stream-K unit arithmetic of split-KV decode attention, shared by the host (the planner and
// the tile graph, which must stay CUDA-free) and the device tiles. Plain C++17, no CUDA headers.
//
// A *pair* is one (sequence b, KV head h), index b * Hkv + h; it holds ceil(len_b / 16) units of
// 16 tokens, and the pairs' units are numbered one after another. Tile c of num_tiles takes units
// [c * U / num_tiles, (c + 1) * U / num_tiles), U = total_units: every tile streams the same bytes
// (to 16 tokens), whatever the lengths.
#pragma once

#include <cstdint>

namespace tw::kernels {

constexpr int kDecodeMaxGroup = 16;    // query heads per KV head: the 16 rows of an m16 mma tile
constexpr int kDecodeStageTokens = 16; // tokens per unit of work and smem stage = the k extent of one P.V mma
constexpr int kDecodeWarps = 4;        // warps per tile; each streams its own stages
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeMaxSlots = 8;     // ring slots per warp (stages in flight)
constexpr int kDecodeMaxTiles = 4096;  // bounds num_tiles (and the workspace)

#ifdef __CUDACC__
#define TW_DECODE_HD __host__ __device__
#else
#define TW_DECODE_HD
#endif
TW_DECODE_HD inline int decode_units(int seq_len) { return (seq_len + kDecodeStageTokens - 1) / kDecodeStageTokens; }
// First unit of tile c.
TW_DECODE_HD inline int decode_tile_start(int c, int num_tiles, int total_units) {
  return static_cast<int>(int64_t(c) * total_units / num_tiles);
}
// The tile holding unit u: the largest c with decode_tile_start(c) <= u.
TW_DECODE_HD inline int decode_tile_of(int u, int num_tiles, int total_units) {
  return static_cast<int>((int64_t(u + 1) * num_tiles - 1) / total_units);
}
// A tile count aligned to `pairs` equally long pairs, from `most` tiles: each pair the same whole
// number of tiles (no tile holds parts of two pairs), or with more pairs than tiles each tile the
// same whole number of pairs when that fills >= 90% of `most` (no partials at all); else `most`.
TW_DECODE_HD inline int decode_aligned_tiles(int pairs, int most) {
  if (pairs <= most) return pairs * (most / pairs);
  const int per = (pairs + most - 1) / most, tiles = pairs / per;
  return pairs % per == 0 && 10 * tiles >= 9 * most ? tiles : most;
}

// The few-token path (decode_short.cuh): one block of kDecodeWarps warps per pair, each warp one
// 16-token unit, so a pair holds at most kDecodeShortTokens; the lengths travel in the kernel's
// parameters, a byte per sequence, for up to kDecodeShortMaxBatch sequences.
constexpr int kDecodeShortTokens = kDecodeWarps * kDecodeStageTokens;
constexpr int kDecodeShortMaxBatch = 256;
// Blocks per SM its launch bounds guarantee (registers: <= 80, 128, 255 a thread; their shared memory
// at 64 tokens fits as many): the planner's one wave is sms x this many pairs.
TW_DECODE_HD constexpr int decode_short_blocks_per_sm(int head_dim) {
  return head_dim == 64 ? 5 : head_dim == 128 ? 4 : 2;
}
#undef TW_DECODE_HD

}  // namespace tw::kernels
