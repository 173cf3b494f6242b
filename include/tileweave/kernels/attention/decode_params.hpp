// Parameters of split-KV decode attention, shared by the host op (ops/attention.hpp), the device
// tiles (kernels/attention/decode.cuh) and the executor. Plain C++17: pointers and sizes only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "tileweave/kernels/attention/decode_units.hpp"

namespace tw::kernels {

// Optional per-tile timeline (bench_attention_trace): kDecodeTraceWords words per tile, %globaltimer
// nanoseconds except the SM id and the counts.
enum DecodeTraceWord : int {
  kDtSm = 0,
  kDtEntry = 1,      // thread 0 enters the tile
  kDtFirst = 2,      // warp 0's first stage has landed
  kDtWarpEnd = 3,    // + w: warp w is done with its last stage (4 words)
  kDtSegsDone = 7,   // every segment's result is written
  kDtCounted = 8,    // the partials are counted (the tile knows whether it merges)
  kDtExit = 9,       // merges done, the tile ends
  kDtMerges = 10,    // pairs this tile merged
  kDtSegments = 11,  // segments (pairs) of this tile
  kDtSetup = 12,     // the first segment's prologue is done (q roped in smem, the new row appended)
  kDecodeTraceWords = 13
};

// The work is cut stream-K style (decode_units.hpp: pairs, 16-token units, the even cut). A tile
// runs its range pair by pair (a *segment* per pair); a segment that is a whole pair writes the
// output, one that is part of a pair writes a partial result, and the last tile to finish a pair
// merges them.
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
  // Lengths on the device (a plan made without them, DecodeAttention(shape)): the launch's cut kernel
  // (decode_cut) writes pair_info, tile_first and cut = {tiles that take units, total units}; tiles
  // from cut[0] on do nothing; num_tiles above is the grid. nullptr: the host's plan.
  const int* cut = nullptr;
  int num_kv_heads = 0;
  int group = 0;  // query heads per KV head (what kernels compiled for up to 16 read; the others know it)
  int ring_slots = 2;  // per warp, 1..kDecodeMaxSlots; the smem size depends on it
  // Smem from the ring's start a merging tile may stage partials in (at least the ring's bytes; more
  // where the launch gives it: fewer round trips for a pair cut over many tiles). 0: the ring.
  int merge_stage_bytes = 0;
  // Workspace: o_part [num_tiles][2][group][D] (normalised partial outputs of a tile's first and
  // last segment), lse_part [num_tiles][2][group] (log2 domain), merge_count [npairs] (zero between
  // launches: the merging tile resets it).
  float* o_part = nullptr;
  float* lse_part = nullptr;
  int* merge_count = nullptr;
  // Launched to overlap the kernel before (DecodeAttentionShape::overlap_previous): each warp's
  // first K/V stage is requested before the wait for that kernel, everything else after it.
  bool overlap = false;
  unsigned long long* trace = nullptr;  // [num_tiles][kDecodeTraceWords] or nullptr (no timeline)
  float scale_log2 = 0;  // softmax scale * log2(e)
  bool rope = false;
  const float* inv_freq = nullptr;  // RoPE (rotate-half), [D/2] on the device: angle_i = float(pos) * inv_freq[i]
};

// The few-token path (decode_short.cuh): block i runs pair i whole, every length at most
// kDecodeShortTokens and known on the host. Nothing to plan: no tables, no workspace.
struct DecodeShortParams {
  const __nv_bfloat16* q = nullptr;      // [B, Hq, D]
  const __nv_bfloat16* k_new = nullptr;  // [B, Hkv, D]; nullptr: no append (the cache holds every token)
  const __nv_bfloat16* v_new = nullptr;
  __nv_bfloat16* k_cache = nullptr;      // as DecodeParams
  __nv_bfloat16* v_cache = nullptr;
  const int* page_table = nullptr;       // nullptr: contiguous
  int64_t max_seq_len = 0;
  int page_size = 0, pages_per_seq = 0;
  __nv_bfloat16* out = nullptr;          // [B, Hq, D]
  int num_kv_heads = 0, group = 0;
  float scale_log2 = 0;                  // softmax scale * log2(e)
  const float* inv_freq = nullptr;       // RoPE's [D/2] (DecodeParams::inv_freq); nullptr: no RoPE
  bool overlap = false;                  // every K/V request goes out before the wait for the kernel before
  unsigned long long* trace = nullptr;   // [pairs][kDecodeTraceWords] or nullptr, as DecodeParams
  // The lengths (after the append) in the parameters, not a table: no load stands before the first
  // K/V request. uniform_len > 0: every sequence's; else len[b].
  int uniform_len = 0;
  uint8_t len[kDecodeShortMaxBatch] = {};
};

// The cut kernel's arguments (lengths on the device): decode.cuh's decode_cut.
enum DecodeInputError : int { kDecodeInputOk = 0, kDecodeBadLength = 1, kDecodeBadPage = 2 };
struct DecodeCutArgs {
  const int* seq_lens = nullptr;    // [B]: each cache after the append
  const int* page_table = nullptr;  // [B, pages_per_seq], or nullptr (contiguous)
  int batch = 0, num_kv_heads = 0;
  int capacity = 0;                 // tokens a sequence may hold
  int page_size = 0, pages_per_seq = 0, num_pages = 0;
  int max_tiles = 0;                // the grid
  int min_units = 1;                // 16-token units a tile takes at least
  int2* pair_info = nullptr;        // out: DecodeParams' tables and cut
  int4* tile_first = nullptr;
  int* cut = nullptr;
  int* error = nullptr;             // {DecodeInputError, index, value} of the first bad value; 0 = none
  __nv_bfloat16* out = nullptr;     // filled with NaN when the input is bad
  int64_t out_elems = 0;
};

}  // namespace tw::kernels
