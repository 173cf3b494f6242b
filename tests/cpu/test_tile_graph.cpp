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
