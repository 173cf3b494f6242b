// Bounds and searches: hand-checked optima, brute force on small graphs, and properties on random
// small problems (traffic >= compulsory >= 0, unbounded cache -> compulsory, bounds <= traffic,
// exact <= every named order, heuristic <= the best named order).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/order/bounds.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/order/search.hpp"

using namespace tw;

namespace {

constexpr int64_t kBlock = 512;  // a 16x16 block of 2-byte elements
GemmGraph grid(int64_t gm, int64_t gn) { return build_gemm_graph(16 * gm, 16 * gn, 16, {16, 16, 16, 1}); }
CacheConfig blocks(int64_t n, int p = 1) {
  CacheConfig c;
  c.capacity_bytes = n * kBlock;
  c.in_flight = p;
  return c;
}

// Every order of the graph's tiles that respects dependencies, as (traffic, count of orders with it).
std::pair<int64_t, uint64_t> brute_force(const TileGraph& g, const CacheConfig& c) {
  std::vector<int> order(g.num_tiles());
  std::iota(order.begin(), order.end(), 0);
  int64_t best = std::numeric_limits<int64_t>::max();
  uint64_t count = 0;
  do {
    std::vector<bool> done(g.num_tiles(), false);
    bool ok = true;
    for (int t : order) {
      for (int d : g.tile(t).deps) ok = ok && done[d];
      done[t] = true;
    }
    if (!ok) continue;
    CacheModel m(g, c);
    for (int t : order) m.run_tile(t);
    m.flush();
    const int64_t cost = m.report().dram_total();
    if (cost < best) best = cost, count = 0;
    if (cost == best) ++count;
  } while (std::next_permutation(order.begin(), order.end()));
  return {best, count};
}

// Orders of the 3x3 grid in which every tile shares a row or a column with the one before.
uint64_t rook_paths(int gm, int gn) {
  std::vector<int> cells(gm * gn);
  std::iota(cells.begin(), cells.end(), 0);
  uint64_t n = 0;
  do {
    bool ok = true;
    for (size_t i = 1; i < cells.size() && ok; ++i)
      ok = cells[i] / gn == cells[i - 1] / gn || cells[i] % gn == cells[i - 1] % gn;
    n += ok;
  } while (std::next_permutation(cells.begin(), cells.end()));
  return n;
}

}  // namespace

// 2x2 grid, 3 blocks of cache: after a tile the cache holds C, B, A, so the next tile can hit at most
// one operand, and only if it shares a row or column: the optimum is the 4-cycle (8 orders), 5 reads.
TEST(ExactSearch, TwoByTwoHandChecked) {
  const GemmGraph g = grid(2, 2);
  const ExactResult r = exact_search(g.graph, blocks(3));
  EXPECT_EQ(r.traffic, 5 * kBlock + 4 * kBlock);
  EXPECT_EQ(r.num_optimal, 8u);
  EXPECT_EQ(simulate(g.graph, r.best, blocks(3)).dram_total(), r.traffic);
  // 1 or 2 blocks: nothing is ever reused, all 4! orders are optimal.
  for (int n : {1, 2}) {
    const ExactResult s = exact_search(g.graph, blocks(n));
    EXPECT_EQ(s.traffic, 12 * kBlock);
    EXPECT_EQ(s.num_optimal, 24u);
  }
  // Everything fits: compulsory, every order.
  const ExactResult all = exact_search(g.graph, blocks(100));
  EXPECT_EQ(all.traffic, 8 * kBlock);
  EXPECT_EQ(all.num_optimal, 24u);
}

// 3x3, 3 blocks: 2 misses for the first tile, then at best one per tile: 10 reads; the optimal orders
// are exactly the rook paths through the grid.
TEST(ExactSearch, ThreeByThreeCountsRookPaths) {
  const GemmGraph g = grid(3, 3);
  const ExactResult r = exact_search(g.graph, blocks(3));
  EXPECT_EQ(r.traffic, 10 * kBlock + 9 * kBlock);
  EXPECT_EQ(r.num_optimal, rook_paths(3, 3));
  EXPECT_EQ(simulate(g.graph, r.best, blocks(3)).dram_total(), r.traffic);
}

TEST(ExactSearch, MatchesBruteForce) {
  struct Case {
    const char* what;
    TileGraph g;
    int64_t cache_blocks;
  };
  std::vector<Case> cases;
  for (int64_t n : {2, 3, 4, 5, 6}) cases.push_back({"2x3 grid", grid(2, 3).graph, n});
  for (int64_t n : {3, 5, 8}) cases.push_back({"2x4 grid, K in 2 steps", build_gemm_graph(32, 64, 32, {16, 16, 16, 1}).graph, n});
  for (int64_t n : {2, 4, 6}) cases.push_back({"3x2 grid, edge tiles clipped", build_gemm_graph(40, 32, 16, {16, 16, 16, 1}).graph, n});
  for (int64_t n : {3, 6, 9}) cases.push_back({"split-K", build_gemm_graph(32, 32, 32, {16, 16, 16, 2}).graph, n});
  for (int64_t n : {3, 5, 8})
    cases.push_back({"chain", build_ffn_graph({32, 16, 32, false}, {{16, 16, 16, 1}, {16, 16, 16, 1}}).graph, n});
  for (int64_t n : {4, 8}) cases.push_back({"gated chain", build_ffn_graph({16, 16, 48, true}, {{16, 16, 16, 1}, {16, 16, 16, 1}}).graph, n});
  for (const Case& c : cases) {
    const auto [best, count] = brute_force(c.g, blocks(c.cache_blocks));
    const ExactResult r = exact_search(c.g, blocks(c.cache_blocks));
    EXPECT_EQ(r.traffic, best) << c.what << ", " << c.cache_blocks << " blocks";
    EXPECT_EQ(r.num_optimal, count) << c.what << ", " << c.cache_blocks << " blocks";
    EXPECT_EQ(simulate(c.g, r.best, blocks(c.cache_blocks)).dram_total(), r.traffic) << c.what;
  }
}

TEST(ExactSearch, FourByFourIsTractable) {
  const GemmGraph g = grid(4, 4);
  for (int64_t n : {2, 3, 4, 6, 8, 12, 24}) {
    const ExactResult r = exact_search(g.graph, blocks(n));
    int64_t best_named = std::numeric_limits<int64_t>::max();
    for (const auto& spec : named_orders(g.graph))
      best_named = std::min(best_named, simulate(g.graph, make_order(g.graph, spec), blocks(n)).dram_total());
    EXPECT_LE(r.traffic, best_named) << n << " blocks";
    EXPECT_GE(r.num_optimal, 1u);
    EXPECT_EQ(simulate(g.graph, r.best, blocks(n)).dram_total(), r.traffic);
  }
}

TEST(ExactSearch, RefusesWhatItCannotModel) {
  const GemmGraph g = grid(2, 2);
  EXPECT_THROW(exact_search(g.graph, blocks(3, 2)), InvalidArgument);  // P > 1
  const GemmGraph big = grid(9, 9);
  EXPECT_THROW(exact_search(big.graph, blocks(3)), InvalidArgument);  // 81 tiles
  ExactOptions tight;
  tight.max_states = 10;
  EXPECT_THROW(exact_search(grid(4, 4).graph, blocks(6), tight), InvalidArgument);
}

TEST(Bounds, HandChecked) {
  const GemmGraph g = grid(2, 2);
  const TrafficBounds b = traffic_bounds(g.graph, blocks(3));
  EXPECT_EQ(b.compulsory_read, 4 * kBlock);
  EXPECT_EQ(b.compulsory_write, 4 * kBlock);
  EXPECT_EQ(b.bounds.front().name, "compulsory");
  // 2mnk/sqrt(S) - 2S: 2 * 32 * 32 * 16 / sqrt(16) - 32 = 8160 elements.
  EXPECT_DOUBLE_EQ(gemm_read_lower_bound_elems(32, 32, 16, 16), 8160.0);
  EXPECT_DOUBLE_EQ(gemm_read_lower_bound_elems(32, 32, 16, 1e6), 0.0);
  EXPECT_THROW(gemm_read_lower_bound_elems(1, 1, 1, 0), InvalidArgument);
}

TEST(Bounds, PebbleBoundBitesOnLargeGemmsWithSmallCaches) {
  const GemmGraph g = build_gemm_graph(4096, 4096, 4096, {128, 128, 64, 1});
  CacheConfig c;
  c.capacity_bytes = 1 << 20;
  c.in_flight = 4;
  const TrafficBounds b = traffic_bounds(g.graph, c);
  EXPECT_GT(b.best(), b.compulsory());
  EXPECT_LE(b.best(), simulate(g.graph, make_order(g.graph, "hilbert"), c).dram_total());
}

// Random small problems: GEMMs, split-K GEMMs and chains with odd sizes, caches and P.
TEST(Properties, RandomSmallProblems) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int iter = 0; iter < 60; ++iter) {
    TileGraph g;
    const int64_t bm = 8 * pick(1, 3), bn = 8 * pick(1, 3), bk = 8 * pick(1, 2);
    const int kind = iter % 3;
    if (kind == 0) {
      g = build_gemm_graph(pick(1, 70), pick(1, 70), pick(1, 50), {bm, bn, bk, 1}, 2).graph;
    } else if (kind == 1) {
      const int64_t k = 64 + pick(0, 40);
      g = build_gemm_graph(pick(1, 40), pick(1, 40), k, {bm, bn, 16, pick(1, 3)}).graph;
    } else {
      g = build_ffn_graph({pick(1, 40), pick(8, 48), pick(8, 64), iter % 2 == 0}, {{bm, bn, bk, 1}, {bm, bn, bk, 1}}).graph;
    }
    CacheConfig c;
    c.capacity_bytes = 32 * pick(1, 200);
    c.line_bytes = 32;
    c.in_flight = pick(1, 6);
    c.sets = pick(0, 3) == 0 && c.capacity_bytes >= 64 ? 2 : 1;
    if (kind != 1) {  // without split-K every read byte a tile asks for is one of its regions' bytes
      CacheConfig exact_bytes = c;
      exact_bytes.line_bytes = 2;
      exact_bytes.sets = 1;
      int64_t region_bytes = 0;
      for (const Tile& t : g.tiles())
        for (const Region& r : t.reads) region_bytes += g.bytes(r);
      EXPECT_EQ(simulate(g, op_by_op_order(g), exact_bytes).requested_bytes, region_bytes) << "iter " << iter;
    }
    const TrafficBounds b = traffic_bounds(g, c);
    ASSERT_GE(b.compulsory_read, 0);
    ASSERT_GE(b.compulsory_write, 0);
    CacheConfig unbounded = c;
    unbounded.capacity_bytes = int64_t{1} << 40;
    int64_t best_named = std::numeric_limits<int64_t>::max();
    for (const auto& spec : named_orders(g)) {
      const Schedule s = make_order(g, spec);
      ASSERT_NO_THROW(validate(g, s));
      const TrafficReport r = simulate(g, s, c);
      EXPECT_GE(r.dram_total(), b.compulsory()) << spec << " iter " << iter;
      EXPECT_GE(r.dram_total(), b.best()) << spec << " iter " << iter;
      EXPECT_GE(r.hit_rate(), 0.0);
      EXPECT_LE(r.hit_rate(), 1.0);
      EXPECT_EQ(simulate(g, s, unbounded).dram_total(), b.compulsory()) << spec << " iter " << iter;
      best_named = std::min(best_named, r.dram_total());
    }
    if (g.num_tiles() <= 9) {
      CacheConfig one = c;
      one.in_flight = 1;
      one.sets = 1;
      const ExactResult e = exact_search(g, one);
      for (const auto& spec : named_orders(g))
        EXPECT_LE(e.traffic, simulate(g, make_order(g, spec), one).dram_total()) << spec << " iter " << iter;
      EXPECT_GE(e.traffic, traffic_bounds(g, one).best());
    }
    HeuristicOptions h;
    h.time_limit_s = 0;
    h.max_evaluations = 40;
    const HeuristicResult hr = heuristic_search(g, c, h);
    EXPECT_LE(hr.traffic, best_named);
    EXPECT_EQ(simulate(g, hr.best, c).dram_total(), hr.traffic);
  }
}

TEST(HeuristicSearch, ImprovesOnAGridWhereNamedOrdersAreNotOptimal) {
  const GemmGraph g = grid(4, 4);
  const CacheConfig c = blocks(6);  // swizzle:2 is the best named order; the optimum is 1 block less
  HeuristicOptions o;
  o.time_limit_s = 0;
  o.max_evaluations = 3000;
  const HeuristicResult h = heuristic_search(g.graph, c, o);
  const ExactResult e = exact_search(g.graph, c);
  EXPECT_LE(h.traffic, h.seed_traffic);
  EXPECT_GE(h.traffic, e.traffic);
  EXPECT_LT(h.traffic, h.seed_traffic);  // the named orders miss the optimum here; the search finds better
}
