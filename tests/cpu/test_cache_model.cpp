// The cache/traffic model on hand-computed tiny cases, and its API for the explorer.
#include <gtest/gtest.h>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/order/orders.hpp"

using namespace tw;

namespace {

// 16x16 tiles over K = 16 (one K-step) with 2-byte elements: every A, B and C block is 512 B.
constexpr int64_t kBlock = 512;
GemmGraph grid(int64_t gm, int64_t gn) { return build_gemm_graph(16 * gm, 16 * gn, 16, {16, 16, 16, 1}); }

CacheConfig blocks(int64_t n, int p = 1) {
  CacheConfig c;
  c.capacity_bytes = n * kBlock;
  c.line_bytes = 32;
  c.in_flight = p;
  return c;
}

Schedule cells(const GemmGraph& g, std::initializer_list<std::pair<int, int>> list) {
  Schedule s{"hand", {}, {}};
  for (auto [m, n] : list) s.order.push_back(g.graph.tile_id(g.op, m, n));
  return s;
}

}  // namespace

// A tile reads A_i, then B_j, then writes C_ij (write-allocate, dirty until evicted or flushed).
// 2x2 row-major with 1 or 2 blocks of cache: every read misses (the C write evicts the operands).
TEST(CacheModel, TwoByTwoRowMajorTinyCacheMissesEverything) {
  const GemmGraph g = grid(2, 2);
  for (int n : {1, 2}) {
    const TrafficReport r = simulate(g.graph, make_order(g.graph, "row_major"), blocks(n));
    EXPECT_EQ(r.dram_read, 8 * kBlock) << n << " blocks";
    EXPECT_EQ(r.dram_write, 4 * kBlock) << n << " blocks";
    EXPECT_EQ(r.hit_bytes, 0);
  }
}

// 3 blocks: row-major keeps A_i across a row (6 misses); the snake also keeps B_1 across the turn (5).
TEST(CacheModel, TwoByTwoThreeBlocks) {
  const GemmGraph g = grid(2, 2);
  const TrafficReport row = simulate(g.graph, cells(g, {{0, 0}, {0, 1}, {1, 0}, {1, 1}}), blocks(3));
  EXPECT_EQ(row.dram_read, 6 * kBlock);
  EXPECT_EQ(row.hit_bytes, 2 * kBlock);
  const TrafficReport snake = simulate(g.graph, make_order(g.graph, "snake"), blocks(3));
  EXPECT_EQ(snake.dram_read, 5 * kBlock);
  EXPECT_EQ(snake.dram_write, 4 * kBlock);
  EXPECT_DOUBLE_EQ(snake.hit_rate(), 3.0 / 8.0);
}

// 3x3 with 3 blocks: row-major 4 + 4 + 4 misses; the snake 4 + 3 + 3.
TEST(CacheModel, ThreeByThreeThreeBlocks) {
  const GemmGraph g = grid(3, 3);
  EXPECT_EQ(simulate(g.graph, make_order(g.graph, "row_major"), blocks(3)).dram_read, 12 * kBlock);
  EXPECT_EQ(simulate(g.graph, make_order(g.graph, "snake"), blocks(3)).dram_read, 10 * kBlock);
  // column-major is row-major transposed: the same count.
  EXPECT_EQ(simulate(g.graph, make_order(g.graph, "col_major"), blocks(3)).dram_read, 12 * kBlock);
}

// Two tiles in flight interleave their K-steps: with K = 2 steps, tiles (0,0) and (0,1) read
// A.k0 B0.k0 | A.k0 B1.k0 | A.k1 B0.k1 C0 | A.k1 B1.k1 C1: the second read of each A block hits.
TEST(CacheModel, TilesInFlightShareOperands) {
  const GemmGraph g = build_gemm_graph(16, 32, 32, {16, 16, 16, 1});
  CacheConfig c = blocks(3, 2);
  const TrafficReport r = simulate(g.graph, make_order(g.graph, "row_major"), c);
  EXPECT_EQ(r.hit_bytes, 2 * kBlock);
  EXPECT_EQ(r.dram_read, 6 * kBlock);  // A (2 blocks) and B (4 blocks) once each
  // One at a time: the first tile's A blocks are gone (its B.k1 and C evicted them) when the second starts.
  c.in_flight = 1;
  EXPECT_EQ(simulate(g.graph, make_order(g.graph, "row_major"), c).dram_read, 8 * kBlock);
}

TEST(CacheModel, LinesRoundBlockRows) {
  // 3 columns of 2 bytes = 6 bytes per row: each row costs one 32-byte line.
  const GemmGraph g = build_gemm_graph(4, 4, 3, {4, 4, 3, 1});
  CacheModel m(g.graph, blocks(100));
  EXPECT_EQ(m.block_bytes(BlockRef{g.a, 0, 0}), 4 * 32);
  CacheConfig c = blocks(100);
  c.line_bytes = 2;
  CacheModel exact(g.graph, c);
  EXPECT_EQ(exact.block_bytes(BlockRef{g.a, 0, 0}), 4 * 6);
}

TEST(CacheModel, StepByStepApiForTheExplorer) {
  const GemmGraph g = grid(2, 2);
  CacheModel m(g.graph, blocks(3));
  const TileResult first = m.run_tile(g.graph.tile_id(g.op, 0, 0));
  EXPECT_EQ(first.dram_read, 2 * kBlock);
  EXPECT_EQ(first.requested_bytes, 2 * kBlock);
  auto res = m.resident();
  ASSERT_EQ(res.size(), 3u);  // most recent first: C00 (dirty), B0, A0
  EXPECT_EQ(res[0].block.tensor, g.c);
  EXPECT_TRUE(res[0].dirty);
  EXPECT_EQ(res[1].block.tensor, g.b);
  EXPECT_EQ(res[2].block.tensor, g.a);
  EXPECT_EQ(m.resident_bytes(), 3 * kBlock);

  CacheModel snapshot = m;  // undo = keep a copy
  const TileResult second = m.run_tile(g.graph.tile_id(g.op, 0, 1));
  EXPECT_EQ(second.hit_bytes, kBlock);
  EXPECT_EQ(second.dram_read, kBlock);
  EXPECT_EQ(second.dram_write, kBlock);  // C00 evicted dirty
  EXPECT_EQ(snapshot.report().dram_read, 2 * kBlock);
  EXPECT_EQ(m.report().dram_read, 3 * kBlock);
  m.reset();
  EXPECT_EQ(m.report().dram_total(), 0);
  EXPECT_TRUE(m.resident().empty());
  EXPECT_THROW(m.run_tile(99), InvalidArgument);
}

TEST(CacheModel, RunConcurrentMatchesSimulate) {
  const GemmGraph g = build_gemm_graph(48, 64, 64, {16, 16, 16, 1});
  CacheConfig c = blocks(5, 4);
  const Schedule s = make_order(g.graph, "hilbert");
  CacheModel m(g.graph, c);
  for (size_t i = 0; i < s.order.size(); i += 4)
    m.run_concurrent({s.order.begin() + i, s.order.begin() + std::min(s.order.size(), i + 4)});
  m.flush();
  // Equal step counts: the sliding window of simulate() runs the same waves.
  EXPECT_EQ(m.report().dram_total(), simulate(g.graph, s, c).dram_total());
}

TEST(CacheModel, SplitKAccumulatesInTheCache) {
  // 1x1 output block, K split in 2. Each slice adds into one 16x16 fp32 accumulator (1 KiB): the
  // first add fills it from DRAM, the second hits; the last slice reads the sums (hit), writes C and
  // zeroes the accumulator, which is written back once at the end.
  const GemmGraph g = build_gemm_graph(16, 16, 32, {16, 16, 16, 2});
  const int ws = g.graph.op(g.op).workspace;
  const TrafficReport r = simulate(g.graph, make_order(g.graph, "row_major"), blocks(1000));
  EXPECT_EQ(r.dram_read, 4 * kBlock + 2 * kBlock);  // A and B (two K slices each) + one accumulator fill
  EXPECT_EQ(r.dram_write, kBlock + 2 * kBlock);     // C once + the accumulator once
  EXPECT_EQ(r.per_tensor[g.c].dram_write, kBlock);
  EXPECT_EQ(r.per_tensor[ws].hit_bytes, 2 * 2 * kBlock);  // second add + the final read
}

TEST(CacheModel, PerTensorAddsUp) {
  const FfnGraph f = build_ffn_graph({32, 64, 96, true}, {{16, 32, 16, 1}, {16, 32, 16, 2}});
  CacheConfig c = blocks(8, 3);
  const TrafficReport r = simulate(f.graph, make_order(f.graph, "chain_rows:1"), c);
  int64_t read = 0, write = 0, hit = 0;
  for (const auto& t : r.per_tensor) read += t.dram_read, write += t.dram_write, hit += t.hit_bytes;
  EXPECT_EQ(read, r.dram_read);
  EXPECT_EQ(write, r.dram_write);
  EXPECT_EQ(hit, r.hit_bytes);
  EXPECT_GT(r.per_tensor[f.h].hit_bytes, 0);  // the chain order finds h in the cache
}

TEST(CacheModel, TraceRecordsEveryTile) {
  const GemmGraph g = grid(2, 3);
  CacheConfig c = blocks(4, 2);
  c.trace = c.trace_resident = true;
  const TrafficReport r = simulate(g.graph, make_order(g.graph, "snake"), c);
  ASSERT_EQ(r.trace.size(), 6u);
  EXPECT_LE(r.trace.back().dram_read, r.dram_read);
  for (size_t i = 1; i < r.trace.size(); ++i) EXPECT_GE(r.trace[i].dram_read, r.trace[i - 1].dram_read);
  EXPECT_FALSE(r.trace[0].resident.empty());
}

TEST(CacheModel, SetAssociativeNeverBeatsCompulsory) {
  const GemmGraph g = build_gemm_graph(128, 128, 64, {16, 16, 16, 1});
  CacheConfig c = blocks(16);
  const int64_t full = simulate(g.graph, make_order(g.graph, "hilbert"), c).dram_total();
  c.sets = 4;
  const int64_t sets = simulate(g.graph, make_order(g.graph, "hilbert"), c).dram_total();
  c.capacity_bytes = int64_t{1} << 40;
  const int64_t compulsory = simulate(g.graph, make_order(g.graph, "hilbert"), c).dram_total();
  EXPECT_GE(full, compulsory);
  EXPECT_GE(sets, compulsory);
  EXPECT_NE(full, sets);  // the partitions do change the outcome here
}

TEST(CacheModel, BadConfigIsNamed) {
  const GemmGraph g = grid(2, 2);
  CacheConfig c;
  c.capacity_bytes = 16;  // smaller than a 32-byte line
  try {
    CacheModel m(g.graph, c);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos);
  }
  c = CacheConfig{};
  c.in_flight = 0;
  EXPECT_THROW(CacheModel(g.graph, c), InvalidArgument);
  c = CacheConfig{};
  c.line_bytes = -1;
  EXPECT_THROW(CacheModel(g.graph, c), InvalidArgument);
}

// The figure in docs/model.md: 16384x16384x8192, 128x128x64 tiles, P = 132 on one core.
TEST(CacheModel, BigGemmIsFast) {
  const GemmGraph g = build_gemm_graph(16384, 16384, 8192, {128, 128, 64, 1});
  CacheConfig c;
  c.in_flight = 132;
  const Schedule s = make_order(g.graph, "grouped:8");
  const auto t0 = std::chrono::steady_clock::now();
  const TrafficReport r = simulate(g.graph, s, c);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("simulated 16384x16384x8192 (16384 tiles x 128 K-steps, P = 132) in %.3f s\n", sec);
  EXPECT_GT(r.dram_total(), 0);
  EXPECT_LT(sec, 3.0);  // < 1 s on an idle core (docs/model.md); slack for a loaded CI machine
}
