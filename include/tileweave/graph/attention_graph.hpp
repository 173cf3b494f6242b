// Decode attention on the host: its shape, its validation, the stream-K plan (which 16-token units
// each work tile streams; kernels/attention/decode_units.hpp has the arithmetic), and the tile graph
// of attention -> o_proj. No CUDA here: the GPU ops (ops/attention.hpp, ops/attention_oproj.hpp)
// plan with these functions, and the traffic model and the CLI build the same graph from them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

enum class KvLayout { Contiguous, Paged };
// How K/V stream into shared memory: 16-byte cp.async (sm_80+) or Hopper bulk copies (sm_90).
enum class KvLoad { Auto, CpAsync, Bulk };

struct DecodeAttentionShape {
  int batch = 1;
  int num_q_heads = 32, num_kv_heads = 8;  // num_q_heads / num_kv_heads in 1..16 (GQA group)
  int head_dim = 128;                      // 64, 128 or 256
  KvLayout layout = KvLayout::Contiguous;
  int64_t max_seq_len = 0;                 // contiguous: S of [B, Hkv, S, D]
  int page_size = 0;                       // paged: a multiple of 16 (16..256 typical)
  int num_pages = 0;                       // paged: pages in the pool
  int pages_per_seq = 0;                   // paged: row length of the page table [B, pages_per_seq]
  float scale = 0.f;                       // softmax scale; 0: 1/sqrt(head_dim)
  float rope_theta = 10000.f;              // rotate-half RoPE base; <= 0: no RoPE
  bool append = true;                      // false: the cache already holds all seq_lens[b] tokens
  // Overrides of the plan (0: planned): work tiles (blocks of one launch, <= kDecodeMaxTiles),
  // tiles per SM the plan aims for, and 16-token stages in flight per warp (1..kDecodeMaxSlots).
  int num_tiles = 0;
  int tiles_per_sm = 0;
  int ring_slots = 0;
  KvLoad kv_load = KvLoad::Auto;
  // sm_90: launch to overlap the kernel before in the stream (programmatic dependent launch): the
  // launch's blocks start on the SMs that kernel leaves and request their first K/V stage before
  // waiting for it. The caller promises that the kernel before writes neither the cache rows of
  // earlier tokens nor the page table (it may write q, k_new, v_new and the output).
  bool overlap_previous = false;
  // The few-token kernel where the planner picks it (decode_few_tokens); false: the stream-K kernel
  // always (an A/B of both paths in one run).
  bool few_tokens = true;
};

// Checks the shape, the lengths (seq_lens[b] counts the cache after the append) and the page table;
// InvalidArgument "decode attention: ..." naming the bad value.
void validate_decode_attention(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                               const std::vector<int>& page_table);

// K and V bytes the tiles read.
int64_t decode_kv_bytes(const DecodeAttentionShape& s, const std::vector<int>& seq_lens);

// The stream-K plan as the kernel reads it: pair_info [npairs + 1] and tile_first [num_tiles].
struct DecodePlan {
  int num_tiles = 0, total_units = 0;
  int tiles_per_sm = 0;         // what plan_decode_for aimed for (0 from plan_decode)
  // plan_decode_for: the rules' tiles and tiles per SM, and both plans' predicted time (DecodeCost).
  int rule_tiles = 0, rule_tiles_per_sm = 0;
  double rule_us = 0, predicted_us = 0;
  // plan_decode_for: the standalone op runs the few-token kernel (one block per pair) instead of these
  // tiles (decode_few_tokens). The tiles stay planned: the executor and the CLI's model use them.
  bool few_tokens = false;
  std::vector<int> pair_info;   // {first unit, sequence length} per pair, flattened int2
  std::vector<int> tile_first;  // {pair, its first unit, its end unit, its length} per tile, flattened int4
};
// The plan for num_tiles tiles (clamped to [1, total units]).
DecodePlan plan_decode(const std::vector<int>& seq_lens, int num_kv_heads, int num_tiles);
// The time of one launch as the planner predicts it, from how a plan cuts the work: a fixed cost per
// launch and tile (more at head dim 256), a further cost for each more pair a tile holds part of (its
// own q, combine and partial), the widest tile's bytes at its share of its SM's rate (the GPU's
// streaming rate over the SMs in use, at most `sm_gbps` each, halved for two tiles per SM), and,
// where a pair is cut over several tiles, the count and the last tile's merge of their partials (per
// KB of the widest pair's partials).
// Fitted on the H200 (bench/fit_decode_plan.py over bench_attention_sweep --tiles-sweep, seeds 16,
// 2026 and 7, bench/results/h200/attention_tiles_sweep_seed*.json: 846 timed plans of 120 shapes,
// mean error 8.8%). Fitted on two seeds, the planner's picks on the third were 3.5-4.5% faster in
// geomean than the rules' plans (5-8 shapes faster each; one shape of 120 slower by more than 3%).
struct DecodeCostModel {
  double base_us = 3.754;
  double d256_us = 1.616;
  double segment_us = 2.440;
  double stream_scale = 0.931;
  double merge_us = 2.989;
  double merge_us_per_kb = 0.027;
  double merge_us_per_kb_d256 = 0.020;  // more at head dim 256, whose tiles merge with 4 warps
  double two_per_sm_us = 0.137;
  double sm_gbps = 45;
  double read_tbps = 4.0;
};
struct DecodeCost {
  double us = 0;
  double stream_us = 0, merge_us = 0;
  int max_units = 0;      // units of the widest tile
  int max_segments = 0;   // pairs the most cut tile holds part of
  int widest_pair = 0;    // tiles the most cut pair is spread over
};
// What the fraction of the streaming rate `active` of `sms` SMs reach (bench_stream_patterns, H200:
// a quarter of the SMs 54%, half 86%, three quarters 90%), interpolated.
double decode_active_fraction(int active, int sms);
DecodeCost predict_decode_cost(const DecodeAttentionShape& s, const std::vector<int>& seq_lens, int num_tiles,
                               int tiles_per_sm, int sms, const DecodeCostModel& m = {});
// The plans the planner weighs: (tiles, tiles per SM) for whole multiples of the pairs, a quarter,
// half, all and twice the SMs, each at most the units (one unit a tile), at one or two tiles per SM.
std::vector<std::pair<int, int>> decode_plan_candidates(const DecodeAttentionShape& s, const std::vector<int>& seq_lens, int sms);
// The candidates with the model's cost, fastest first (ties in candidate order).
struct DecodeCandidate {
  int tiles = 0, tiles_per_sm = 0;
  DecodeCost cost;
};
std::vector<DecodeCandidate> rank_decode_candidates(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                                                    int sms, const DecodeCostModel& m = {});
// The few-token path (kernels/attention/decode_short.cuh) for these lengths, given on the host, on a
// GPU of `sms` SMs: every pair at most kDecodeShortTokens (64) tokens, every pair's block resident at
// once, B <= kDecodeShortMaxBatch, and no override of the stream-K plan in the shape (num_tiles,
// tiles_per_sm, ring_slots, KvLoad::Bulk, few_tokens = false). attention_graph.cpp says why.
bool decode_few_tokens(const DecodeAttentionShape& s, const std::vector<int>& seq_lens, int sms);
// The planner: the plan DecodeAttention runs on a GPU with `sms` SMs, the shape's overrides
// respected. The rules (comments in attention_graph.cpp) give a plan; the cost model's best candidate
// replaces it where it predicts at least 10% less time (the margin keeps the rules' measured choices
// where the model cannot tell them apart). few_tokens is set by decode_few_tokens unless the lengths
// live on the device (a plan for full caches, cut at run time: the stream-K kernel). Expects a
// validated shape (validate_decode_attention).
DecodePlan plan_decode_for(const DecodeAttentionShape& s, const std::vector<int>& seq_lens, int sms,
                           bool lengths_on_device = false);

// Warps per work tile: 8 at one tile per SM (4 there left each scheduler one warp, its math and copy
// issue unhidden), 4 at two; 4 at head dim 256, where 8 warps' combine buffers leave no smem for a ring.
int decode_tile_warps(int head_dim, int tiles_per_sm);

// What a plan does (`tileweave plan attention`): its pairs and tiles, the pairs held by several tiles
// (each of those tiles writes a partial output, and the last to finish merges them), and the bytes.
struct DecodePlanSummary {
  int pairs = 0, tiles = 0, tiles_per_sm = 0, warps = 0;
  int units_per_tile = 0;         // 16-token units a tile streams, at most
  int split_pairs = 0;            // pairs held by more than one tile: merged in the launch
  int widest_pair_tiles = 1;      // the most tiles one pair spans: the longest merge
  int64_t partials = 0;           // partial outputs written, over all split pairs
  int64_t kv_bytes = 0;           // K and V read
  int64_t partial_bytes = 0;      // the partials' fp32 outputs and LSEs, written and read back by the merges
  int64_t widest_merge_bytes = 0;  // what the widest pair's merging tile reads (one SM)
};
DecodePlanSummary summarize_decode_plan(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                                        const DecodePlan& plan);

// A unit of executor work: work tile `tile` (kernels::decode_work_tile). Tiles depend on nothing
// and never wait for each other. The output rows of pair i = b * Hkv + h (query heads h * G ..
// h * G + G - 1 of sequence b) are written by the tile that holds the pair whole, or by whichever
// of the tiles holding a part of it finishes last: a consumer of those rows depends on every tile
// with pair_begin <= i < pair_end.
struct DecodeTileDesc {
  int tile = 0;
  int pair_begin = 0, pair_end = 0;
};
std::vector<DecodeTileDesc> decode_tile_descs(const DecodePlan& plan);

// The tensors of a decode-attention op in a TileGraph, as 2-D bf16 tensors:
//   q, out [B, Hq*D]; k_new, v_new [B, Hkv*D] (only with append);
//   k_cache, v_cache: one row per cached token, [B*Hkv*max_seq_len, D] contiguous or
//   [num_pages*Hkv*page_size, D] paged.
struct DecodeAttentionTensorIds {
  int q = -1, k_new = -1, v_new = -1, k_cache = -1, v_cache = -1, out = -1;
};

// O = attention(q, K, V) [B, Hq*D]; Y = O . Wo^T (+ R) [B, hidden]. The o_proj tiles cut K = Hq*D
// in slices (split-K), so a slice is a range of heads and its tiles depend only on the attention
// tiles that hold those heads of their rows.
struct AttentionOprojGraph {
  TileGraph graph;
  DecodeAttentionTensorIds attn;  // attn.out is O
  int w_o = -1, residual = -1, y = -1;
  int op_attention = -1, op_oproj = -1;
};
AttentionOprojGraph build_attention_oproj_graph(const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                                                const std::vector<int>& page_table, const DecodePlan& plan,
                                                int64_t hidden, const Tiling& oproj, bool residual);

// The o_proj tiling the executor's sm80 weight tiles run (ops/attention_oproj.hpp): at B <= 16,
// 16 weight rows x 256 K per stage (the FFN's measured choice at M <= 16: fewer split-K reductions);
// above, 64 weight rows x 128 K, up to 64 rows of O per tile. split_k 0: K slices of whole KV-head
// groups holding about 128 KiB of weights per tile (measured best; at B <= 16 that is all of K).
Tiling attention_oproj_tiling(const DecodeAttentionShape& s, int64_t hidden, int split_k = 0);

}  // namespace tw
