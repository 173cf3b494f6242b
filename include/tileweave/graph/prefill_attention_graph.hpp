// Prefill (self-)attention on the host: the shape, its validation, the work tiles the sm90 kernel
// runs (one per sequence and 128-row query tile, all query heads of it in the grid's second
// dimension) and the FLOP count the benchmark divides by. No CUDA here: the GPU op
// (ops/prefill_attention.hpp) plans with these functions.
//
// Packed ("THD") layout, as FlashAttention's varlen API: q [total_q, Hq, D], k and v
// [total_k, Hkv, D], out [total_q, Hq, D]; sequence b holds rows cu_seqlens[b] .. cu_seqlens[b+1].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"  // tw::InvalidArgument

namespace tw {

struct PrefillAttentionShape {
  int num_q_heads = 24, num_kv_heads = 24;  // num_q_heads a multiple of num_kv_heads (GQA)
  int head_dim = 128;                       // 64, 128 or 256 (256: the sm90 kernel, bf16)
  bool causal = false;                      // key j visible to query i iff j <= i + (len_k - len_q)
  float scale = 0.f;                        // softmax scale; 0: 1/sqrt(head_dim)
  // FP8 (e4m3) Q, K and V, fp32 accumulation; head_dim 128. The op quantizes the bf16 inputs itself:
  // Q with a scale per token and head, K per block of kPrefillFp8KeyBlock keys and head, V per
  // channel and head (docs/prefill_attention.md, "FP8").
  bool fp8 = false;
  // The kernel: "sm90" (wgmma + TMA, warp-specialised; Hopper), "sm80" (mma.sync + cp.async; Ampere,
  // Ada, and Hopper too; bf16 only), or "auto" (sm90 on an sm_90 GPU, else sm80).
  std::string mainloop = "auto";
  // sm90: the last round of items split over key ranges where the planner says it ends sooner
  // (plan_prefill_work); false: every item whole.
  bool split_tail = true;
};

// Query rows per tile of the sm90 kernel, and keys per K/V tile unless prefill_block_n says more.
constexpr int kPrefillBlockM = 128;
constexpr int kPrefillBlockN = 128;
// The FP8 path's keys: a K scale covers one block of kPrefillFp8KeyBlock keys; the kernel's key
// tile is kPrefillFp8TileKeys (three blocks: 192 keys, the reach of FlashAttention-3's 224 in our
// layout: fewer iterations than 128, each with its fixed cost); each sequence's keys start on a
// tile boundary of the quantized K and V (prefill_fp8_key_offsets).
constexpr int kPrefillFp8KeyBlock = 64;
constexpr int kPrefillFp8TileKeys = 192;
// Keys per K/V tile for the shape: 160 at d = 128 without the causal mask (fewer iterations, each
// with its fixed cost: +1.5-3% over 128 at L 4097-14034 on the H200, 2026-11-24; 176 spilled and
// ran no faster), 64 at d = 256 (what shared memory holds beside a 64 KiB Q), 128 otherwise (the
// causal mask wastes more of a wider tile on the diagonal).
int prefill_block_n(const PrefillAttentionShape& s);
// Query rows per item for the shape on a GPU of `sms` SMs: at d = 64, 192 (three consumer
// warpgroups, each softmax under the other two's GEMMs: 1.18x the throughput of two, measured)
// when the items' rounds over the SMs say it is faster, else 128. A small problem stays at 128:
// H = 8, L = 4096 ran 17% slower at 192 (176 items for 132 SMs, two rounds either way).
int prefill_block_m(const PrefillAttentionShape& s, const std::vector<int>& cu_seqlens_q, int sms);

// Checks the heads, head_dim and scale, and the offsets: cu_seqlens_q has batch + 1 entries, starts
// at 0 and never decreases; cu_seqlens_k is empty (keys = queries) or the same size with the same
// rules. InvalidArgument "prefill attention: ..." naming the bad value.
void validate_prefill_attention(const PrefillAttentionShape& s, const std::vector<int>& cu_seqlens_q,
                                const std::vector<int>& cu_seqlens_k);

// The FP8 path's key offsets: sequence b's keys at rows [out[b], out[b] + len_k) of the quantized K
// and V, each sequence padded to whole kPrefillFp8TileKeys tiles (zero keys, masked). cu_seqlens_k
// validated; the result's last entry is the padded key count.
std::vector<int> prefill_fp8_key_offsets(const std::vector<int>& cu_seqlens_k, int tile_keys = kPrefillFp8TileKeys);

// One item of the kernel: query rows [q_tile * block_m, +block_m) of sequence `seq` against its
// first `kv_tiles` key tiles of block_n (fewer under the causal mask; 0 when the rows see no key).
struct PrefillTile {
  int seq = 0, q_tile = 0, kv_tiles = 0;
};
// The tiles in launch order: most key tiles first (the longest blocks start in the first wave, the
// short ones fill the tail), ties in sequence and query-tile order. Expects validated input;
// cu_seqlens_k empty means the same as cu_seqlens_q.
// block_n / block_m: keys per K/V tile and query rows per tile the kernel runs (the op passes
// prefill_block_n and its query tile).
std::vector<PrefillTile> plan_prefill_tiles(const PrefillAttentionShape& s, const std::vector<int>& cu_seqlens_q,
                                            const std::vector<int>& cu_seqlens_k, int block_n = kPrefillBlockN,
                                            int block_m = kPrefillBlockM);

// How the sm90 kernel deals the work of a plan (plan_prefill_work): items are (head, plan tile)
// pairs numbered head by head, w = head * tiles + tile. Draws [0, whole) take item w whole; draws
// whole .. whole + units - 1 take a unit of the tail: the items from `whole` on, their key tiles laid
// end to end and cut into `units` near-equal ranges (a stream-K tail), or each item cut into a few
// ranges of its own, so that the last round ends together on every SM. A unit runs its pieces one
// after another; a piece holding part of an item's
// key tiles writes its partial (O unnormalised, the rows' max and sum) to slot `slot` and counts
// itself, and the item's last piece to count merges the others' into its own and stores the rows.
struct PrefillPiece {
  int item = 0;       // w
  int kv_first = 0;   // first key tile of the item this piece runs
  int kv_tiles = 0;   // key tiles it runs
  int group = -1;     // split item: its counter (-1: the piece is the whole item)
  int slot = 0;       // split item: this piece's partial slot
  int first_slot = 0;  // split item: the item's first slot (its pieces' slots follow)
  int parts = 1;      // split item: its pieces
};
struct PrefillWork {
  int64_t items = 0;               // heads x plan tiles
  int64_t whole = 0;               // draws of whole items; the rest of the items are the tail's
  std::vector<int> unit_offsets;   // units + 1 entries: unit u's pieces are [u_off[u], u_off[u + 1])
  std::vector<PrefillPiece> pieces;
  int groups = 0, slots = 0;       // split items and partial slots
  double makespan = 0, makespan_whole = 0;  // the simulated ends (key tiles), with and without the tail
  int units() const { return unit_offsets.empty() ? 0 : int(unit_offsets.size()) - 1; }
  int64_t draws() const { return whole + units(); }
};
// The planner's cost of a piece, in key tiles: its tiles plus a fixed cost per piece (Q, the first S
// GEMM alone, the epilogue) and, for a part of a split item, its partial's stores, count and the
// merge's round trips. The op takes them from its configuration's time model
// (model/prefill_traffic.hpp, prefill_piece_costs: fp8's fixed cost is ~6 of its key tiles); these
// are bf16 d = 128's, rounded.
struct PrefillPieceCosts {
  double piece = 1.0, split = 1.5;
};
constexpr int kPrefillMaxParts = 8;  // key ranges an item is cut into at most, when each is a unit
// Chooses the tail from the plan, the heads and the SMs: the draws are simulated in order, each to
// the block free first, for no tail and for tails of the last (items mod sms) + t * sms items,
// t = 0, 1, 2, each cut as a stream-K tail or into 2 .. kPrefillMaxParts ranges an item; a tail is
// taken where it ends at least 2% sooner. split = false: no tail.
PrefillWork plan_prefill_work(const std::vector<PrefillTile>& tiles, int heads, int sms, bool split = true,
                              const PrefillPieceCosts& costs = {});
// When the last of `costs` ends, dealt in order each to the first of `sms` blocks to be free (the
// kernel's counter: a block draws again as it finishes). plan_prefill_work's simulation, and the time
// model's (model/prefill_traffic.hpp) in microseconds.
double prefill_draws_end(const std::vector<double>& costs, int sms);

// The tensors of TileGraph::add_prefill_attention: q, k, v each a column range of a tensor (columns
// q_col .. q_col + Hq*D of q, and so on; one tensor with three offsets is a fused QKV projection's
// output [total, (Hq + 2 Hkv) D]), out [total_q, Hq*D].
struct PrefillAttentionTensorIds {
  int q = -1, k = -1, v = -1, out = -1;
  int64_t q_col = 0, k_col = 0, v_col = 0;
};

// 4 * D * Hq * (query, key) pairs the mask lets through: the FLOPs of S = QK^T and O = PV.
double prefill_attention_flops(const PrefillAttentionShape& s, const std::vector<int>& cu_seqlens_q,
                               const std::vector<int>& cu_seqlens_k);

}  // namespace tw
