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

TEST(TileGraph, BadInputIsNamed) {
  EXPECT_THROW(build_ffn_graph({0, 4096, 14336, true}, {}), InvalidArgument);
  try {
    build_ffn_graph({16, 4096, 14336, true}, {{64, 128, 0, 1}, {64, 128, 64, 1}});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("BK"), std::string::npos);
  }
  EXPECT_THROW(build_ffn_graph({16, 64, 128, true}, {{64, 128, 64, 1}, {64, 128, 64, 3}}), InvalidArgument);
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
