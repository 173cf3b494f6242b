// Predicted time (model/time_model.hpp) on numbers worked out by hand: an H200-like part with a
// 4.68 TB/s floor, 716 TFLOP/s, 132 tiles in flight, 74 GB/s per SM in a tail, 3 us per launch.
#include <gtest/gtest.h>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/order/orders.hpp"

using namespace tw;

namespace {
TimeParams h200() { return {4.68, 716, 74, 3, 132}; }
}  // namespace

// 4.68 GB at 4.68 TB/s is 1000 us. 264 tiles are two full waves: no tail.
TEST(TimeModel, MemoryBoundFullWaves) {
  const OpTime o = op_time("stream", 264, 4.68e9, 0, h200());
  EXPECT_DOUBLE_EQ(o.waves, 2.0);
  EXPECT_DOUBLE_EQ(o.tail_efficiency, 1.0);
  EXPECT_NEAR(o.memory_us, 1000, 1e-9);
  EXPECT_NEAR(o.us, 1000, 1e-9);
  EXPECT_FALSE(o.compute_bound);
}

// 133 tiles: a full wave moves 132/133 of the bytes at the floor (992.48 us); the one tile left
// streams its 4.68e9/133 B from one SM at 74 GB/s: 475.51 us more.
TEST(TimeModel, MemoryBoundTailRunsAtOneSmsRate) {
  const OpTime o = op_time("stream", 133, 4.68e9, 0, h200());
  EXPECT_NEAR(o.waves, 133.0 / 132, 1e-12);
  EXPECT_NEAR(o.tail_efficiency, 133.0 / 264, 1e-12);
  EXPECT_NEAR(o.us, 1000.0 * 132 / 133 + 4.68e9 / 133 / 0.074e6, 1e-6);
}

// 716 GFLOP at 716 TFLOP/s is 1000 us. 133 tiles: the full wave 992.48 us; the last tile computes
// 1/133 of the work on 1 of 132 SMs, which takes as long as a full wave: the classic tail, 2x.
TEST(TimeModel, ComputeBoundTailCostsAWholeWave) {
  const OpTime o = op_time("gemm", 133, 1e6, 716e9, h200());
  EXPECT_TRUE(o.compute_bound);
  EXPECT_NEAR(o.intensity, 716e3, 1e-6);
  EXPECT_NEAR(o.compute_us, 1000, 1e-9);
  EXPECT_NEAR(o.us, 2 * 1000.0 * 132 / 133, 1e-6);
}

// The ridge point is 716 / 4.68 = 153 FLOP/B: just below it an op is memory-bound.
TEST(TimeModel, RidgePointSplitsTheBound) {
  const double ridge = 716 / 4.68;
  EXPECT_FALSE(op_time("a", 132, 1e9, 0.99 * ridge * 1e9, h200()).compute_bound);
  EXPECT_TRUE(op_time("b", 132, 1e9, 1.01 * ridge * 1e9, h200()).compute_bound);
}

// Two ops from a hand-made report: 264 memory tiles (1000 us) then 133 compute tiles (992.48 us +
// a 992.48 us tail). One launch: the roofline over the sums is max(1000 + ~0, 1000) us, plus the
// last op's exposed tail (1984.96 - 1000) and one launch cost; op by op: 1000 + 1984.96 + 2 x 3.
TEST(TimeModel, ChainOneLaunchAndOpByOp) {
  TrafficReport r;
  r.per_op.push_back({"load", 4680000000, 0, 0, 0, 0.0, 264});
  r.per_op.push_back({"gemm", 1000000, 0, 0, 0, 716e9, 133});
  const TimePrediction t = predict_time(r, h200());
  ASSERT_EQ(t.ops.size(), 2u);
  const double gemm = 2 * 1000.0 * 132 / 133;
  EXPECT_NEAR(t.separate_us, 1000 + gemm + 6, 1e-6);
  const double roof = std::max((4.68e9 + 1e6) / 4.68e6, 1000.0);
  EXPECT_NEAR(t.fused_us, roof + (gemm - 1000) + 3, 1e-6);
}

// From a replay: a 1024x1024x1024 GEMM in 128x128 tiles is 64 tiles (under half a wave), 2.15 GFLOP.
TEST(TimeModel, FromASimulatedGemm) {
  const GemmGraph g = build_gemm_graph(1024, 1024, 1024, {128, 128, 64, 1});
  CacheConfig c;
  c.in_flight = 132;
  const TrafficReport r = simulate(g.graph, make_order(g.graph, "row_major"), c);
  ASSERT_EQ(r.per_op.size(), 1u);
  EXPECT_DOUBLE_EQ(r.per_op[0].flops, 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(r.per_op[0].tiles, 64);
  const TimePrediction t = predict_time(r, h200());
  EXPECT_NEAR(t.ops[0].waves, 64.0 / 132, 1e-12);
  // 64 tiles on 64 of 132 SMs: compute 2.147 GFLOP at 64/132 of the peak = 6.19 us; memory: 6 MB
  // (A, B read once, C written once) at min(4.68, 64 x 0.074) = 4.68 TB/s: 1.34 us.
  EXPECT_EQ(r.dram_read + r.dram_write, 3 * 1024 * 1024 * 2);
  EXPECT_NEAR(t.ops[0].us, 2.0 * 1024 * 1024 * 1024 / (716e6 * 64 / 132), 1e-6);
}

TEST(TimeModel, BadParametersAreNamed) {
  TimeParams p = h200();
  p.read_tbps = 0;
  EXPECT_THROW(op_time("x", 1, 1, 1, p), InvalidArgument);
  p = h200();
  p.slots = 0;
  try {
    op_time("x", 1, 1, 1, p);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("got 0"), std::string::npos) << e.what();
  }
}
