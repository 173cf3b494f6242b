// Predicted time (model/time_model.hpp) on numbers worked out by hand.
// The roofline summary (op_time): an H200-like part with a 4.68 TB/s floor, 716 TFLOP/s, 132 tiles in
// flight, 74 GB/s per SM in a tail. The replay (predict_time, replay_tiles): small GEMMs of 64x64x64
// K-steps (524288 FLOPs each) on a few slots, with rates chosen so that a K-step computes in 1 us.
#include <gtest/gtest.h>

#include <cmath>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/order/orders.hpp"

using namespace tw;

namespace {
TimeParams h200() {
  TimeParams p;
  p.read_tbps = 4.68, p.gemm_tflops = 716, p.sm_stream_gbps = 74, p.launch_us = 3, p.slots = 132;
  return p;
}

constexpr double kStepFlops = 2.0 * 64 * 64 * 64;  // one 64x64x64 K-step
// `slots` SMs, each computing a 64x64x64 K-step in 1 us; the floor 4000 B/us, one SM 1000 B/us; no
// launch cost, no fixed latency, free reductions, the roofline's max.
TimeParams toy(int slots) {
  TimeParams p;
  p.slots = slots;
  p.gemm_tflops = p.tile_tflops = slots * kStepFlops / 1e6;  // TFLOP/s = 1e6 FLOP/us
  p.read_tbps = 4000 / 1e6;                                   // 4000 B/us
  p.sm_stream_gbps = 1000 / 1e3;                              // 1000 B/us
  return p;
}
// A report that gives op 0 `bytes` of DRAM traffic (and its tiles and FLOPs from the graph).
TrafficReport bytes_report(const TileGraph& g, std::vector<int64_t> bytes) {
  TrafficReport r;
  for (size_t op = 0; op < g.ops().size(); ++op) {
    OpTraffic o;
    o.name = g.ops()[op].name;
    o.dram_read = op < bytes.size() ? bytes[op] : 0;
    o.tiles = g.ops()[op].num_tiles;
    for (int id = g.ops()[op].first_tile; id < g.ops()[op].first_tile + o.tiles; ++id) o.flops += g.tile(id).flops;
    r.per_op.push_back(o);
  }
  return r;
}
}  // namespace

// ---- the roofline summary (op_time) ----

// 4.68 GB at 4.68 TB/s is 1000 us. 264 tiles are two full waves: no tail.
TEST(TimeModel, MemoryBoundFullWaves) {
  const OpTime o = op_time("stream", 264, 4.68e9, 0, h200());
  EXPECT_DOUBLE_EQ(o.waves, 2.0);
  EXPECT_DOUBLE_EQ(o.tail_efficiency, 1.0);
  EXPECT_NEAR(o.memory_us, 1000, 1e-9);
  EXPECT_NEAR(o.roofline_us, 1000, 1e-9);
  EXPECT_FALSE(o.compute_bound);
}

// 133 tiles: a full wave moves 132/133 of the bytes at the floor (992.48 us); the one tile left
// streams its 4.68e9/133 B from one SM at 74 GB/s: 475.51 us more.
TEST(TimeModel, MemoryBoundTailRunsAtOneSmsRate) {
  const OpTime o = op_time("stream", 133, 4.68e9, 0, h200());
  EXPECT_NEAR(o.waves, 133.0 / 132, 1e-12);
  EXPECT_NEAR(o.tail_efficiency, 133.0 / 264, 1e-12);
  EXPECT_NEAR(o.roofline_us, 1000.0 * 132 / 133 + 4.68e9 / 133 / 0.074e6, 1e-6);
}

// 716 GFLOP at 716 TFLOP/s is 1000 us. 133 tiles: the full wave 992.48 us; the last tile computes
// 1/133 of the work on 1 of 132 SMs, which takes as long as a full wave: the classic tail, 2x.
TEST(TimeModel, ComputeBoundTailCostsAWholeWave) {
  const OpTime o = op_time("gemm", 133, 1e6, 716e9, h200());
  EXPECT_TRUE(o.compute_bound);
  EXPECT_NEAR(o.intensity, 716e3, 1e-6);
  EXPECT_NEAR(o.compute_us, 1000, 1e-9);
  EXPECT_NEAR(o.roofline_us, 2 * 1000.0 * 132 / 133, 1e-6);
}

// The ridge point is 716 / 4.68 = 153 FLOP/B: just below it an op is memory-bound.
TEST(TimeModel, RidgePointSplitsTheBound) {
  const double ridge = 716 / 4.68;
  EXPECT_FALSE(op_time("a", 132, 1e9, 0.99 * ridge * 1e9, h200()).compute_bound);
  EXPECT_TRUE(op_time("b", 132, 1e9, 1.01 * ridge * 1e9, h200()).compute_bound);
}

// ---- the replay ----

// 128x256x256 in 64x64 tiles with 64-column K-steps: 8 tiles of 4 K-steps (4 us each). On 4 SMs,
// no bytes: two waves, 8 us; + 1 us fixed per tile: 10 us; + a 3 us launch: 13 us.
TEST(TimeModel, ReplayComputeBoundWaves) {
  const GemmGraph g = build_gemm_graph(128, 256, 256, {64, 64, 64, 1});
  const Schedule s = make_order(g.graph, "row_major");
  TimeParams p = toy(4);
  const TrafficReport r = bytes_report(g.graph, {0});
  TimePrediction t = predict_time(g.graph, s, r, p);
  EXPECT_NEAR(t.fused_us, 8, 1e-9);
  ASSERT_EQ(t.ops.size(), 1u);
  EXPECT_NEAR(t.ops[0].us, 8, 1e-9);
  EXPECT_NEAR(t.ops[0].waves, 2, 1e-12);
  p.tile_fixed_us = 1;
  p.launch_us = 3;
  t = predict_time(g.graph, s, r, p);
  EXPECT_NEAR(t.fused_us, 13, 1e-9);
  EXPECT_NEAR(t.separate_us, 13, 1e-9);  // one op: one launch either way
  // A fixed latency that grows with the rows: 64-row tiles take 0.2 + (1 - 0.2) x 64/256 = 0.4 us.
  p.tile_fixed_base_us = 0.2;
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 3 + 2 * (0.4 + 4), 1e-9);
  p.tile_fixed_base_us = -0.5;
  EXPECT_THROW(predict_time(g.graph, s, r, p), InvalidArgument);
}

// The same 8 tiles on 3 SMs: waves of 3, 3 and 2 tiles, 12 us; the last wave leaves an SM idle
// (tail efficiency 8/9).
TEST(TimeModel, ReplayComputeBoundTailWave) {
  const GemmGraph g = build_gemm_graph(128, 256, 256, {64, 64, 64, 1});
  const TimePrediction t = predict_time(g.graph, make_order(g.graph, "row_major"), bytes_report(g.graph, {0}), toy(3));
  EXPECT_NEAR(t.fused_us, 12, 1e-9);
  EXPECT_NEAR(t.ops[0].tail_efficiency, 8.0 / 9, 1e-12);
}

// 128000 B over the op's 32 K-steps: 4000 B a step. On 4 SMs each streams the floor's quarter,
// 1000 B/us (= one SM's cap): 4 us a step against 1 us of compute, memory-bound, 16 us a tile,
// two waves: 32 us = 128000 B at the 4000 B/us floor.
TEST(TimeModel, ReplayMemoryBound) {
  const GemmGraph g = build_gemm_graph(128, 256, 256, {64, 64, 64, 1});
  const TimePrediction t = predict_time(g.graph, make_order(g.graph, "row_major"), bytes_report(g.graph, {128000}), toy(4));
  EXPECT_NEAR(t.fused_us, 32, 1e-9);
  EXPECT_FALSE(t.ops[0].compute_bound);
  EXPECT_NEAR(t.ops[0].memory_us, 32, 1e-9);
}

// On 3 SMs the floor's third (1333 B/us) is above one SM's cap: every tile streams at 1000 B/us,
// 16 us a tile, waves of 3, 3 and 2: 48 us, half again the 32 us the floor allows (the last wave's
// 2 SMs pull half the floor, and the full waves three quarters).
TEST(TimeModel, ReplayMemoryBoundTailAtTheSmCap) {
  const GemmGraph g = build_gemm_graph(128, 256, 256, {64, 64, 64, 1});
  const TimePrediction t = predict_time(g.graph, make_order(g.graph, "row_major"), bytes_report(g.graph, {128000}), toy(3));
  EXPECT_NEAR(t.fused_us, 48, 1e-9);
}

// Compute and memory of 1 us each per K-step (1000 B a step at 1000 B/us): the roofline's max says
// 1 us a step, overlap power 2 says sqrt(2), power 1 (no overlap) 2 us. 8 tiles x 4 steps on 4 SMs.
TEST(TimeModel, ReplayOverlapPower) {
  const GemmGraph g = build_gemm_graph(128, 256, 256, {64, 64, 64, 1});
  const Schedule s = make_order(g.graph, "row_major");
  const TrafficReport r = bytes_report(g.graph, {32 * 1000});
  TimeParams p = toy(4);
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 8, 1e-9);
  p.overlap_power = 2;
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 8 * std::sqrt(2.0), 1e-9);
  p.overlap_power = 1;
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 16, 1e-9);
}

// Split-K: 64x128x256 in 64x64 tiles, 4 K slices of one step: 2 output blocks x 4 slices, 8 tiles
// on 8 SMs, all done computing at 1 us. Each slice adds 64 x 64 fp32 = 16384 B at L2; the last of a
// block then reads the sums back and re-zeroes them (2 x 16384 B at one SM's rate).
TEST(TimeModel, ReplaySplitKReductions) {
  const GemmGraph g = build_gemm_graph(64, 128, 256, {64, 64, 64, 4});
  ASSERT_EQ(g.graph.num_tiles(), 8);
  const Schedule s = make_order(g.graph, "row_major");
  const TrafficReport r = bytes_report(g.graph, {0});
  TimeParams p = toy(8);
  p.sm_stream_gbps = 16.384;  // 16384 B/us: the read-back takes 2 us
  // Free reductions: 1 us of K-steps, then the last slice's read-back: 3 us.
  TimePrediction t = predict_time(g.graph, s, r, p);
  EXPECT_NEAR(t.fused_us, 3, 1e-9);
  EXPECT_NEAR(t.ops[0].reduce_bytes, 8 * 16384.0, 1e-9);
  // The whole L2 adds 16384 B/us: the 8 slices queue, the last done at 1 + 8 = 9 us; + 2: 11 us.
  p.reduce_tbps = 16384 / 1e6;
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 11, 1e-9);
  // Only slices of the same block serialise (16384 B/us each block): 4 slices per block, the two
  // blocks side by side: 1 + 4 + 2 = 7 us.
  p.reduce_tbps = 0;
  p.reduce_block_gbps = 16.384;
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 7, 1e-9);
  // Both: the L2's queue ends at 9 us; block 1's fourth slice (ticket 7) is served last: 9 + 2 = 11.
  p.reduce_tbps = 16384 / 1e6;
  const TileTimes tt = replay_tiles(g.graph, s, r, p);
  EXPECT_NEAR(tt.makespan, 11, 1e-9);
  EXPECT_NEAR(tt.end[s.order[3]], 5 + 2, 1e-9);  // block 0's last slice: served 4..5, read back to 7
}

// The split finisher (TimeParams::split_finisher_rows, the sm90 body's tiles of more than that many
// rows): one 64 x 64 block in 4 K slices of one step on 2 SMs, each slice's partial sums (16384 B)
// served by the L2 in 1 us, the read-back free. Last to arrive sums: slices 0 and 1 compute 0..1 and
// hold their SMs until served (2 and 3); slice 2 runs 2..3, served 3..4; slice 3 runs 3..4, served
// 4..5: 5 us. The finisher: slices 0 and 1 leave their SMs at 1 (served 1..2, 2..3), slices 2 and 3
// compute 1..2, slice 2 is served 3..4 and slice 3 (the last K range) adds nothing, reads back at 4.
TEST(TimeModel, ReplaySplitFinisher) {
  const GemmGraph g = build_gemm_graph(64, 64, 256, {64, 64, 64, 4});
  const Schedule s = make_order(g.graph, "kslices/row_major");
  const TrafficReport r = bytes_report(g.graph, {0});
  TimeParams p = toy(2);
  p.sm_stream_gbps = 1e9;  // the read-back takes ~0
  p.reduce_tbps = 16384 / 1e6;
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 5, 1e-6);
  p.split_finisher_rows = 32;  // 64-row tiles: summed by their slice of the last K range
  const TileTimes tt = replay_tiles(g.graph, s, r, p);
  EXPECT_NEAR(tt.makespan, 4, 1e-6);
  EXPECT_NEAR(tt.end[g.graph.tile_id(0, 0, 0, 3)], 4, 1e-6);
  EXPECT_NEAR(tt.take[g.graph.tile_id(0, 0, 0, 2)], 1, 1e-6);  // slice 0's SM went on at once
  EXPECT_NEAR(predict_time(g.graph, s, r, p).ops[0].reduce_bytes, 4 * 16384.0, 1e-6);  // the graph's, as written
  // Tiles of 64 rows with the threshold at 64: the last to arrive sums.
  p.split_finisher_rows = 64;
  EXPECT_NEAR(predict_time(g.graph, s, r, p).fused_us, 5, 1e-6);
  // An order that puts a block's last K range before another of its slices: the executor runs the
  // last-arriver protocol, and so does the replay.
  p.split_finisher_rows = 32;
  Schedule swapped = s;
  std::swap(swapped.order[2], swapped.order[3]);
  EXPECT_NEAR(predict_time(g.graph, swapped, r, p).fused_us, 5, 1e-6);
  p.split_finisher_rows = -1;
  EXPECT_THROW(predict_time(g.graph, s, r, p), InvalidArgument);
}

// A chain: the second GEMM reads the first's output. X [64 x 128] -> H [64 x 256] (4 tiles of 2
// K-steps) -> Y [64 x 128] (2 tiles of 4 K-steps, each waiting for all 4 H tiles). On 8 SMs all 6
// tiles take a ticket at 0; H is done at 2 us, Y at 6. With 1 us fixed per tile the H tiles run
// 1..3, and the Y tiles' fixed latency hides under their wait: 3..7. Op by op: 3 + 5 us + 2 launches.
TEST(TimeModel, ReplayWaitsForProducers) {
  FfnTiling ft;
  ft.gate_up = {64, 64, 64, 1, {}};
  ft.down = {64, 64, 64, 1, {}};
  const FfnGraph f = build_ffn_graph({64, 128, 256, false}, ft);
  ASSERT_EQ(f.graph.ops().size(), 2u);
  const Schedule s = op_by_op_order(f.graph);
  const TrafficReport r = bytes_report(f.graph, {0, 0});
  TimeParams p = toy(8);
  TileTimes tt = replay_tiles(f.graph, s, r, p);
  EXPECT_NEAR(tt.makespan, 6, 1e-9);
  for (int id = 0; id < f.graph.num_tiles(); ++id)
    for (int d : f.graph.tile(id).deps) EXPECT_GE(tt.start[id], tt.end[d] - 1e-9);
  p.tile_fixed_us = 1;
  p.launch_us = 0.5;
  const TimePrediction t = predict_time(f.graph, s, r, p);
  EXPECT_NEAR(t.fused_us, 7.5, 1e-9);
  EXPECT_NEAR(t.ops[1].start_us, 0, 1e-9);  // ticket taken at once; K-steps from 3 us
  EXPECT_NEAR(t.ops[1].end_us, 7, 1e-9);
  EXPECT_NEAR(t.separate_us, 3 + 5 + 2 * 0.5, 1e-9);
}

// From a replay of the traffic model: a 1024x1024x1024 GEMM in 128x128 tiles is 64 tiles (under half
// a wave), 2.15 GFLOP. 64 SMs compute it at 64/132 of the peak: 6.19 us; its 6 MB (A, B read once, C
// written once) at min(4.68, 64 x 0.074) TB/s take 1.34 us: compute-bound, so 6.19 us in the replay
// as in the roofline summary.
TEST(TimeModel, FromASimulatedGemm) {
  const GemmGraph g = build_gemm_graph(1024, 1024, 1024, {128, 128, 64, 1});
  CacheConfig c;
  c.in_flight = 132;
  const Schedule s = make_order(g.graph, "row_major");
  const TrafficReport r = simulate(g.graph, s, c);
  ASSERT_EQ(r.per_op.size(), 1u);
  EXPECT_DOUBLE_EQ(r.per_op[0].flops, 2.0 * 1024 * 1024 * 1024);
  EXPECT_EQ(r.per_op[0].tiles, 64);
  EXPECT_EQ(r.dram_read + r.dram_write, 3 * 1024 * 1024 * 2);
  const TimePrediction t = predict_time(g.graph, s, r, h200());
  EXPECT_NEAR(t.ops[0].waves, 64.0 / 132, 1e-12);
  const double compute = 2.0 * 1024 * 1024 * 1024 / (716e6 * 64 / 132);
  EXPECT_NEAR(t.ops[0].roofline_us, compute, 1e-6);
  EXPECT_NEAR(t.ops[0].us, compute, 1e-6);
  EXPECT_NEAR(t.fused_us, compute + 3, 1e-6);
}

TEST(TimeModel, BadParametersAreNamed) {
  TimeParams p = h200();
  p.read_tbps = 0;
  EXPECT_THROW(op_time("x", 1, 1, 1, p), InvalidArgument);
  p = h200();
  p.reduce_tbps = -1;
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

TEST(TimeModel, ReportMustMatchTheGraph) {
  const GemmGraph g = build_gemm_graph(128, 256, 256, {64, 64, 64, 1});
  TrafficReport r;  // no ops
  EXPECT_THROW(predict_time(g.graph, make_order(g.graph, "row_major"), r, toy(4)), InvalidArgument);
}

// The H200 preset carries the replay's fitted constants (src/model/presets.cpp); a preset JSON
// overrides them by name.
TEST(TimeModel, PresetConstants) {
  const TimeParams p = time_params(gpu_preset("h200"), 132);
  EXPECT_EQ(p.tile_tflops, 830);
  EXPECT_EQ(p.tile_fixed_us, 5.5);
  EXPECT_EQ(p.overlap_power, 3);
  EXPECT_EQ(p.reduce_tbps, 0.65);
  EXPECT_EQ(p.reduce_block_gbps, 35);
  EXPECT_EQ(p.slice_restart_us, 1.5);
  EXPECT_EQ(p.split_finisher_rows, 64);
  EXPECT_EQ(gpu_preset("a100").split_finisher_rows, 0);  // the sm80 body has no finisher
  const GpuPreset j = gpu_preset_from_json(
      R"({"base": "h200", "tile_fixed_us": 2, "reduce_block_gbps": 0, "slice_restart_us": 0.25, "split_finisher_rows": 0})",
      "test");
  EXPECT_EQ(j.tile_fixed_us, 2);
  EXPECT_EQ(j.reduce_block_gbps, 0);
  EXPECT_EQ(j.slice_restart_us, 0.25);
  EXPECT_EQ(j.split_finisher_rows, 0);
  EXPECT_EQ(time_params(j, 132).split_finisher_rows, 0);
  EXPECT_THROW(gpu_preset_from_json(R"({"split_finisher_rows": -1})", "test"), InvalidArgument);
  EXPECT_EQ(j.tile_tflops, 830);
  EXPECT_THROW(gpu_preset_from_json(R"({"overlap_power": -1})", "test"), InvalidArgument);
}
