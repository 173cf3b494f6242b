// The attention half of a DiT block as one tile graph: see graph/dit_graph.hpp.
#include "tileweave/graph/dit_graph.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace tw {

DitAttentionGraph build_dit_attention_graph(const DitAttentionShape& s, int sms) {
  if (s.tokens < 1 || s.tokens > (int64_t{1} << 24))
    throw InvalidArgument("dit attention: tokens " + std::to_string(s.tokens) + " must be in [1, 2^24]");
  if (s.heads < 1 || s.heads > 256) throw InvalidArgument("dit attention: heads " + std::to_string(s.heads) + " must be in [1, 256]");
  if (sms < 1) throw InvalidArgument("dit attention: sms must be >= 1, got " + std::to_string(sms));
  DitAttentionGraph g;
  g.attention.num_q_heads = g.attention.num_kv_heads = s.heads;
  g.attention.head_dim = s.head_dim;
  g.attention.causal = s.causal;
  g.attention.fp8 = s.fp8;
  g.attention.split_tail = false;  // the chain's attention items run whole (its tickets: one item each)
  const std::vector<int> cu = {0, int(s.tokens)};
  validate_prefill_attention(g.attention, cu, {});  // names a bad head_dim (64, 128 or 256; fp8: 128)
  const int64_t L = s.tokens, D = s.head_dim, W = int64_t(s.heads) * D;
  TileGraph& G = g.graph;
  g.x = G.add_tensor("x", L, W, 2, TensorRole::Input);
  g.w_qkv = G.add_tensor("w_qkv", 3 * W, W, 2, TensorRole::Weight);
  g.qk_norm = G.add_tensor("qk_norm", 2, D, 2, TensorRole::Weight);  // RMSNorm weights of q, k
  g.rope = G.add_tensor("rope", L, D, 4, TensorRole::Input);         // cos | sin of each token's frequencies
  g.qkv = G.add_tensor("qkv", L, 3 * W, 2, TensorRole::Intermediate);
  g.attn = G.add_tensor("attn", L, W, 2, TensorRole::Intermediate);
  g.w_o = G.add_tensor("w_o", W, W, 2, TensorRole::Weight);
  g.y = G.add_tensor("y", L, W, 2, TensorRole::Output);

  // QKV: a column tile holds two heads of q|k|v (kDitHeadsPerTile), each whole in it, so the epilogue
  // normalizes and rotates a head inside the tile that computes it; tiles holding q or k heads also
  // read the norms' weights and the RoPE rows of their tokens.
  const int64_t hpt = kDitHeadsPerTile;
  const Tiling qkv_t{std::min<int64_t>(128, L), hpt * D, 64, 1, {}};
  g.op_qkv = G.add_gemm_ex("qkv", OpKind::Gemm, g.x, g.w_qkv, g.qkv, qkv_t, {}, {}, [&](Tile& t) {
    const int64_t first = t.tn * hpt / s.heads, last = std::min<int64_t>(3 * s.heads - 1, t.tn * hpt + hpt - 1) / s.heads;
    if (first > 1) return;  // v heads only
    t.reads.push_back({g.qk_norm, first, std::min<int64_t>(last, 1) + 1, 0, D});
    t.reads.push_back({g.rope, t.tm * qkv_t.bm, std::min(L, (t.tm + 1) * qkv_t.bm), 0, D});
  });
  PrefillAttentionTensorIds ids;
  ids.q = ids.k = ids.v = g.qkv;
  ids.q_col = 0, ids.k_col = W, ids.v_col = 2 * W;
  ids.out = g.attn;
  g.op_attention = G.add_prefill_attention("attention", g.attention, cu, {}, prefill_block_m(g.attention, cu, sms),
                                           prefill_block_n(g.attention), ids);
  g.op_o_proj = G.add_gemm("o_proj", g.attn, g.w_o, g.y, Tiling{std::min<int64_t>(128, L), std::min(hpt * D, W), 64, 1, {}});
  return g;
}

Schedule dit_chain_order(const DitAttentionGraph& g, int64_t lag) {
  const TileGraph& G = g.graph;
  const Op &qkv = G.op(g.op_qkv), &att = G.op(g.op_attention), &out = G.op(g.op_o_proj);
  const int64_t heads = att.grid_m, hpt = qkv.tiling.bn / att.tiling.bn;  // heads per QKV column tile
  if (lag < 0) throw InvalidArgument("dit_chain_order: lag " + std::to_string(lag) + " tickets must be >= 0");
  Schedule s;
  s.name = "dit_chain";
  s.order.reserve(size_t(G.num_tiles()));
  std::vector<char> queued(size_t(qkv.grid_n), 0);
  // Head h's items may go once the QKV tiles of the next column group (head h + hpt) are queued and
  // `lag` tickets have gone since its own last QKV tile.
  std::vector<int64_t> due;  // per head queued: the ticket from which its items may go
  int64_t next_items = 0;    // the next head whose items are not queued
  auto items_due = [&](int64_t group_done) {  // heads < group_done have the next group queued
    for (; next_items < std::min<int64_t>(group_done, int64_t(due.size())) &&
           due[size_t(next_items)] <= int64_t(s.order.size());
         ++next_items)
      for (int64_t i = 0; i < att.grid_n; ++i) s.order.push_back(G.tile_id(g.op_attention, next_items, i, 0));
  };
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t which = 0; which < 3; ++which) {  // the column tiles holding head h's q, k, v not queued yet
      const int64_t tn = (which * heads + h) / hpt;
      if (queued[size_t(tn)]) continue;
      queued[size_t(tn)] = 1;
      for (int64_t tm = 0; tm < qkv.grid_m; ++tm) {
        items_due(std::max<int64_t>(0, h - hpt));  // head h's own tiles complete no group yet
        s.order.push_back(G.tile_id(g.op_qkv, tm, tn, 0));
      }
    }
    due.push_back(int64_t(s.order.size()) + lag);
    items_due(h - hpt + 1);
  }
  for (; next_items < heads; ++next_items)
    for (int64_t i = 0; i < att.grid_n; ++i) s.order.push_back(G.tile_id(g.op_attention, next_items, i, 0));
  for (int64_t tm = 0; tm < out.grid_m; ++tm)
    for (int64_t tn = 0; tn < out.grid_n; ++tn) s.order.push_back(G.tile_id(g.op_o_proj, tm, tn, 0));
  validate(G, s);
  return s;
}

}  // namespace tw
