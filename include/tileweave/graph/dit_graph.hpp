// The attention half of a diffusion transformer block as one tile graph (issue 20 item 4, the host
// side): x [L, W] -> QKV projection, whose epilogue normalizes q and k per head (RMSNorm over the
// head dim) and rotates them (RoPE from a table of the tokens' frequencies, so the 2-D / 3-D
// variants of image and video models fit) -> attention -> output projection [L, W]. A QKV column
// tile holds whole heads of q|k|v, so the epilogue's per-head norm and rotation stay inside the tile
// that computes the head: K is normalized and rotated once, by its producer, not
// once per consumer. The traffic model replays it (`tileweave sim --dit HxL`, `tileweave graph --dit
// HxL` for the fusion report); DitAttentionChain (ops/dit_attention_chain.hpp) runs the same graph.
#pragma once

#include <cstdint>

#include "tileweave/graph/prefill_attention_graph.hpp"
#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

struct DitAttentionShape {
  int64_t tokens = 4608;           // one sequence (the joint text + image tokens)
  int heads = 24, head_dim = 128;  // width W = heads x head_dim (Qwen-Image: 24 x 128 = 3072)
  bool causal = false;
  bool fp8 = false;                // the attention's e4m3 path (its quantization not a separate op here)
};

struct DitAttentionGraph {
  TileGraph graph;
  int x = -1, w_qkv = -1, qk_norm = -1, rope = -1, qkv = -1, attn = -1, w_o = -1, y = -1;
  int op_qkv = -1, op_attention = -1, op_o_proj = -1;
  PrefillAttentionShape attention;  // the attention op's shape
};

// GEMM tiles of 128 rows x kDitHeadsPerTile heads (K steps of 64) for both projections (the last
// column tile may be half empty); the attention's items as the op plans them on `sms` SMs
// (prefill_block_m / prefill_block_n).
constexpr int kDitHeadsPerTile = 2;
// InvalidArgument names a bad size.
DitAttentionGraph build_dit_attention_graph(const DitAttentionShape& s, int sms);

// The chain's default order on the executor ("dit_chain"): the QKV tiles head by head (the column
// tiles holding a head's q, k and v, each over its row tiles); the attention items of head h, head by
// head (the items running together share one head's K and V in L2), as soon as both the QKV tiles
// of the next column group (head h + kDitHeadsPerTile) are queued and `lag` more tickets have gone
// since head h's own last QKV tile; then the output projection row by row, which needs every head
// of its rows. Either way an item is taken about a tile time after its producers started, so it
// rarely waits holding its SM: the column group is the longer wait at long sequences, the lag (one
// wave, DitAttentionChain's default) at short ones, where a group is a few dozen tickets (at
// L = 1024 items waited ~36 us each behind a group alone).
Schedule dit_chain_order(const DitAttentionGraph& g, int64_t lag);

}  // namespace tw
