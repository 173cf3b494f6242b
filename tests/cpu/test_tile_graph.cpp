#include <gtest/gtest.h>

#include "tileweave/graph/tile_graph.hpp"

using namespace tw;

TEST(TileGraph, FfnDependenciesFollowOverlap) {
  // gate_up tiles cover 128 columns of h; a down tile with split_k=4 reads a 3584-column slice of h.
  FfnGraph g = build_ffn_graph({16, 4096, 14336, true}, {{64, 128, 64, 1}, {64, 128, 64, 4}});
  const auto& G = g.graph;
  const Op& gu = G.op(g.op_gate_up);
  const Op& dn = G.op(g.op_down);
  EXPECT_EQ(gu.num_tiles, 112);
  EXPECT_EQ(dn.num_tiles, 32 * 4);
  for (int i = dn.first_tile; i < dn.first_tile + dn.num_tiles; ++i) {
    const Tile& t = G.tile(i);
    ASSERT_EQ(t.deps.size(), 28u) << "tile " << i;
    for (int d : t.deps) {
      const Tile& p = G.tile(d);
      EXPECT_EQ(p.op, g.op_gate_up);
      EXPECT_GE(p.tn * 128, t.k0);
      EXPECT_LT(p.tn * 128, t.k1);
    }
  }
  for (int i = gu.first_tile; i < gu.first_tile + gu.num_tiles; ++i) EXPECT_TRUE(G.tile(i).deps.empty());
}

TEST(TileGraph, EdgeTilesAreClipped) {
  FfnGraph g = build_ffn_graph({3, 100, 300, false}, {{64, 64, 32, 1}, {64, 64, 32, 2}});
  const auto& G = g.graph;
  const Tile& last = G.tile(G.op(g.op_gate_up).first_tile + G.op(g.op_gate_up).num_tiles - 1);
  EXPECT_EQ(last.writes[0].rows(), 3);
  EXPECT_EQ(last.writes[0].cols(), 300 - 4 * 64);
  EXPECT_EQ(G.bytes(last.writes[0]), 3 * 44 * 2);
}

TEST(TileGraph, UnevenKSlicesEndShort) {
  // The 8B down GEMM at M <= 16 on 132 SMs: 32 output tiles per slice, so the last 5 slices (one
  // tile per SM) are half the ~2048-column slices before them.
  const std::vector<int64_t> cuts = tail_k_cuts(14336, 128, 2048, 32, 132, 1);
  ASSERT_EQ(cuts.size(), 9u);
  std::vector<int64_t> size;
  for (size_t i = 0; i <= cuts.size(); ++i)
    size.push_back((i < cuts.size() ? cuts[i] : 14336) - (i ? cuts[i - 1] : 0));
  for (size_t i = 0; i < 5; ++i) EXPECT_GE(size[i], 14 * 128) << i;
  for (size_t i = 5; i < size.size(); ++i) EXPECT_EQ(size[i], 8 * 128) << i;
  EXPECT_TRUE(tail_k_cuts(14336, 128, 2048, 32, 132, 0).size() == 6u);  // no tail: 7 even slices
  // Too short for a tail: one slice, no cuts.
  EXPECT_TRUE(tail_k_cuts(256, 128, 2048, 32, 132, 2).empty());

  // The graph cuts tiles at the given columns, and consumers depend on what they read.
  Tiling down{16, 128, 128, int64_t(cuts.size()) + 1, cuts};
  FfnGraph g = build_ffn_graph({16, 4096, 14336, true}, {{16, 64, 128, 1}, down});
  const Op& dn = g.graph.op(g.op_down);
  for (int64_t ks = 0; ks < dn.tiling.split_k; ++ks) {
    const Tile& t = g.graph.tile(g.graph.tile_id(g.op_down, 0, 3, ks));
    EXPECT_EQ(t.k0, dn.k_begin(ks));
    EXPECT_EQ(t.k1 - t.k0, size[ks]);
    EXPECT_EQ(t.deps.size(), size_t(size[ks] / 64)) << "one gate/up tile per 64 columns of h";
  }
  Tiling bad = down;
  bad.k_cuts[2] = bad.k_cuts[1];  // an empty slice
  EXPECT_THROW(build_ffn_graph({16, 4096, 14336, true}, {{16, 64, 128, 1}, bad}), InvalidArgument);
  bad = down;
  bad.k_cuts[0] += 64;  // not a whole BK step
  EXPECT_THROW(build_ffn_graph({16, 4096, 14336, true}, {{16, 64, 128, 1}, bad}), InvalidArgument);
  bad = down;
  bad.k_cuts.pop_back();  // count does not match split_k
  EXPECT_THROW(build_ffn_graph({16, 4096, 14336, true}, {{16, 64, 128, 1}, bad}), InvalidArgument);
}

TEST(TileGraph, BadInputIsNamed) {
  EXPECT_THROW(build_ffn_graph({0, 4096, 14336, true}, {}), InvalidArgument);
  try {
    build_ffn_graph({16, 4096, 14336, true}, {{64, 128, 0, 1}, {64, 128, 64, 1}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("BK"), std::string::npos);
  }
  EXPECT_THROW(build_ffn_graph({16, 64, 128, true}, {{64, 128, 64, 1}, {64, 128, 64, 3}}), InvalidArgument);
  // The plain chain's activation: a gated FFN has its own (SiLU * up); names round-trip.
  FfnShape gated{16, 4096, 14336, true, FfnActivation::GeluTanh};
  try {
    build_ffn_graph(gated, {});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("gelu_tanh"), std::string::npos);
  }
  EXPECT_NO_THROW(build_ffn_graph({16, 4096, 14336, false, FfnActivation::Relu}, {}));
  for (FfnActivation a : {FfnActivation::None, FfnActivation::Relu, FfnActivation::GeluTanh})
    EXPECT_EQ(ffn_activation_from(to_string(a)), a);
  EXPECT_THROW(ffn_activation_from("swish"), InvalidArgument);
}

#include "tileweave/order/orders.hpp"
#include "tileweave/runtime/exec_plan.hpp"

TEST(ExecPlan, WaitsMapToProducerCountersUnderEachPolicy) {
  FfnGraph g = build_ffn_graph({16, 1024, 2816, true}, {{16, 32, 64, 2}, {16, 64, 64, 4}});
  const auto& G = g.graph;
  const Schedule s = op_by_op_order(G);
  const int n_gu = G.op(g.op_gate_up).num_tiles;
  ExecPlan tile = make_exec_plan(G, s);
  ExecPlan row = make_exec_plan(G, s, {{g.op_gate_up, {SyncPolicy::Row, 1}}});
  // Tile sync: one counter per gate/up output block, signalled by its 2 K slices.
  for (int i = n_gu; i < G.num_tiles(); ++i) {
    const DeviceTile& d = tile.tiles[i];
    ASSERT_EQ(size_t(d.wait_end - d.wait_begin), G.tile(i).deps.size() / 2);
    for (int w = d.wait_begin; w < d.wait_end; ++w) EXPECT_EQ(tile.waits[w].count, 2u);
    // Row sync: one wait for the whole (single) row of gate/up tiles.
    const DeviceTile& r = row.tiles[i];
    ASSERT_EQ(r.wait_end - r.wait_begin, 1);
    EXPECT_EQ(row.waits[r.wait_begin].count, uint32_t(n_gu));
  }
  EXPECT_EQ(tile.num_arrive_counters, G.op(g.op_gate_up).grid_m * G.op(g.op_gate_up).grid_n +
                                          G.op(g.op_down).grid_m * G.op(g.op_down).grid_n);
  // Row sync with the dataflow order would wait on later tickets: refused.
  EXPECT_THROW(make_exec_plan(G, dataflow_order(G, s), {{g.op_gate_up, {SyncPolicy::Row, 1}}}), InvalidArgument);
  EXPECT_NO_THROW(make_exec_plan(G, dataflow_order(G, s)));
}

TEST(Schedule, DataflowOrderPutsConsumersRightAfterTheirProducers) {
  FfnGraph g = build_ffn_graph({16, 1024, 2816, true}, {{16, 32, 64, 1}, {16, 64, 64, 4}});
  const auto& G = g.graph;
  const Schedule s = dataflow_order(G, make_order(G, "col_major"));
  validate(G, s);
  std::vector<int> pos(G.num_tiles());
  for (int i = 0; i < G.num_tiles(); ++i) pos[s.order[i]] = i;
  for (int t = 0; t < G.num_tiles(); ++t) {
    if (G.tile(t).deps.empty()) continue;
    int last = -1;
    for (int d : G.tile(t).deps) last = std::max(last, pos[d]);
    EXPECT_GT(pos[t], last);
    // Nothing but other ready consumers sits between the last producer and the consumer.
    for (int i = last + 1; i < pos[t]; ++i) EXPECT_FALSE(G.tile(s.order[i]).deps.empty());
  }
}

TEST(Schedule, DataflowLagKeepsConsumersBehindTheirProducers) {
  FfnGraph g = build_ffn_graph({16, 1024, 2816, true}, {{16, 32, 64, 2}, {16, 64, 64, 4}});
  const auto& G = g.graph;
  for (int lag : {1, 7, 50}) {
    const Schedule s = dataflow_order(G, make_order(G, "col_major"), lag);
    validate(G, s);
    std::vector<int> pos(G.num_tiles());
    for (int i = 0; i < G.num_tiles(); ++i) pos[s.order[i]] = i;
    const int n_producers = G.op(g.op_gate_up).num_tiles;
    for (int t = 0; t < G.num_tiles(); ++t) {
      int last = -1;
      for (int d : G.tile(t).deps) last = std::max(last, pos[d]);
      // Only the tail (after every producer is out) may come closer than the lag.
      if (!G.tile(t).deps.empty() && pos[t] < n_producers) EXPECT_GE(pos[t] - last, lag) << "tile " << t;
    }
  }
  EXPECT_THROW(dataflow_order(G, op_by_op_order(G), -1), InvalidArgument);
}
