// Parameters of split-KV decode attention, shared by the host op (ops/attention.hpp), the device
// tiles (kernels/attention/decode.cuh) and the executor. Plain C++17: pointers and sizes only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace tw::kernels {

constexpr int kDecodeMaxGroup = 8;     // query heads per KV head: the 8 rows of an mma tile that hold heads
constexpr int kDecodeStageTokens = 16; // tokens per unit of work and smem stage = the k extent of one P.V mma
constexpr int kDecodeWarps = 4;        // warps per tile; each streams its own stages
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeMaxSlots = 8;     // ring slots per warp (stages in flight)
constexpr int kDecodeMaxTiles = 4096;  // bounds num_tiles (and the workspace)

// The work is cut stream-K style: a *pair* is one (sequence b, KV head h), index b * Hkv + h; it
// holds ceil(len_b / 16) units of 16 tokens, and the pairs' units are numbered one after another.
// Tile c of num_tiles takes units [c * U / num_tiles, (c + 1) * U / num_tiles), U = total_units:
// every tile streams the same bytes (to 16 tokens), whatever the lengths. A tile runs its range
// pair by pair (a *segment* per pair); a segment that is a whole pair writes the output, one that
// is part of a pair writes a partial result, and the last tile to finish a pair merges them.
struct DecodeParams {
  // The new token: q [B, Hq, D], k_new / v_new [B, Hkv, D] (k_new == nullptr: no append, no RoPE on k).
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* k_new = nullptr;
  const __nv_bfloat16* v_new = nullptr;
  // KV cache. Contiguous: [B, Hkv, max_seq_len, D]. Paged: [num_pages, Hkv, page_size, D] with
  // page_table [B, pages_per_seq] (the HND layout: one page of one head is contiguous).
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  const int* page_table = nullptr;  // nullptr: contiguous
  int64_t max_seq_len = 0;
  int page_size = 0, pages_per_seq = 0;
  __nv_bfloat16* out = nullptr;  // [B, Hq, D]
  // The plan. pair_info[i] = {first unit of pair i, length of its sequence (after the append)},
  // i <= npairs (entry npairs = {total_units, 0}). tile_first[c] = {first pair of tile c, its first
  // unit, its end unit, its length}: a tile starts with one load.
  const int2* pair_info = nullptr;
  const int4* tile_first = nullptr;
  int num_tiles = 0, total_units = 0;
  int uniform_len = 0;  // > 0: every sequence has this length, and the plan is arithmetic (no loads)
  int num_kv_heads = 0;
  int ring_slots = 2;  // per warp, 1..kDecodeMaxSlots; the smem size depends on it
  // Workspace: o_part [num_tiles][2][group][D] (normalised partial outputs of a tile's first and
  // last segment), lse_part [num_tiles][2][group] (log2 domain), merge_count [npairs] (zero between
  // launches: the merging tile resets it).
  float* o_part = nullptr;
  float* lse_part = nullptr;
  int* merge_count = nullptr;
  float scale_log2 = 0;  // softmax scale * log2(e)
  bool rope = false;
  float inv_freq[64] = {};  // RoPE (rotate-half): angle_i = float(pos) * inv_freq[i], i < D/2
};

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
#undef TW_DECODE_HD

}  // namespace tw::kernels
