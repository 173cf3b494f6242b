// The attention half of a DiT block as a tile graph (graph/dit_graph.hpp): tiles, the epilogue's
// extra reads, the dependencies that replace kernel boundaries, bad sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tileweave/graph/dit_graph.hpp"
#include "tileweave/model/prefill_traffic.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/runtime/exec_plan.hpp"

namespace tw {
namespace {

TEST(DitGraph, TilesAndDependencies) {
  DitAttentionShape s;
  s.tokens = 1000;  // 8 row tiles of 128 (the last 104 rows)
  s.heads = 4;
  const DitAttentionGraph g = build_dit_attention_graph(s, 132);
  const TileGraph& G = g.graph;
  ASSERT_EQ(G.ops().size(), 3u);
  const Op& qkv = G.op(g.op_qkv);
  const Op& att = G.op(g.op_attention);
  const Op& out = G.op(g.op_o_proj);
  EXPECT_EQ(qkv.grid_m, 8);
  EXPECT_EQ(qkv.grid_n, 6);  // q, k, v of 4 heads: a column tile per two heads
  EXPECT_EQ(att.kind, OpKind::PrefillAttention);
  EXPECT_EQ(att.num_tiles, 8 * 4);  // 128-row items x heads
  EXPECT_EQ(out.num_tiles, 8 * 2);  // 1000 x 512 in 128 x 256
  for (int id = qkv.first_tile; id < qkv.first_tile + qkv.num_tiles; ++id) {
    const Tile& t = G.tile(id);
    const bool norm_rope = t.tn < s.heads;  // tiles of q and k heads read the norm weights and RoPE rows
    const auto reads_tensor = [&](int tensor) {
      return std::any_of(t.reads.begin(), t.reads.end(), [&](const Region& r) { return r.tensor == tensor; });
    };
    EXPECT_EQ(reads_tensor(g.qk_norm), norm_rope) << "tile " << t.tm << "," << t.tn;
    EXPECT_EQ(reads_tensor(g.rope), norm_rope) << "tile " << t.tm << "," << t.tn;
  }
  // The attention's order grid is (head, item), numbered as tile_id expects: the named orders then
  // mean what they say (row-major is the kernel's order, head by head).
  EXPECT_EQ(att.grid_m, s.heads);
  for (int64_t h = 0; h < att.grid_m; ++h)
    for (int64_t i = 0; i < att.grid_n; ++i) {
      const Tile& t = G.tile(G.tile_id(g.op_attention, h, i));
      EXPECT_EQ(t.tm, h);
      EXPECT_EQ(t.tn, i);
    }
  // An attention item waits for its Q tile of the head and every K and V row tile of the head:
  // 1 + 8 + 8 QKV tiles; nothing else.
  for (int id = att.first_tile; id < att.first_tile + att.num_tiles; ++id) {
    const Tile& t = G.tile(id);
    ASSERT_EQ(t.deps.size(), 17u) << "head " << t.tm << ", item " << t.tn;
    for (int d : t.deps) EXPECT_EQ(G.tile(d).op, g.op_qkv);
    int q = 0, k = 0, v = 0;
    for (int d : t.deps) {
      const int64_t col = G.tile(d).tn;  // two heads a tile
      q += col == t.tm / 2, k += col == (s.heads + t.tm) / 2, v += col == (2 * s.heads + t.tm) / 2;
    }
    EXPECT_EQ(q, 1);
    EXPECT_EQ(k, 8);
    EXPECT_EQ(v, 8);
  }
  // An o_proj tile waits for the attention items of its rows, every head.
  for (int id = out.first_tile; id < out.first_tile + out.num_tiles; ++id) {
    const Tile& t = G.tile(id);
    ASSERT_EQ(t.deps.size(), 4u);
    for (int d : t.deps) EXPECT_EQ(G.tile(d).op, g.op_attention);
  }
}

// The executor's tables for the chain (runtime/exec_plan.hpp), what the one executor kernel will run
// for issue 20 item 4: under the Tile policy every dependency is one wait on its producer block's
// counter, so an attention item waits on 17 QKV blocks, an o_proj tile on its rows' items of every
// head, and the QKV tiles on nothing.
TEST(DitGraph, ExecutorTables) {
  DitAttentionShape s;
  s.tokens = 1000;
  s.heads = 4;
  const DitAttentionGraph g = build_dit_attention_graph(s, 132);
  const TileGraph& G = g.graph;
  for (const std::string& order : {"row_major", "hilbert+row_major+hilbert"}) {
    SCOPED_TRACE(order);
    const ExecPlan p = make_exec_plan(G, make_order(G, order));
    ASSERT_EQ(p.order.size(), size_t(G.num_tiles()));
    ASSERT_EQ(p.tiles.size(), size_t(G.num_tiles()));
    for (int id = 0; id < G.num_tiles(); ++id) {
      const DeviceTile& t = p.tiles[id];
      const int waits = t.wait_end - t.wait_begin;
      const int op = G.tile(id).op;
      EXPECT_EQ(waits, op == g.op_qkv ? 0 : op == g.op_attention ? 17 : 4) << "tile " << id;
      for (int w = t.wait_begin; w < t.wait_end; ++w) {
        EXPECT_GE(p.waits[w].counter, 0);
        EXPECT_LT(p.waits[w].counter, p.num_signal_counters);
        EXPECT_EQ(p.waits[w].count, 1u);  // one producer tile per block (no split-K in the chain)
      }
    }
  }
}

// The executor's default order: every tile once, after its producers (validate), the QKV tiles head
// by head (two heads a column tile), each head's attention items together, in head order, as soon as
// both the next column group's QKV tiles are queued and `lag` tickets have gone since the head's own
// last QKV tile (lag 0: right after the next group), the output projection last. An odd head count
// too (a tile holding q of one head and k of another, a last tile half empty); a negative lag is
// refused.
TEST(DitGraph, ChainOrderHeadByHead) {
  for (int heads : {4, 3, 7})
    for (int64_t lag : {0, 7, 40, 132}) {
      SCOPED_TRACE(std::to_string(heads) + " heads, lag " + std::to_string(lag));
      DitAttentionShape s;
      s.tokens = 1000;
      s.heads = heads;
      const DitAttentionGraph g = build_dit_attention_graph(s, 132);
      const TileGraph& G = g.graph;
      const Schedule o = dit_chain_order(g, lag);
      ASSERT_EQ(o.order.size(), size_t(G.num_tiles()));
      std::vector<int> pos(G.num_tiles(), -1);
      for (size_t i = 0; i < o.order.size(); ++i) pos[o.order[i]] = int(i);
      const Op& qkv = G.op(g.op_qkv);
      const int64_t rows = qkv.grid_m, items = G.op(g.op_attention).grid_n;
      EXPECT_EQ(qkv.grid_n, (3 * heads + 1) / 2);
      auto qkv_pos = [&](int64_t col, int64_t tm) { return pos[G.tile_id(g.op_qkv, tm, col / 2, 0)]; };
      auto att = [&](int64_t h, int64_t i) { return pos[G.tile_id(g.op_attention, h, i, 0)]; };
      auto last_of = [&](int64_t h) {  // head h's last QKV tile
        int last = -1;
        for (int64_t which = 0; which < 3; ++which)
          for (int64_t tm = 0; tm < rows; ++tm) last = std::max(last, qkv_pos(which * heads + h, tm));
        return last;
      };
      EXPECT_EQ(qkv_pos(0, 0), 0);  // head 0's q tile first
      int last_qkv = -1;
      for (int64_t tn = 0; tn < qkv.grid_n; ++tn)
        for (int64_t tm = 0; tm < rows; ++tm) last_qkv = std::max(last_qkv, pos[G.tile_id(g.op_qkv, tm, tn, 0)]);
      for (int64_t h = 0; h < heads; ++h) {
        const int own = last_of(h), next_group = h + 2 < heads ? last_of(h + 2) : last_qkv;
        EXPECT_GT(att(h, 0), next_group);  // after the next column group
        if (att(h, 0) < last_qkv) EXPECT_GE(att(h, 0), own + 1 + lag);  // and `lag` tickets later
        // ... and no later than both allow (or the head before's items end).
        const int64_t earliest = std::max<int64_t>({int64_t(next_group) + 1, own + 1 + lag, h > 0 ? att(h - 1, items - 1) + 1 : 0});
        if (earliest <= last_qkv) EXPECT_LE(att(h, 0), earliest + 0) << "head " << h;
        if (lag == 0) EXPECT_EQ(att(h, 0), std::max<int64_t>(next_group + 1, h > 0 ? att(h - 1, items - 1) + 1 : 0));
        if (h > 0) EXPECT_GT(att(h, 0), att(h - 1, items - 1));  // heads in order
        for (int64_t i = 1; i < items; ++i) EXPECT_EQ(att(h, i), att(h, 0) + i);  // a head's items together
      }
      EXPECT_EQ(pos[G.tile_id(g.op_o_proj, 0, 0, 0)], int(qkv.num_tiles + G.op(g.op_attention).num_tiles));
      EXPECT_NO_THROW(make_exec_plan(G, o));
    }
  DitAttentionShape s;
  s.tokens = 300;
  s.heads = 2;
  EXPECT_THROW(dit_chain_order(build_dit_attention_graph(s, 132), -1), InvalidArgument);
}

TEST(DitGraph, CausalItemsReadTheirKeyPrefix) {
  DitAttentionShape s;
  s.tokens = 640;
  s.heads = 2;
  s.causal = true;
  const DitAttentionGraph g = build_dit_attention_graph(s, 132);
  const Op& att = g.graph.op(g.op_attention);
  int64_t min_keys = 1 << 30, max_keys = 0;
  for (int id = att.first_tile; id < att.first_tile + att.num_tiles; ++id) {
    const Tile& t = g.graph.tile(id);
    ASSERT_EQ(t.reads.size(), 3u);  // q, k, v
    min_keys = std::min(min_keys, t.reads[1].rows());
    max_keys = std::max(max_keys, t.reads[1].rows());
  }
  EXPECT_EQ(min_keys, 128);  // the first query tile sees one key tile of 128
  EXPECT_EQ(max_keys, 640);
}

// The replay times an attention item with prefill attention's own model (a fixed cost and a cost per
// key row, no GEMM tile latency): alone, the op takes what predict_prefill_us says less its launch.
TEST(DitGraph, AttentionItemsTimedByThePrefillModel) {
  DitAttentionShape s;
  s.tokens = 4608;
  s.heads = 24;
  const DitAttentionGraph g = build_dit_attention_graph(s, 132);
  TrafficReport r;  // no DRAM bytes: compute only
  for (const Op& o : g.graph.ops()) {
    OpTraffic t;
    t.name = o.name;
    t.tiles = o.num_tiles;
    r.per_op.push_back(t);
  }
  const TimeParams p = time_params(gpu_preset("h200"), 132);
  const TimePrediction t = predict_time(g.graph, make_order(g.graph, "row_major"), r, p);
  const double want = predict_prefill_us(g.attention, {0, int(s.tokens)}, {}, 132, prefill_time_model(g.attention)) -
                      prefill_time_model(g.attention).launch_us;
  EXPECT_NEAR(t.ops[g.op_attention].us, want, 1e-6 * want);
}

TEST(DitGraph, BadSizesNameTheValue) {
  DitAttentionShape s;
  s.tokens = 0;
  EXPECT_THROW(build_dit_attention_graph(s, 132), InvalidArgument);
  s.tokens = 100;
  s.head_dim = 96;
  EXPECT_THROW(build_dit_attention_graph(s, 132), InvalidArgument);
  s.head_dim = 64;
  s.fp8 = true;  // e4m3 attention takes head_dim 128
  EXPECT_THROW(build_dit_attention_graph(s, 132), InvalidArgument);
  s.fp8 = false;
  EXPECT_THROW(build_dit_attention_graph(s, 0), InvalidArgument);
  EXPECT_NO_THROW(build_dit_attention_graph(s, 132));
}

}  // namespace
}  // namespace tw
