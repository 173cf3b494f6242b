// The partitioned L2 model (model/l2_model.hpp) on cases worked out by hand: it reduces to the simple
// model, far copies double a shared block's footprint, whole-line allocation, hashed sets, drift.
#include <gtest/gtest.h>

#include <cmath>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/model/l2_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/order/bounds.hpp"
#include "tileweave/order/orders.hpp"

using namespace tw;

namespace {

// 16x16 tiles, 2-byte elements: every A, B and C block is 512 B (16 rows of 32 B).
constexpr int64_t kBlock = 512;

CacheConfig simple(int64_t blocks, int p) {
  CacheConfig c;
  c.capacity_bytes = blocks * kBlock;
  c.line_bytes = 32;
  c.in_flight = p;
  return c;
}

// The partitioned model with everything that distinguishes it switched off but what `tweak` sets.
CacheConfig partitioned(int64_t blocks, int p, int partitions, bool copies = true) {
  CacheConfig c = simple(blocks, p);
  c.l2 = L2Kind::Partitioned;
  c.part.partitions = partitions;
  c.part.far_copies = copies;
  c.part.line_bytes = 32;  // allocate sectors, as the simple model does
  c.part.ways = 0;         // fully associative
  return c;
}

}  // namespace

// One partition, fully associative, 32-byte allocation and no drift: the LRU stack distance test
// (hit iff the bytes touched since + the block fit) is the simple model's LRU, write-backs included.
TEST(L2Model, OnePartitionIsTheSimpleModel) {
  struct Case {
    GemmGraph g;
    int64_t blocks;
    int p;
  };
  std::vector<Case> cases;
  cases.push_back({build_gemm_graph(48, 48, 16, {16, 16, 16, 1}), 3, 1});
  cases.push_back({build_gemm_graph(16, 32, 32, {16, 16, 16, 1}), 3, 2});   // two tiles share A in lockstep
  cases.push_back({build_gemm_graph(64, 64, 64, {16, 16, 16, 2}), 5, 3});   // split-K: read-modify-writes
  cases.push_back({build_gemm_graph(64, 48, 64, {16, 16, 16, 1}), 7, 4});
  for (const Case& k : cases)
    for (const std::string& order : {"row_major", "col_major", "snake", "hilbert"}) {
      const Schedule s = make_order(k.g.graph, order);
      const TrafficReport a = simulate(k.g.graph, s, simple(k.blocks, k.p));
      const TrafficReport b = simulate(k.g.graph, s, partitioned(k.blocks, k.p, 1));
      EXPECT_EQ(a.dram_read, b.dram_read) << order << " P=" << k.p;
      EXPECT_EQ(a.dram_write, b.dram_write) << order << " P=" << k.p;
      EXPECT_EQ(a.hit_bytes, b.hit_bytes) << order << " P=" << k.p;
      ASSERT_EQ(b.per_op.size(), 1u);
      EXPECT_EQ(b.per_op[0].dram_read, b.dram_read);
      EXPECT_EQ(b.per_op[0].dram_write, b.dram_write);
    }
}

// Two tiles in flight on SMs of different partitions, K in two steps, both reading A:
//   round 0: slot 0 (partition 0) reads A.k0, B0.k0; slot 1 (partition 1) reads A.k0, B1.k0
//   round 1: slot 0 reads A.k1, B0.k1, writes C0;   slot 1 reads A.k1, B1.k1, writes C1
// Every block is two 256-byte halves, one homed in each partition. Slot 1's second read of A.kj finds
// its near half at home in partition 1 (256 B touched since + itself: fits). Its far half is homed in
// partition 0, where slot 0 held A.kj twice over -- the home half and a copy of the other half -- so
// since A.kj.h0 was used, partition 0 saw A.kj's copy, B0's home half and B0's copy (768 B; for A.k1
// the C0 half makes 1024 B). With 3 blocks of L2 (768 B per partition) both far halves miss: 2 x 256
// B more than the 6 blocks the simple model reads. Without copies partition 0 holds 512 B of each
// pair (A.k1: 768 B with C0) and both halves hit. With 4 blocks only A.k1's far half misses; with 5
// nothing does.
TEST(L2Model, FarCopiesDoubleASharedOperandsFootprint) {
  const GemmGraph g = build_gemm_graph(16, 32, 32, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  const int64_t simple_read = 6 * kBlock;
  ASSERT_EQ(simulate(g.graph, s, simple(3, 2)).dram_read, simple_read);

  const TrafficReport three = simulate(g.graph, s, partitioned(3, 2, 2));
  EXPECT_EQ(three.dram_read, simple_read + 2 * 256);
  EXPECT_EQ(three.hit_bytes, 8 * kBlock - three.dram_read);
  EXPECT_EQ(three.dram_write, 2 * kBlock);  // C0, C1 once, at the flush
  EXPECT_EQ(simulate(g.graph, s, partitioned(3, 2, 2, false)).dram_read, simple_read);
  EXPECT_EQ(simulate(g.graph, s, partitioned(4, 2, 2)).dram_read, simple_read + 256);
  EXPECT_EQ(simulate(g.graph, s, partitioned(5, 2, 2)).dram_read, simple_read);
}

// The cache allocates whole 128-byte lines: a 16x16 bf16 block has 32-byte rows, so it holds 16
// lines (2048 B) for 512 B of data. Tiles (0,0), (0,1) one at a time: A0, B0, C0, then A0 again with
// B0 + C0 touched since. With 32-byte allocation that is 1536 B (fits in 4096); with 128-byte lines
// 6144 B, so A0 misses again. DRAM still moves sectors: 512 B per block.
TEST(L2Model, LinesAreAllocatedWhole) {
  const GemmGraph g = build_gemm_graph(16, 32, 16, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(8, 1, 1);  // 4096 B
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock);
  c.part.line_bytes = 128;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 4 * kBlock);
  c.capacity_bytes = 6144;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock);
}

// Hashed sets: a line survives iff fewer than `ways` of the other lines touched since fell into its
// set, P(Poisson(ways * x) <= ways - 1) with x = (bytes since + own) / capacity.
TEST(L2Model, SurvivalOfAHashedSet) {
  EXPECT_DOUBLE_EQ(l2_survival(0.99, 0), 1.0);
  EXPECT_DOUBLE_EQ(l2_survival(1.01, 0), 0.0);
  EXPECT_NEAR(l2_survival(1.0, 1), std::exp(-1.0), 1e-12);
  EXPECT_NEAR(l2_survival(0.5, 2), 2 * std::exp(-1.0), 1e-12);  // lambda = 1: P(0) + P(1)
  // Many ways approach full associativity: a sharp edge at x = 1, about half survive there.
  EXPECT_GT(l2_survival(0.5, 16), 0.99);
  EXPECT_NEAR(l2_survival(1.0, 16), 0.47, 0.01);
  EXPECT_LT(l2_survival(2.0, 16), 0.001);
}

// Tiles (0,0), (0,1) one at a time: A0 is read again after B0 and C0 (1024 B) + itself = 1536 B of a
// 3072-byte cache, x = 1/2. Fully associative it hits; direct-mapped (1 way) it survives with
// probability e^-0.5, so 512 (1 - e^-0.5) = 201.5 B are read again; 2 ways: 512 (1 - 2/e) = 135.3 B.
TEST(L2Model, HashedSetsChargeTheEvictedFraction) {
  const GemmGraph g = build_gemm_graph(16, 32, 16, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(6, 1, 1);
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock);
  c.part.ways = 1;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock + std::llround(kBlock * (1 - std::exp(-0.5))));
  c.part.ways = 2;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock + std::llround(kBlock * (1 - 2 * std::exp(-1.0))));
}

// Set fringe: of the lines (mean lambda) that fell into a set, at most `fringe` fell at random and the
// rest evenly (floor or ceil of their mean). lambda = 5, fringe 3, 3 ways: 2 even, the random part must
// be 0: e^-3; lambda = 5.5: 2 or 3 even, half each: e^-3 / 2; lambda = 7: 4 even, none survives. At
// or below the fringe it is Poisson.
TEST(L2Model, SetFringeSpreadsTheRestEvenly) {
  EXPECT_NEAR(l2_set_count_below(5, 3, 3), std::exp(-3.0), 1e-12);
  EXPECT_NEAR(l2_set_count_below(5.5, 3, 3), 0.5 * std::exp(-3.0), 1e-12);
  EXPECT_DOUBLE_EQ(l2_set_count_below(7, 3, 3), 0.0);
  EXPECT_NEAR(l2_set_count_below(2, 2, 3), 3 * std::exp(-2.0), 1e-12);
  EXPECT_NEAR(l2_set_count_below(5, 3, 0), l2_survival(5.0 / 3, 3), 1e-12) << "fringe 0: Poisson";
  // 16 ways, fringe 3: the cliff at the capacity. x = 1.2 (lambda 19.2: 16.2 even) never survives
  // (Poisson: 20%); x = 1 (13 even): P(Poisson(3) <= 2) = 8.5 e^-3 (Poisson: 47%).
  EXPECT_DOUBLE_EQ(l2_survival(1.2, 16, 3), 0.0);
  EXPECT_NEAR(l2_survival(1.2, 16), 0.20, 0.01);
  EXPECT_NEAR(l2_survival(1.0, 16, 3), 8.5 * std::exp(-3.0), 1e-12);
  // A weight line in one way of room: 4 lines' worth of allocations fell into its set on average, 1
  // of them evenly: none survives (Poisson: e^-4); 2 lines' worth (under the fringe): e^-2 as before.
  EXPECT_DOUBLE_EQ(l2_room_survival(2048, 512, 8192, 8192, 16, 3), 0.0);
  EXPECT_NEAR(l2_room_survival(1024, 512, 8192, 8192, 16, 3), std::exp(-2.0), 1e-12);
}

// The graph of HashedSetsChargeTheEvictedFraction with 2 ways: A0 is read again after B0 and C0 (1536
// B with itself). 2 blocks of cache: x = 1.5, lambda = 3. Poisson: A0 survives P(Poisson(3) <= 1) =
// 4 e^-3; fringe 1: 2 lines even, none survives (A0 read twice: 4 blocks); fringe 2: 1 even and
// P(Poisson(2) = 0) = e^-2. 6 blocks (x = 1/2, lambda = 1 <= fringe 2): Poisson's 2/e as before.
TEST(L2Model, SetFringeSharpensTheCliffAtTheCapacity) {
  const GemmGraph g = build_gemm_graph(16, 32, 16, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(2, 1, 1);
  c.part.ways = 2;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock + std::llround(kBlock * (1 - 4 * std::exp(-3.0))));
  c.part.set_fringe = 1;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 4 * kBlock);
  c.part.set_fringe = 2;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock + std::llround(kBlock * (1 - std::exp(-2.0))));
  c.capacity_bytes = 6 * kBlock;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 3 * kBlock + std::llround(kBlock * (1 - 2 * std::exp(-1.0))));
  c.part.set_fringe = -1;
  EXPECT_THROW(simulate(g.graph, s, c), InvalidArgument);
}

// Two tiles share A over 64 K-steps; the cache holds 3 blocks, enough for the pair in lockstep (A
// read once). When the steps' durations vary, the tiles drift apart and the second reader of each A
// block finds it gone: most of A is read twice.
TEST(L2Model, DriftingTilesLoseSharedOperands) {
  const GemmGraph g = build_gemm_graph(16, 32, 16 * 64, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(3, 2, 1);
  const int64_t lockstep = simulate(g.graph, s, c).dram_read;
  EXPECT_EQ(lockstep, (64 + 128) * kBlock);
  c.part.step_jitter = 0.5;
  const int64_t drift = simulate(g.graph, s, c).dram_read;
  EXPECT_GT(drift, lockstep + 40 * kBlock);
  EXPECT_LE(drift, (128 + 128) * kBlock);
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, drift);  // deterministic for a seed
  c.part.step_jitter = 0;
  c.part.sm_skew = 0.3;  // one SM steadily faster than the other: they drift as well
  EXPECT_GT(simulate(g.graph, s, c).dram_read, lockstep + 40 * kBlock);
}

// A recorded timeline (L2Params::timeline) is replayed as it happened. The two tiles above share A
// over 64 K-steps: in lockstep A is read once ((64 + 128) blocks); one after the other, twice
// ((128 + 128)). Tile 1 one K-step behind tile 0: between tile 0's read of A.k and tile 1's come
// tile 1's step k-1 (A.k-1, B1.k-1), B0.k and tile 0's step k+1 (A.k+1, B0.k+1), 5 blocks: with
// its own block A.k survives in 7 blocks of cache and not in 3 (steps at (k + 0.5) of the span's
// K-steps; at equal times tile 0 first). Drawn jitter is not used. A timeline of the wrong size or
// with a span ending before it begins is refused.
TEST(L2Model, RecordedTimelineIsReplayedAsItHappened) {
  const GemmGraph g = build_gemm_graph(16, 32, 16 * 64, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(3, 2, 1);
  c.part.step_jitter = 0.5;  // ignored with a timeline
  std::vector<TileSpan> t = {{0, 0, 64, 64}, {1, 0, 64, 64}};
  c.part.timeline = &t;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, (64 + 128) * kBlock);
  t = {{0, 0, 64, 64}, {0, 64, 128, 128}};
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, (128 + 128) * kBlock);
  t = {{0, 0, 64, 64}, {1, 1, 65, 65}};
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, (128 + 128) * kBlock);
  c.capacity_bytes = 7 * kBlock;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, (64 + 128) * kBlock);
  t.pop_back();
  EXPECT_THROW(simulate(g.graph, s, c), InvalidArgument);
  t = {{0, 0, 64, 64}, {1, 10, 5, 64}};
  EXPECT_THROW(simulate(g.graph, s, c), InvalidArgument);
}

// With a cache that never fills, every model reads and writes exactly the compulsory bytes, however
// the tiles drift and wherever they run: copies cost space, never DRAM. The FFN chain makes down
// tiles wait for gate/up tiles in the event replay.
TEST(L2Model, UnboundedCacheGivesCompulsoryTraffic) {
  FfnGraph f = build_ffn_graph({64, 256, 512, true}, {{32, 64, 64, 1, {}}, {32, 64, 64, 2, {}}});
  CacheConfig c;
  c.capacity_bytes = int64_t{1} << 30;
  c.in_flight = 8;
  c.l2 = L2Kind::Partitioned;
  c.part.step_jitter = 0.3;
  c.part.sm_skew = 0.2;
  const TrafficBounds b = traffic_bounds(f.graph, c);
  for (const std::string& order : {"row_major", "dataflow/col_major", "chain_rows:1"}) {
    const TrafficReport r = simulate(f.graph, make_order(f.graph, order), c);
    EXPECT_EQ(r.dram_read, b.compulsory_read) << order;
    EXPECT_EQ(r.dram_write, b.compulsory_write) << order;
    ASSERT_EQ(r.per_op.size(), 2u);
    EXPECT_EQ(r.per_op[0].dram_read + r.per_op[1].dram_read, r.dram_read) << order;
    EXPECT_EQ(r.per_op[0].dram_write + r.per_op[1].dram_write, r.dram_write) << order;
  }
}

TEST(L2Model, BadParametersAreNamed) {
  const GemmGraph g = build_gemm_graph(16, 32, 16, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  auto message = [&](CacheConfig c) {
    try {
      simulate(g.graph, s, c);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CacheConfig c = partitioned(8, 1, 3);
  EXPECT_NE(message(c).find("partitions must be 1 or 2, got 3"), std::string::npos) << message(c);
  c = partitioned(8, 1, 2);
  c.part.ways = -1;
  EXPECT_NE(message(c).find("ways -1"), std::string::npos) << message(c);
  c = partitioned(8, 1, 2);
  c.part.step_jitter = 1.5;
  EXPECT_NE(message(c).find("jitter 1.5"), std::string::npos) << message(c);
  c = partitioned(1, 1, 2);
  c.part.ways = 16;
  EXPECT_NE(message(c).find("less than one set"), std::string::npos) << message(c);
  EXPECT_THROW(parse_l2_kind("lru"), InvalidArgument);
  EXPECT_EQ(parse_l2_kind("partitioned"), L2Kind::Partitioned);
}

// Weights read with the evict-first policy (L2Params::evict_first_weights), worked by hand. One
// partition, fully associative, 32-byte lines, P = 1, 16x16x16 tiles (every block 512 B).
// M = 16, N = 32, K = 32, row-major: tile (0,0) reads A0 B00 | A1 B01, writes C0; tile (0,1) reads
// A0 B10 | A1 B11, writes C1. Between the two uses of A0 come A1, C0 (activations, an output) and
// B00, B01 (weights); the same for A1 (C0, A0; B01, B10). With 4 blocks of cache:
// - plain LRU: distance 4 blocks + A0's own = 5 > 4: both A blocks miss again, 8 reads = 4096 B;
// - evict-first weights, push 0: the weights count for nothing, 2 + 1 = 3 <= 4: A0 and A1 hit, 3072 B;
// - push 0.5: 2 + 0.5 x 2 + 1 = 4 <= 4: still hits; push 0.75: 4.5 > 4: misses again (4096 B);
// - push 1: exactly plain LRU.
TEST(L2Model, EvictFirstWeightsDoNotPushActivationsOut) {
  const GemmGraph g = build_gemm_graph(16, 32, 32, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(4, 1, 1);
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, 8 * kBlock);
  c.part.evict_first_weights = true;
  for (const auto& [push, blocks] : std::vector<std::pair<double, int64_t>>{{0.0, 6}, {0.5, 6}, {0.75, 8}, {1.0, 8}}) {
    c.part.weight_push = push;
    const TrafficReport r = simulate(g.graph, s, c);
    EXPECT_EQ(r.dram_read, blocks * kBlock) << "push " << push;
    EXPECT_EQ(r.per_tensor[g.a].dram_read, (blocks - 4) * kBlock) << "push " << push;  // the 4 B blocks miss once each
  }
}

// A weight line is as exposed as under plain LRU: M = 32, N = 16, K = 32, column-major, the two
// tiles share the B panel (B0, B1) and read distinct A blocks. B0's reuse sees A01, B1, C0 and A10 go
// by: it survives with 5 blocks of cache and not with 4, with or without the policy (6 and 8 reads).
TEST(L2Model, EvictFirstWeightsAreAsExposedAsUnderLru) {
  const GemmGraph g = build_gemm_graph(32, 16, 32, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "col_major");
  for (const auto& [blocks, reads] : std::vector<std::pair<int64_t, int64_t>>{{5, 6}, {4, 8}}) {
    CacheConfig c = partitioned(blocks, 1, 1);
    const int64_t lru = simulate(g.graph, s, c).dram_read;
    EXPECT_EQ(lru, reads * kBlock) << blocks << " blocks";
    c.part.evict_first_weights = true;
    c.part.weight_push = 0;
    EXPECT_EQ(simulate(g.graph, s, c).dram_read, lru) << blocks << " blocks";
  }
}

TEST(L2Model, WeightPushIsChecked) {
  const GemmGraph g = build_gemm_graph(16, 32, 32, {16, 16, 16, 1});
  CacheConfig c = partitioned(4, 1, 1);
  c.part.evict_first_weights = true;
  c.part.weight_push = 1.5;
  try {
    simulate(g.graph, make_order(g.graph, "row_major"), c);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("weight push 1.5"), std::string::npos) << e.what();
  }
}

// Evict-first weights in the room the other lines leave (L2EvictFirst::Room), worked by hand. One
// partition, 32-byte lines, P = 1, M = 32, N = 16, K = 32, column-major: tile (0,0) reads A00 B0 | A01
// B1, writes C0; tile (1,0) reads A10 B0 | A11 B1, writes C1. Every block is a first fill (512 B
// allocated) except the weights' second reads.
// - Fully associative, 8 blocks (4096 B): when B0 is read again, the others have held A00 A01 C0 A10
//   (2048 B), leaving 2048 B; A01 B1 C0 A10 were allocated since (2048 B) + B0's own 512 > 2048: it
//   misses. B1: C0 A10 B0 A11 since (2048) + 512 > 4096 - 2560: misses too, 8 blocks read. Plain LRU
//   (push) keeps both (4 blocks since + own = 5 <= 8): 6 blocks.
// - 9 blocks (4608 B): B0 2048 + 512 <= 2560 hits; B1: C0 A10 A11 since (B0 hit: no fill), 1536 + 512
//   <= 4608 - 2560: hits. 6 blocks.
// - 1 way, 4 blocks (64 one-line sets): the room is the one way the line took; it survives iff none
//   of the allocations since fell into its set, e^(-allocated / capacity). B0: 2048 B since, e^-1;
//   B1: C0 A10 A11 + B0's refill 512 (1 - e^-1) since.
TEST(L2Model, EvictFirstWeightsLiveInTheRoomTheOthersLeave) {
  const GemmGraph g = build_gemm_graph(32, 16, 32, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "col_major");
  auto room = [](int64_t blocks, int ways) {
    CacheConfig c = partitioned(blocks, 1, 1);
    c.part.ways = ways;
    c.part.evict_first_weights = true;
    c.part.evict_first = L2EvictFirst::Room;
    return c;
  };
  CacheConfig lru = partitioned(8, 1, 1);
  EXPECT_EQ(simulate(g.graph, s, lru).dram_read, 6 * kBlock);
  TrafficReport r = simulate(g.graph, s, room(8, 0));
  EXPECT_EQ(r.dram_read, 8 * kBlock);
  EXPECT_EQ(r.per_tensor[g.b].dram_read, 4 * kBlock);
  EXPECT_EQ(simulate(g.graph, s, room(9, 0)).dram_read, 6 * kBlock);
  const double b0 = kBlock * (1 - std::exp(-1.0));
  const double b1 = kBlock * (1 - std::exp(-(3 * kBlock + b0) / (4.0 * kBlock)));
  EXPECT_EQ(simulate(g.graph, s, room(4, 1)).dram_read, std::llround(6 * kBlock + b0 + b1));
  // The survival itself: 2 ways with the others holding a quarter leave 1.5 ways, halfway between
  // P(Poisson(1/2) = 0) and P(Poisson(1/2) <= 1).
  EXPECT_NEAR(l2_room_survival(2048, 512, 2048, 8192, 2), 0.5 * std::exp(-0.5) + 0.5 * 1.5 * std::exp(-0.5), 1e-12);
  EXPECT_NEAR(l2_room_survival(2048, 512, 8192, 8192, 16), std::exp(-4.0), 1e-12) << "full: 1 way";
  EXPECT_DOUBLE_EQ(l2_room_survival(0, 512, 8192, 8192, 16), 1.0);
}

// Under Room the weights never push the other lines out: the row-major case of
// EvictFirstWeightsDoNotPushActivationsOut (A0 re-read past A1, C0 and two weight blocks, 4 blocks of
// cache) keeps A0 and A1 as push 0 does: 6 blocks, where plain LRU reads 8.
TEST(L2Model, EvictFirstRoomDoesNotPushActivationsOut) {
  const GemmGraph g = build_gemm_graph(16, 32, 32, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(4, 1, 1);
  c.part.evict_first_weights = true;
  c.part.evict_first = L2EvictFirst::Room;
  c.part.weight_push = 1;  // unused under Room
  const TrafficReport r = simulate(g.graph, s, c);
  EXPECT_EQ(r.dram_read, 6 * kBlock);
  EXPECT_EQ(r.per_tensor[g.a].dram_read, 2 * kBlock);
}

// Hit time: the two tiles of DriftingTilesLoseSharedOperands (A shared over 64 K-steps, 3 blocks of
// cache), on SMs of different speeds (skew 0.2). With every byte alike the faster one pulls ahead
// and most of A is read twice (245 blocks). With hits at half the time of a DRAM byte, the one
// behind reads A from L2 (A hit + B miss: 0.75 of a step of two misses) and catches up; once ahead
// it fetches A itself and slows down, so the pair stays within a step and A is read once: (64 + 128)
// blocks, as in lockstep.
TEST(L2Model, HitTimeKeepsTilesThatShareOperandsTogether) {
  const GemmGraph g = build_gemm_graph(16, 32, 16 * 64, {16, 16, 16, 1});
  const Schedule s = make_order(g.graph, "row_major");
  CacheConfig c = partitioned(3, 2, 1);
  c.part.sm_skew = 0.2;
  const int64_t apart = simulate(g.graph, s, c).dram_read;
  EXPECT_GT(apart, (64 + 128 + 40) * kBlock);
  c.part.hit_time = 0.5;
  EXPECT_EQ(simulate(g.graph, s, c).dram_read, (64 + 128) * kBlock);
  c.part.hit_time = 0;
  try {
    simulate(g.graph, s, c);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("hit time 0"), std::string::npos) << e.what();
  }
}

// The Hopper presets replace weights in the room the others leave, hits at 0.75 of a DRAM byte; a
// preset JSON switches back to the push model (its weight_push kept) or sets another hit time.
TEST(L2Model, PresetsCarryTheEvictFirstModel) {
  const GpuPreset h = gpu_preset("h200");
  EXPECT_EQ(h.l2.evict_first, L2EvictFirst::Room);
  EXPECT_EQ(h.l2.hit_time, 0.75);
  // SMs 0.9% apart (the kernels' own tile timelines), steps drifting by the probe's 15%.
  EXPECT_EQ(h.l2.sm_skew, 0.009);
  EXPECT_EQ(h.l2.step_jitter, 0.153);
  EXPECT_EQ(h.l2.weight_push, 0.7);
  const GpuPreset j = gpu_preset_from_json(R"({"l2": {"evict_first": "push", "hit_time": 1, "seed": 7}})", "test");
  EXPECT_EQ(j.l2.evict_first, L2EvictFirst::Push);
  EXPECT_EQ(j.l2.hit_time, 1);
  EXPECT_EQ(j.l2.seed, 7u);
  EXPECT_THROW(gpu_preset_from_json(R"({"l2": {"evict_first": "lru"}})", "test"), InvalidArgument);
  EXPECT_THROW(gpu_preset_from_json(R"({"l2": {"evict_first": 1}})", "test"), InvalidArgument);
  EXPECT_THROW(gpu_preset_from_json(R"({"l2": {"hit_time": 0}})", "test"), InvalidArgument);
  // The set fringe (3 lines a set at random, the rest even); 0 is the Poisson model before.
  EXPECT_EQ(h.l2.set_fringe, 3);
  EXPECT_EQ(gpu_preset_from_json(R"({"l2": {"set_fringe": 0}})", "test").l2.set_fringe, 0);
  EXPECT_THROW(gpu_preset_from_json(R"({"l2": {"set_fringe": -1}})", "test"), InvalidArgument);
}
