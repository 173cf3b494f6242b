// Stream-K tickets (Schedule::units): the order that cuts each op into tickets of equal K work, the
// runs of consecutive K slices a ticket sums in registers (fused_with_next), and how the traffic
// replays, the time replay and the executor's plan take them. Hand-worked cases.
#include <gtest/gtest.h>

#include <algorithm>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/l2_model.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/model/validation.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/runtime/exec_plan.hpp"

using namespace tw;

namespace {

// 64 x 192 x 256 in 64 x 64 tiles, 4 K slices of one 64-column step: 3 output blocks x 4 slices.
GemmGraph three_blocks() { return build_gemm_graph(64, 192, 256, {64, 64, 64, 4}); }

struct Pos {
  int64_t tn, ks;
};
std::vector<Pos> positions(const TileGraph& g, const Schedule& s) {
  std::vector<Pos> v;
  for (int id : s.order) v.push_back({g.tile(id).tn, g.tile(id).ks});
  return v;
}

constexpr double kStepFlops = 2.0 * 64 * 64 * 64;
// `slots` SMs, a 64x64x64 K-step in 1 us, no bytes; no launch cost, no fixed latency, free reductions.
TimeParams toy(int slots) {
  TimeParams p;
  p.slots = slots;
  p.gemm_tflops = p.tile_tflops = slots * kStepFlops / 1e6;
  p.read_tbps = 4000 / 1e6;
  p.sm_stream_gbps = 1e9;  // read-backs take no time
  return p;
}
TrafficReport no_bytes(const TileGraph& g) {
  TrafficReport r;
  for (const Op& o : g.ops()) {
    OpTraffic t;
    t.name = o.name;
    t.tiles = o.num_tiles;
    for (int id = o.first_tile; id < o.first_tile + o.num_tiles; ++id) t.flops += g.tile(id).flops;
    r.per_op.push_back(t);
  }
  return r;
}

}  // namespace

// 12 tiles of equal work in 4 tickets of 3: block 0's slices 0-2 | block 0's slice 3, block 1's 0-1 |
// block 1's 2-3, block 2's 0 | block 2's 1-3. Consecutive slices of a block in a ticket are fused.
TEST(StreamK, OrderCutsAnOpIntoTicketsOfEqualWork) {
  const GemmGraph g = three_blocks();
  const Schedule s = make_order(g.graph, "streamk:4/row_major");
  EXPECT_EQ(s.units, (std::vector<int>{0, 3, 6, 9, 12}));
  EXPECT_EQ(s.num_tickets(), 4);
  const std::vector<Pos> p = positions(g.graph, s);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(p[i].tn * 4 + p[i].ks, i) << i;  // row-major blocks, slices inside
  EXPECT_EQ(fused_with_next(g.graph, s), (std::vector<uint8_t>{1, 1, 0, 0, 1, 0, 1, 0, 0, 1, 1, 0}));
  // 5 tickets of 12 / 5 = 2.4 tiles: cuts nearest 2.4, 4.8, 7.2, 9.6.
  EXPECT_EQ(make_order(g.graph, "streamk:5/row_major").units, (std::vector<int>{0, 2, 5, 7, 10, 12}));
  // More tickets than tiles: one tile each.
  EXPECT_EQ(make_order(g.graph, "streamk:100/row_major").num_tickets(), 12);
  // Without units nothing is fused, however the slices lie.
  const std::vector<uint8_t> none = fused_with_next(g.graph, make_order(g.graph, "row_major"));
  EXPECT_TRUE(std::none_of(none.begin(), none.end(), [](uint8_t f) { return f; }));
}

// Unequal K slices weigh by their K range: K = 320 in slices of 64, 64, 64, 128 (k_cuts); two
// blocks, 2 tickets of 320 columns: block 0 whole | block 1 whole.
TEST(StreamK, TicketsWeighTheirKRange) {
  const GemmGraph g = build_gemm_graph(64, 128, 320, {64, 64, 64, 4, {64, 128, 192}});
  const Schedule s = make_order(g.graph, "streamk:2/row_major");
  EXPECT_EQ(s.units, (std::vector<int>{0, 4, 8}));
}

// Each op of a chain is cut on its own; a base order that interleaves them is refused, as are
// malformed specs and units that do not cut the positions into runs.
TEST(StreamK, OrderAndUnitsAreChecked) {
  FfnTiling ft;
  ft.gate_up = {64, 64, 64, 2, {}};
  ft.down = {64, 64, 64, 2, {}};
  const FfnGraph f = build_ffn_graph({64, 128, 256, false}, ft);
  const Schedule s = make_order(f.graph, "streamk:3/col_major");
  const int first = f.graph.op(0).num_tiles;
  ASSERT_NE(std::find(s.units.begin(), s.units.end(), first), s.units.end());  // a cut between the ops
  EXPECT_EQ(s.num_tickets(), 6);
  // Two row blocks: chain_rows:1 runs a row of the first op, then the second's, then the next row.
  const FfnGraph two_rows = build_ffn_graph({128, 128, 256, false}, ft);
  EXPECT_THROW(make_order(two_rows.graph, "streamk:3/chain_rows:1"), InvalidArgument);
  EXPECT_THROW(make_order(f.graph, "streamk/row_major"), InvalidArgument);
  EXPECT_THROW(make_order(f.graph, "streamk:0/row_major"), InvalidArgument);
  EXPECT_THROW(make_order(f.graph, "streamk:4"), InvalidArgument);
  EXPECT_THROW(make_order(f.graph, "kslices/streamk:4/row_major"), InvalidArgument);
  Schedule bad = s;
  bad.units = {0, 2, 2, int(s.order.size())};
  try {
    validate(f.graph, bad);
    FAIL() << "an empty unit passed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unit 1"), std::string::npos) << e.what();
  }
  bad.units = {1, int(s.order.size())};
  EXPECT_THROW(validate(f.graph, bad), InvalidArgument);
  bad.units = {0, 3};
  EXPECT_THROW(validate(f.graph, bad), InvalidArgument);
}

TEST(StreamK, JsonKeepsTheUnits) {
  const GemmGraph g = three_blocks();
  const Schedule s = make_order(g.graph, "streamk:4/row_major");
  const Schedule back = schedule_from_json(g.graph, schedule_to_json(g.graph, s));
  EXPECT_EQ(back.order, s.order);
  EXPECT_EQ(back.units, s.units);
  EXPECT_THROW(schedule_from_json(g.graph, R"({"order": [0, 1], "units": "x"})"), InvalidArgument);
}

TEST(StreamK, RestrictKeepsWhatIsLeftOfEachUnit) {
  const GemmGraph g = three_blocks();
  const Schedule s = make_order(g.graph, "streamk:4/row_major");
  std::vector<uint8_t> keep(g.graph.num_tiles(), 0);
  for (int id = 0; id < g.graph.num_tiles(); ++id) keep[id] = g.graph.tile(id).tn == 1;  // block 1's slices
  const Schedule r = restrict_schedule(s, keep);
  EXPECT_EQ(r.order.size(), 4u);
  EXPECT_EQ(r.units, (std::vector<int>{0, 2, 4}));  // tickets 1 and 2 keep two slices each
}

// One block in 4 slices, one ticket: the run sums all 4 in registers and writes C as an unsplit
// tile: DRAM reads A and B once (2 x 16 x 64 x 2 B), writes C (16 x 16 x 2 B), and the fp32
// accumulator is never touched. Four tickets of one slice each go through the accumulator.
TEST(StreamK, AWholeRunHasNoPartialSums) {
  const GemmGraph g = build_gemm_graph(16, 16, 64, {16, 16, 16, 4});
  const int ws = g.graph.op(0).workspace;
  ASSERT_GE(ws, 0);
  CacheConfig c;
  c.capacity_bytes = 1 << 20;
  c.in_flight = 4;
  const TrafficReport fused = simulate(g.graph, make_order(g.graph, "streamk:1/row_major"), c);
  EXPECT_EQ(fused.dram_read, 4096);
  EXPECT_EQ(fused.dram_write, 512);
  EXPECT_EQ(fused.per_tensor[ws].requested_bytes + fused.per_tensor[ws].dram_write, 0);
  const TrafficReport apart = simulate(g.graph, make_order(g.graph, "streamk:4/row_major"), c);
  EXPECT_GT(apart.per_tensor[ws].dram_write, 0);
  // The partitioned replay with one partition, no ways, no drift is the simple one.
  CacheConfig pc = c;
  pc.l2 = L2Kind::Partitioned;
  pc.part.partitions = 1, pc.part.far_copies = false, pc.part.line_bytes = 32, pc.part.ways = 0;
  for (const char* spec : {"streamk:1/row_major", "streamk:2/row_major", "streamk:4/row_major"}) {
    const Schedule s = make_order(g.graph, spec);
    const TrafficReport a = simulate(g.graph, s, c), b = simulate(g.graph, s, pc);
    EXPECT_EQ(a.dram_read, b.dram_read) << spec;
    EXPECT_EQ(a.dram_write, b.dram_write) << spec;
  }
}

// Time: 2 blocks x 4 slices of 1 us on 2 slots, 1 us fixed latency per tile. Two tickets, each one
// block's whole run: the fixed latency once, 4 us of K-steps, no partial sums: 5 us. Without units
// the 8 tiles run as 4 waves of (1 + 1) us with the reductions: 8 us and more.
TEST(StreamK, ReplayRunsATicketOnOneSlot) {
  const GemmGraph g = build_gemm_graph(64, 128, 256, {64, 64, 64, 4});
  TimeParams p = toy(2);
  p.tile_fixed_us = 1;
  p.reduce_tbps = 16384 / 1e6;  // 1 us per 64 x 64 fp32 partial
  const TrafficReport r = no_bytes(g.graph);
  const Schedule sk = make_order(g.graph, "streamk:2/row_major");
  const TimePrediction t = predict_time(g.graph, sk, r, p);
  EXPECT_NEAR(t.fused_us, 5, 1e-9);
  EXPECT_NEAR(t.ops[0].reduce_bytes, 0, 1e-9);
  // A run of every slice of its block is one ticket of the executor (run_whole_units): no restart
  // between its slices, whatever slice_restart_us says.
  TimeParams restart = p;
  restart.slice_restart_us = 0.5;
  EXPECT_NEAR(predict_time(g.graph, sk, r, restart).fused_us, 5, 1e-9);
  restart.slice_restart_us = -1;
  EXPECT_THROW(predict_time(g.graph, sk, r, restart), InvalidArgument);
  EXPECT_GE(predict_time(g.graph, make_order(g.graph, "row_major"), r, p).fused_us, 8);
  // Three tickets on 3 slots, no fixed latency: block 0's slices 0-2 | block 0's 3 and block 1's 0 |
  // block 1's 1-3. Four partial sums (no run holds a whole block), served one after another by the
  // L2 at 1 us each: the first two runs end at 2 us (ticket 1's first), queued 2..3 and 3..4 ...
  p.tile_fixed_us = 0;
  p.slots = 3;
  p.gemm_tflops = p.tile_tflops = 3 * kStepFlops / 1e6;
  const Schedule s3 = make_order(g.graph, "streamk:3/row_major");
  ASSERT_EQ(s3.units, (std::vector<int>{0, 3, 5, 8}));
  const TileTimes tt = replay_tiles(g.graph, s3, r, p);
  // Ticket 1's block-0 slice ends computing at 1 us and is served 1..2; its block-1 slice runs 2..3
  // and is served after tickets 0 and 2 (both at 3 us): 3..4, 4..5, 5..6.
  EXPECT_NEAR(tt.end[s3.order[3]], 2, 1e-6);
  EXPECT_NEAR(tt.makespan, 6, 1e-6);
  const TimePrediction t3 = predict_time(g.graph, s3, r, p);
  EXPECT_NEAR(t3.ops[0].reduce_bytes, 4 * 16384.0, 1e-9);
  // Every tile of a run completes with it.
  EXPECT_NEAR(tt.end[s3.order[0]], tt.end[s3.order[2]], 1e-9);
}

TEST(StreamK, ExecPlanCarriesTheUnits) {
  const GemmGraph g = three_blocks();
  const Schedule s = make_order(g.graph, "streamk:4/row_major");
  const ExecPlan p = make_exec_plan(g.graph, s);
  EXPECT_EQ(p.units, s.units);
  EXPECT_TRUE(make_exec_plan(g.graph, make_order(g.graph, "row_major")).units.empty());
}

// FusedFfn's stream-K slices: about 1/8 of a ticket's share of the op, at least 2 stages.
// Llama-3-8B gate/up at M = 16: 224 tiles x 32 stages of 128 columns over 132 tickets = 54.3 stages
// each, slices of 6.8 stages: 5. A plain MLP at M = 512 (d 10368, F 5760): 90 tiles x 162 stages of
// 64 = 110.5 each, slices of 13.8: 12. One small tile: one slice.
TEST(StreamK, FfnSlices) {
  EXPECT_EQ(stream_k_split(16, 2 * 14336, 4096, 132), 5);
  EXPECT_EQ(stream_k_split(512, 5760, 10368, 132), 12);
  EXPECT_EQ(stream_k_split(1, 128, 128, 132), 1);
  EXPECT_LE(stream_k_split(4096, 64, 1 << 20, 1), 64);  // the body's slice table
  const FfnTiling t = sm90_ffn_stream_k_tiling({512, 10368, 5760, false}, 132);
  EXPECT_EQ(t.gate_up.split_k, 12);
  EXPECT_TRUE(t.gate_up.k_cuts.empty() && t.down.k_cuts.empty());  // even slices
  EXPECT_EQ(ffn_order_spec("streamk", 132), "streamk:132/row_major");
  EXPECT_EQ(ffn_order_spec("op_by_op_column", 132), "col_major");
  EXPECT_TRUE(is_stream_k_order("streamk:8/col_major"));
  EXPECT_FALSE(is_stream_k_order("kslices/col_major"));
}

// A run of some of a block's slices restarts before each next one (the sm90 body restarts its weight
// stream per slice of a stream-K ticket); a run of all of them does not. Two slots, 1 us a slice, no
// fixed latency, free reductions: ticket 0 = block 0's slices 0-2 (3 us + 2 restarts), ticket 1 = block
// 1's whole run (4 us), ticket 2 = block 0's slice 3 on the first slot free.
TEST(StreamK, ReplayRestartsOnlyPartialRuns) {
  const GemmGraph g = build_gemm_graph(64, 128, 256, {64, 64, 64, 4});
  const TileGraph& G = g.graph;
  Schedule s{"custom", {}, {0, 3, 7, 8}};
  for (int ks : {0, 1, 2}) s.order.push_back(G.tile_id(0, 0, 0, ks));
  for (int ks : {0, 1, 2, 3}) s.order.push_back(G.tile_id(0, 0, 1, ks));
  s.order.push_back(G.tile_id(0, 0, 0, 3));
  validate(G, s);
  const TicketDealer dealer(G, s);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(dealer.in_whole_run(i), i >= 3 && i < 7) << "position " << i;
  TimeParams p = toy(2);
  const TrafficReport r = no_bytes(G);
  EXPECT_NEAR(predict_time(G, s, r, p).fused_us, 4, 1e-6);
  p.slice_restart_us = 0.5;
  EXPECT_NEAR(predict_time(G, s, r, p).fused_us, 5, 1e-6);  // slot 0 free at 4, not slot 1 (5.5 with restarts)
}

// waves:<W>/: the blocks that fill whole waves of W tickets run as one ticket of all their slices,
// the last wave's slice by slice. 5 blocks x 4 slices, W = 2: blocks 0-3 whole (by their slice 0 in
// kslices/row_major), block 4's slices apart.
TEST(StreamK, WholeWavesRunTheirTilesUnsplit) {
  const GemmGraph g = build_gemm_graph(64, 320, 256, {64, 64, 64, 4});
  const TileGraph& G = g.graph;
  const Schedule s = make_order(G, "waves:2/kslices/row_major");
  EXPECT_EQ(s.name, "waves:2/kslices/row_major");
  EXPECT_EQ(s.units, (std::vector<int>{0, 4, 8, 12, 16, 17, 18, 19, 20}));
  for (int b = 0; b < 4; ++b)
    for (int ks = 0; ks < 4; ++ks) EXPECT_EQ(s.order[4 * b + ks], G.tile_id(0, 0, b, ks));
  for (int ks = 0; ks < 4; ++ks) EXPECT_EQ(s.order[16 + ks], G.tile_id(0, 0, 4, ks));
  const TicketDealer dealer(G, s);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(dealer.in_whole_run(i), i < 16) << "position " << i;
  // The executor's plan: the whole runs become one ticket each, with no arrival counter; the last
  // block's slices keep theirs.
  ExecPlan plan = make_exec_plan(G, s);
  ASSERT_TRUE(run_whole_units(plan, G));
  EXPECT_TRUE(plan.units.empty());
  ASSERT_EQ(plan.order.size(), 8u);
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(plan.order[b], G.tile_id(0, 0, b, 0));
    EXPECT_EQ(plan.tiles[plan.order[b]].arrive, -1);
  }
  for (int ks = 0; ks < 4; ++ks) EXPECT_GE(plan.tiles[plan.order[4 + ks]].arrive, 0);
  // Whole waves only: every block whole. Fewer blocks than W: nothing whole, no units.
  EXPECT_EQ(make_order(G, "waves:5/kslices/row_major").units, (std::vector<int>{0, 4, 8, 12, 16, 20}));
  EXPECT_EQ(make_order(G, "waves:1/row_major").num_tickets(), 5);
  const Schedule none = make_order(G, "waves:6/kslices/row_major");
  EXPECT_TRUE(none.units.empty());
  EXPECT_EQ(none.order, make_order(G, "kslices/row_major").order);
  // Stream-K tickets are not whole runs: the plan keeps its units.
  ExecPlan sk = make_exec_plan(G, make_order(G, "streamk:3/row_major"));
  const std::vector<int32_t> units = sk.units;
  EXPECT_FALSE(run_whole_units(sk, G));
  EXPECT_EQ(sk.units, units);
  for (const char* bad : {"waves/row_major", "waves:0/row_major", "waves:4", "waves:2/streamk:2/row_major", "wave:2/row_major"})
    EXPECT_THROW(make_order(G, bad), InvalidArgument) << bad;
}

// The sm90 body's split finisher (FfnOptions::split_finisher) needs each split group's slice of the
// last K range after the group's other slices in the order: then its wait for them is a wait for
// earlier tickets only. 3 blocks x 4 slices.
TEST(StreamK, SplitFinisherComesLastInItsGroup) {
  const GemmGraph g = three_blocks();
  const TileGraph& G = g.graph;
  for (const char* spec : {"row_major", "col_major", "kslices/row_major", "kslices/col_major", "streamk:5/row_major"})
    EXPECT_TRUE(split_finisher_last(G, make_order(G, spec))) << spec;
  // Block 1's slices 1 and 3 swapped: its slice of the last K range is no longer its last ticket.
  Schedule s = make_order(G, "row_major");
  const auto at = [&](int tn, int ks) {
    return std::find(s.order.begin(), s.order.end(), G.tile_id(0, 0, tn, ks)) - s.order.begin();
  };
  std::swap(s.order[at(1, 1)], s.order[at(1, 3)]);
  EXPECT_FALSE(split_finisher_last(G, s));
  // Whole waves: the whole runs' slices in order (the executor runs them without arrivals,
  // run_whole_units), the last wave's block kept in order.
  const GemmGraph g5 = build_gemm_graph(64, 320, 256, {64, 64, 64, 4});
  const Schedule waves = make_order(g5.graph, "waves:2/kslices/row_major");
  ExecPlan plan = make_exec_plan(g5.graph, waves);
  ASSERT_TRUE(run_whole_units(plan, g5.graph));
  EXPECT_TRUE(split_finisher_last(g5.graph, waves));
  // An op without split-K has no groups.
  const GemmGraph one = build_gemm_graph(64, 192, 256, {64, 64, 64, 1});
  EXPECT_TRUE(split_finisher_last(one.graph, make_order(one.graph, "row_major")));
}
