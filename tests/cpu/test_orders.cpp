// Named orders, chain orders and custom JSON orders.
#include <gtest/gtest.h>

#include <set>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/order/orders.hpp"

using namespace tw;

namespace {
std::vector<std::pair<int64_t, int64_t>> pairs(const std::vector<Cell>& cells) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Cell& c : cells) out.push_back({c.tm, c.tn});
  return out;
}
using P = std::vector<std::pair<int64_t, int64_t>>;
}  // namespace

TEST(GridOrder, HandChecked) {
  EXPECT_EQ(pairs(grid_order("row_major", 2, 3)), (P{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {1, 1}, {1, 2}}));
  EXPECT_EQ(pairs(grid_order("col_major", 2, 2)), (P{{0, 0}, {1, 0}, {0, 1}, {1, 1}}));
  EXPECT_EQ(pairs(grid_order("snake", 2, 3)), (P{{0, 0}, {0, 1}, {0, 2}, {1, 2}, {1, 1}, {1, 0}}));
  // CUTLASS swizzle<2> on 2x3: bands of two columns, row by row; the last band is one column wide.
  EXPECT_EQ(pairs(grid_order("swizzle:2", 2, 3)), (P{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {0, 2}, {1, 2}}));
  // Triton GROUP_M=2 on 3x2: rows 0-1 column by column, then the one-row group.
  EXPECT_EQ(pairs(grid_order("grouped:2", 3, 2)), (P{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {2, 0}, {2, 1}}));
  EXPECT_EQ(pairs(grid_order("morton", 2, 2)), (P{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  EXPECT_EQ(pairs(grid_order("hilbert", 2, 2)), (P{{0, 0}, {1, 0}, {1, 1}, {0, 1}}));
}

TEST(GridOrder, EveryOrderIsAPermutationOnOddShapes) {
  std::vector<std::string> specs;
  for (const auto& o : order_catalog())
    if (!o.chain_only) specs.push_back(o.spec);
  specs.push_back("swizzle:3");
  specs.push_back("grouped:5");
  for (const auto& spec : specs)
    for (int64_t m : {1, 2, 3, 5, 7, 16})
      for (int64_t n : {1, 3, 4, 9, 17}) {
        const auto cells = grid_order(spec, m, n);
        std::set<std::pair<int64_t, int64_t>> seen;
        for (const Cell& c : cells) {
          EXPECT_TRUE(c.tm >= 0 && c.tm < m && c.tn >= 0 && c.tn < n) << spec;
          seen.insert({c.tm, c.tn});
        }
        EXPECT_EQ(cells.size(), size_t(m * n)) << spec << " " << m << "x" << n;
        EXPECT_EQ(seen.size(), size_t(m * n)) << spec << " " << m << "x" << n;
      }
}

// The generalized Hilbert curve moves to a neighbour at every step (at most one diagonal step).
TEST(GridOrder, HilbertIsContinuousOnAnyShape) {
  for (int64_t m = 1; m <= 12; ++m)
    for (int64_t n = 1; n <= 12; ++n) {
      const auto c = grid_order("hilbert", m, n);
      int diagonal = 0;
      for (size_t i = 1; i < c.size(); ++i) {
        const int64_t dm = std::abs(c[i].tm - c[i - 1].tm), dn = std::abs(c[i].tn - c[i - 1].tn);
        ASSERT_LE(std::max(dm, dn), 1) << m << "x" << n << " step " << i;
        diagonal += dm + dn == 2;
      }
      EXPECT_LE(diagonal, 1) << m << "x" << n;
    }
}

TEST(MakeOrder, EveryNamedOrderIsValidOnGemmAndChains) {
  const GemmGraph gemm = build_gemm_graph(100, 300, 64, {32, 64, 32, 2});
  const FfnGraph gated = build_ffn_graph({70, 96, 160, true}, {{32, 32, 32, 1}, {32, 32, 32, 2}});
  const FfnGraph plain = build_ffn_graph({64, 64, 128, false}, {{16, 32, 16, 1}, {32, 16, 16, 1}});
  for (const TileGraph* g : {&gemm.graph, &gated.graph, &plain.graph})
    for (const auto& spec : named_orders(*g)) {
      const Schedule s = make_order(*g, spec);
      EXPECT_NO_THROW(validate(*g, s)) << spec;
      std::vector<int> sorted = s.order;
      std::sort(sorted.begin(), sorted.end());
      for (int i = 0; i < g->num_tiles(); ++i) ASSERT_EQ(sorted[i], i) << spec;
    }
  EXPECT_EQ(named_orders(gemm.graph).size() + 5, named_orders(gated.graph).size());
  const Schedule lagged = make_order(gated.graph, "dataflow:3/hilbert");
  EXPECT_NO_THROW(validate(gated.graph, lagged));
  EXPECT_EQ(lagged.name, "dataflow:3/hilbert");
  EXPECT_THROW(make_order(gated.graph, "dataflow/"), InvalidArgument);
  EXPECT_THROW(make_order(gated.graph, "dataflow:x/row_major"), InvalidArgument);
  EXPECT_THROW(make_order(gated.graph, "dataflows/row_major"), InvalidArgument);
}

TEST(MakeOrder, KSlicesPutsSplitSlicesOutermost) {
  // GEMM1 has 2 column tiles x 2 slices: kslices/col_major = both slice-0 tiles, then slice 1.
  const FfnGraph f = build_ffn_graph({16, 32, 64, false}, {{16, 16, 16, 1}, {16, 16, 16, 2}});
  const auto& g = f.graph;
  const Schedule s = make_order(g, "kslices/col_major");
  EXPECT_EQ(s.name, "kslices/col_major");
  const int n0 = g.op(0).num_tiles;
  ASSERT_EQ(s.order.size(), size_t(n0 + 4));
  for (int i = 0; i < n0; ++i) EXPECT_EQ(g.tile(s.order[i]).op, 0);
  const std::vector<int> tail(s.order.begin() + n0, s.order.end());
  EXPECT_EQ(tail, (std::vector<int>{g.tile_id(1, 0, 0, 0), g.tile_id(1, 0, 1, 0), g.tile_id(1, 0, 0, 1),
                                    g.tile_id(1, 0, 1, 1)}));
  EXPECT_NO_THROW(make_order(g, "dataflow/kslices/col_major"));
  // An order that interleaves the ops comes out op by op.
  EXPECT_EQ(make_order(g, "kslices/chain_rows:1").order, s.order);
  EXPECT_THROW(make_order(g, "kslices/"), InvalidArgument);
}

TEST(MakeOrder, ChainRowsInterleaveRowBlocks) {
  // 2 row blocks; GEMM0 has 2x2 tiles, GEMM1 2x1 tiles. chain_rows:1 = row 0 of GEMM0, the GEMM1
  // tile of row 0, row 1 of GEMM0, the GEMM1 tile of row 1.
  const FfnGraph f = build_ffn_graph({32, 16, 32, false}, {{16, 16, 16, 1}, {16, 16, 16, 1}});
  const auto& g = f.graph;
  const Schedule s = make_order(g, "chain_rows:1");
  const std::vector<int> want = {g.tile_id(0, 0, 0), g.tile_id(0, 0, 1), g.tile_id(1, 0, 0),
                                 g.tile_id(0, 1, 0), g.tile_id(0, 1, 1), g.tile_id(1, 1, 0)};
  EXPECT_EQ(s.order, want);
  const Schedule op_by_op = make_order(g, "row_major");
  EXPECT_EQ(op_by_op.order, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  // Half rows with split-K on GEMM1: each half of a GEMM0 row feeds one K slice.
  const FfnGraph h = build_ffn_graph({16, 16, 64, false}, {{16, 16, 16, 1}, {16, 16, 16, 2}});
  const Schedule half = make_order(h.graph, "chain_half_rows");
  const auto& hg = h.graph;
  EXPECT_EQ(half.order, (std::vector<int>{hg.tile_id(0, 0, 0), hg.tile_id(0, 0, 1), hg.tile_id(1, 0, 0, 0),
                                          hg.tile_id(0, 0, 2), hg.tile_id(0, 0, 3), hg.tile_id(1, 0, 0, 1)}));
}

TEST(MakeOrder, OneGridOrderPerOp) {
  const FfnGraph f = build_ffn_graph({32, 32, 32, false}, {{16, 16, 16, 1}, {16, 16, 16, 1}});
  const auto& g = f.graph;
  const Schedule s = make_order(g, "col_major+row_major");
  EXPECT_EQ(s.order, (std::vector<int>{0, 2, 1, 3, 4, 5, 6, 7}));
  EXPECT_THROW(make_order(g, "col_major+row_major+snake"), InvalidArgument);
  EXPECT_THROW(make_order(g, "col_major+zigzag"), InvalidArgument);
}

TEST(MakeOrder, UnknownSpecsAreNamed) {
  const GemmGraph g = build_gemm_graph(64, 64, 64, {16, 16, 16, 1});
  for (const std::string bad : {"zigzag", "swizzle:0", "grouped:x", "row_major:3", "hilbert:", "chain_rows:1"}) {
    try {
      make_order(g.graph, bad);
      FAIL() << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(bad.substr(0, bad.find(':'))), std::string::npos) << e.what();
    }
  }
}

TEST(CustomOrder, JsonRoundTripAndErrors) {
  const FfnGraph f = build_ffn_graph({32, 16, 32, false}, {{16, 16, 16, 1}, {16, 16, 16, 1}});
  const auto& g = f.graph;
  const Schedule s = make_order(g, "chain_rows:1");
  const Schedule back = schedule_from_json(g, schedule_to_json(g, s));
  EXPECT_EQ(back.order, s.order);
  EXPECT_EQ(back.name, "chain_rows:1");
  EXPECT_EQ(schedule_from_json(g, "[0, 1, 2, 3, 4, 5]").order.size(), 6u);

  auto message = [&](const std::string& text) {
    try {
      schedule_from_json(g, text);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("[0, 1, 2").find("malformed JSON"), std::string::npos);
  EXPECT_NE(message("{\"order\": 3}").find("must be a list"), std::string::npos);
  EXPECT_NE(message("[0, 1, 2, 3, 4, 9]").find("9"), std::string::npos);
  EXPECT_NE(message("[0, 0, 1, 2, 3, 4]").find("tile 0 appears twice"), std::string::npos);
  EXPECT_NE(message("[[0, 5, 0], 1, 2, 3, 4, 5]").find("outside op"), std::string::npos);
  EXPECT_NE(message("[0, \"x\"]").find("entry 1"), std::string::npos);
  // GEMM1's tile 4 reads row 0 of h, written by tiles 0 and 1: running it first names it.
  const std::string dep = message("[4, 0, 1, 2, 3, 5]");
  EXPECT_NE(dep.find("tile 4"), std::string::npos) << dep;
  EXPECT_NE(dep.find("dependency tile 0"), std::string::npos) << dep;
  EXPECT_THROW(load_order_file(g, "/nonexistent/order.json"), InvalidArgument);
}
