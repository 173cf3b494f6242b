// The decode step's tile graph (graph/step_graph.hpp): ops and tiles, the dependencies that carry the
// residual stream, the norm statistics and the KV-cache appends, the executor plan under the step's
// sync policy, the planner's splits, and the traffic model against the step's byte floor.
#include <gtest/gtest.h>

#include "llm_test_util.hpp"

#include <algorithm>
#include <set>
#include <string>

#include "tileweave/graph/step_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/runtime/exec_plan.hpp"

namespace tw {
namespace {

std::set<int> ops_of(const TileGraph& g, const std::vector<int>& tiles) {
  std::set<int> s;
  for (int t : tiles) s.insert(g.tile(t).op);
  return s;
}

using tw::test::error_of;

int before_position(const ExecPlan& p, int tile) {
  return int(std::find(p.order.begin(), p.order.end(), tile) - p.order.begin());
}

TEST(StepGraph, OpsDependenciesAndPlan) {
  const ModelConfig c = named_config("tiny-llama");
  DecodeStepShape s;
  s.batch = 3;
  s.max_seq_len = 64;
  const std::vector<int> lens{5, 17, 40};
  const StepTiling t = plan_step_tiling(c, s.batch, 132);
  const StepGraph g = build_step_graph(c, s, lens, {}, t);
  const TileGraph& G = g.graph;
  ASSERT_EQ(G.ops().size(), size_t(1 + 5 * c.num_layers + 2));
  for (int l = 0; l < c.num_layers; ++l) {
    const auto& L = g.layers[l];
    const int feeder = l == 0 ? g.op_embed : g.layers[l - 1].op_down;
    for (int i = 0; i < G.op(L.op_qkv).num_tiles; ++i) {
      const Tile& tile = G.tile(G.op(L.op_qkv).first_tile + i);
      EXPECT_EQ(ops_of(G, tile.deps), std::set<int>{feeder}) << "qkv tile " << i << " of layer " << l;
    }
    // Attention reads q and the appended rows: only this layer's QKV tiles; every KV head's appended
    // rows are read by some attention tile.
    std::set<int> qkv_producers;
    for (int i = 0; i < G.op(L.op_attention).num_tiles; ++i) {
      const Tile& tile = G.tile(G.op(L.op_attention).first_tile + i);
      EXPECT_EQ(ops_of(G, tile.deps), std::set<int>{L.op_qkv});
      qkv_producers.insert(tile.deps.begin(), tile.deps.end());
    }
    for (int i = 0; i < G.op(L.op_qkv).num_tiles; ++i)  // every qkv tile feeds the attention
      EXPECT_TRUE(qkv_producers.count(G.op(L.op_qkv).first_tile + i)) << "qkv tile " << i << " is read by no attention tile";
    const Tile& o = G.tile(G.op(L.op_o_proj).first_tile);
    EXPECT_EQ(ops_of(G, o.deps), (std::set<int>{feeder, L.op_attention}));  // residual + attention output
    const Tile& gu = G.tile(G.op(L.op_gate_up).first_tile);
    EXPECT_EQ(ops_of(G, gu.deps), std::set<int>{L.op_o_proj});  // x_mid and its sums of squares
    EXPECT_EQ(int(gu.deps.size()), G.op(L.op_o_proj).num_tiles);  // every o_proj tile adds to the sums
  }
  const Tile& sample = G.tile(G.op(g.op_sample).first_tile);
  EXPECT_EQ(int(sample.deps.size()), G.op(g.op_lm_head).num_tiles);
  // The executor's plan under the step's policies, in the default order.
  const Schedule order = make_order(G, "kslices/col_major");
  const ExecPlan plan = make_exec_plan(G, order, step_sync_policy(g));
  EXPECT_EQ(plan.tiles.size(), size_t(G.num_tiles()));
  // One counter per op except gate/up (per tile): an o_proj tile waits on two counters.
  const DeviceTile& od = plan.tiles[G.op(g.layers[1].op_o_proj).first_tile];
  EXPECT_EQ(od.wait_end - od.wait_begin, 2);
}

TEST(StepGraph, PlannerFillsTheGpu) {
  const ModelConfig c = named_config("llama-3.2-1b");
  const StepTiling t = plan_step_tiling(c, 1, 132);
  // qkv (24 tiles), o_proj and down (16 each) would need more slices to fill 132 SMs. They add their
  // slices into a buffer (no reduction): as many as keep one wave, up to 8 -- qkv 5, cut into whole
  // stages (256 columns at 8 rows): 4 slices of 2 stages; o_proj and down 8. Gate/up (128 tiles) and
  // the LM head (1002) none.
  EXPECT_EQ(t.qkv.split_k, 4);
  EXPECT_EQ(t.o_proj.split_k, 8);
  EXPECT_EQ(t.down.split_k, 8);
  const StepTiling t8 = plan_step_tiling(named_config("llama-3-8b"), 1, 132);
  EXPECT_EQ(t8.qkv.split_k, 2);     // 48 tiles: 2 slices fill 96 SMs, 3 would need a second wave
  EXPECT_EQ(t8.o_proj.split_k, 4);  // 32 tiles: 4 slices fill 128 SMs, 5 would need a second wave
  EXPECT_EQ(t8.down.split_k, 4);
  EXPECT_EQ(t.gate_up.split_k, 1);
  EXPECT_EQ(t.lm_head.split_k, 1);
  EXPECT_EQ(plan_step_tiling(c, 1, 132, 2).qkv.split_k, 2);  // an explicit cap
  EXPECT_EQ(t.attention_tiles, 132);
  for (const Tiling* x : {&t.qkv, &t.o_proj, &t.gate_up, &t.down}) EXPECT_EQ(x->bm, 8);
  // Up to 32 rows the tiles hold R >= 2B rows (the norm consumers' fp32 rows); above, the stream's bf16
  // copy (step_bf16_stream): R >= B. A batch of 100 takes 128-row tiles and fewer, longer slices; a
  // tensor-parallel rank keeps R >= 2B; 256 is the largest batch on one GPU, 128 with tensor parallelism.
  EXPECT_EQ(plan_step_tiling(c, 32, 132).qkv.bm, 64);
  EXPECT_EQ(plan_step_tiling(c, 33, 132).qkv.bm, 64);
  const StepTiling big = plan_step_tiling(c, 100, 132);
  EXPECT_EQ(big.qkv.bm, 128);
  EXPECT_EQ(plan_step_tiling(c, 100, 132, 0, 2).qkv.bm, 256);
  EXPECT_FALSE(step_bf16_stream(32));
  EXPECT_TRUE(step_bf16_stream(33));
  EXPECT_FALSE(step_bf16_stream(33, 2));
  EXPECT_EQ(plan_step_tiling(c, 129, 132).qkv.bm, 256);
  EXPECT_EQ(plan_step_tiling(c, 256, 132).qkv.bm, 256);
  EXPECT_NE(error_of([&] { plan_step_tiling(c, 257, 132); }).find("batch 257 is outside [1, 256]"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_step_tiling(c, 129, 132, 0, 2); }).find("batch 129 is outside [1, 128]"), std::string::npos);
  EXPECT_LE(big.qkv.split_k, t.qkv.split_k);
}

// At 8 activation rows (B <= 4) a stage is 256 columns: 64 KiB of weights a copy (an SM's bulk copies
// finish at about a fixed rate per copy); 128 above, 64 from 128 rows.
TEST(StepGraph, WideStagesAtEightRows) {
  const ModelConfig c = named_config("qwen2-0.5b");  // hidden 896: its tiles' last stage holds 2 of 4 atoms
  const StepTiling t = plan_step_tiling(c, 4, 132);
  for (const Tiling* x : {&t.qkv, &t.o_proj, &t.gate_up, &t.down, &t.lm_head}) {
    EXPECT_EQ(x->bm, 8);
    EXPECT_EQ(x->bk, 256);
  }
  EXPECT_EQ(plan_step_tiling(c, 5, 132).qkv.bk, 192);   // 16 rows
  EXPECT_EQ(plan_step_tiling(c, 16, 132).qkv.bk, 192);  // 32 rows
  EXPECT_EQ(plan_step_tiling(c, 33, 132).qkv.bk, 128);  // 64 rows
  EXPECT_EQ(plan_step_tiling(c, 100, 132).qkv.bk, 64);  // 128 rows
}

// Where o_proj's consumers merge the attention's split pairs (one float4 of its K slice a thread), as
// measured on the H200 in session 36 (decode_step_oproj_merge_ab.json: these took the merge, Llama-3-8B
// B = 2 and 4 did not).
TEST(StepGraph, OprojMergesSplitPairsWhereItsSliceFits) {
  auto merges = [](const char* model, int batch, int max_batch = kOprojMergeMaxBatch) {
    const ModelConfig c = named_config(model);
    DecodeStepShape s;
    s.batch = batch;
    s.max_seq_len = 1024;
    const StepGraph g = build_step_graph(c, s, std::vector<int>(batch, 100), {}, plan_step_tiling(c, batch, 132));
    EXPECT_EQ(oproj_slice_cols(g) % g.graph.op(g.layers[0].op_o_proj).tiling.bk, 0) << model;  // whole stages
    return oproj_merges_pairs(g, batch, max_batch);
  };
  EXPECT_TRUE(merges("llama-3.2-1b", 1));
  EXPECT_TRUE(merges("llama-3.2-1b", 2));
  EXPECT_TRUE(merges("llama-3.2-1b", 4));
  EXPECT_TRUE(merges("llama-3-8b", 1));
  EXPECT_TRUE(merges("qwen2-0.5b", 1));
  EXPECT_TRUE(merges("qwen2-7b", 1));
  EXPECT_FALSE(merges("llama-3-8b", 2));    // 2 x 1024 columns
  EXPECT_FALSE(merges("llama-3-8b", 4));
  EXPECT_FALSE(merges("llama-3.2-1b", 16)); // 16 x its slice
  EXPECT_FALSE(merges("llama-3.2-1b", 40)); // 64-row tiles
  EXPECT_FALSE(merges("llama-3.2-1b", 1, 0));  // switched off
}

// Gate/up of more tiles than SMs: the last partial wave in K slices, the whole waves' tiles unsplit,
// where the slices' rounds cost under 3/4 of an unsplit tile (plan_step_tiling).
TEST(StepGraph, LastWaveInSlices) {
  ModelConfig c = named_config("llama-3.2-1b");
  c.intermediate_size = 11008;  // Qwen2.5-3B's: 172 tiles of 64 columns, 40 past one wave
  const StepTiling t = plan_step_tiling(c, 1, 132);
  // 16 stages a tile: 3 slices (6, 6, 4 stages) cost one round of 16 / 3 + 3 < 12; 4 would take two.
  EXPECT_EQ(t.gate_up.split_k, 3);
  EXPECT_EQ(t.gate_up_whole, 132);
  EXPECT_EQ(plan_step_tiling(c, 1, 132, 0, 1, 0).gate_up.split_k, 1);
  EXPECT_EQ(plan_step_tiling(c, 1, 132, 0, 1, 0).gate_up_whole, 0);
  EXPECT_EQ(plan_step_tiling(c, 1, 132, 2).gate_up.split_k, 2);  // the cap holds: 1 round of 8 + 3
  EXPECT_EQ(plan_step_tiling(c, 100, 132).gate_up.split_k, 3);   // 64-column stages: 32 a tile
  // One wave (Llama-3.2-1B, 128 tiles), or a last wave too large to gain (Llama-3-8B: 92 of 224
  // tiles, 32 stages: 4 slices take 3 rounds of 8 + 3): unsplit.
  EXPECT_EQ(plan_step_tiling(named_config("llama-3.2-1b"), 1, 132).gate_up_whole, 0);
  EXPECT_EQ(plan_step_tiling(named_config("llama-3-8b"), 1, 132).gate_up.split_k, 1);
  EXPECT_EQ(plan_step_tiling(named_config("llama-3-8b"), 1, 132).gate_up_whole, 0);
  const StepTiling q7 = plan_step_tiling(named_config("qwen2-7b"), 1, 132);  // 296 tiles, 32 past two waves
  EXPECT_EQ(q7.gate_up.split_k, 4);
  EXPECT_EQ(q7.gate_up_whole, 264);
  EXPECT_EQ(plan_step_tiling(c, 1, 172).gate_up_whole, 0);  // as many SMs as tiles

  // The executor's plan: those tiles' slices as one ticket each; every wait still after every signal
  // of its counter, and each counter's signals (a whole ticket publishes all its slices') as many as
  // its waiters count.
  DecodeStepShape s;
  s.batch = 1;
  s.max_seq_len = 64;
  c.num_layers = 2;
  const StepGraph g = build_step_graph(c, s, {10}, {}, t);
  const TileGraph& G = g.graph;
  ExecPlan plan = make_exec_plan(G, make_order(G, "kslices/col_major"), step_sync_policy(g));
  const ExecPlan before = plan;
  const std::set<int> gate_up{g.layers[0].op_gate_up, g.layers[1].op_gate_up};
  const auto moved = run_slices_whole(plan, G, [&](const Tile& x) { return gate_up.count(x.op) && x.tn < 132; });
  const int n = int(before.order.size());
  ASSERT_EQ(int(moved.size()), n + 1);
  EXPECT_EQ(int(plan.order.size()), n - 2 * 132 * 2);
  EXPECT_EQ(moved[n], int(plan.order.size()));
  EXPECT_TRUE(std::is_sorted(moved.begin(), moved.end()));
  std::vector<int> at(G.num_tiles(), -1);
  for (int i = 0; i < int(plan.order.size()); ++i) at[plan.order[i]] = i;
  std::vector<int> last(plan.num_signal_counters, -1);
  std::vector<uint32_t> signals(plan.num_signal_counters, 0);
  for (int i = 0; i < int(plan.order.size()); ++i) {
    const DeviceTile& d = plan.tiles[plan.order[i]];
    const Op& o = G.op(d.op);
    const bool whole = o.tiling.split_k > 1 && d.arrive < 0;
    EXPECT_EQ(whole, gate_up.count(d.op) && d.tn < 132) << "ticket " << i;
    signals[d.signal] += whole ? uint32_t(o.tiling.split_k) : 1u;
    last[d.signal] = i;
  }
  for (int i = 0; i < int(plan.order.size()); ++i) {
    const DeviceTile& d = plan.tiles[plan.order[i]];
    for (int w = d.wait_begin; w < d.wait_end; ++w) {
      EXPECT_LT(last[plan.waits[w].counter], i) << "ticket " << i << " waits for a later one";
      EXPECT_EQ(signals[plan.waits[w].counter], plan.waits[w].count);
    }
  }
  for (int l = 0; l < 2; ++l) {
    const int op = g.layers[l].op_gate_up;
    const int head = G.tile_id(op, 0, 0, 0), tail = int(G.op(op).grid_n) - 1;
    EXPECT_EQ(at[head], moved[before_position(before, head)]);  // at its first slice's place
    EXPECT_EQ(plan.tiles[head].wait_end - plan.tiles[head].wait_begin,
              before.tiles[head].wait_end - before.tiles[head].wait_begin);  // the slices wait alike
    for (int64_t ks = 1; ks < 3; ++ks) {
      EXPECT_EQ(at[G.tile_id(op, 0, 0, ks)], -1);      // folded into slice 0's ticket
      EXPECT_GE(at[G.tile_id(op, 0, tail, ks)], 0);    // a last-wave slice
      EXPECT_GE(plan.tiles[G.tile_id(op, 0, tail, ks)].arrive, 0);
    }
  }
  EXPECT_NE(error_of([&] {
              ExecPlan u = before;
              u.units = {0, 1};
              run_slices_whole(u, G, [](const Tile&) { return true; });
            }).find("units"),
            std::string::npos);
}

TEST(StepGraph, TrafficModelNearTheFloor) {
  for (const char* name : {"tiny-llama", "tiny-qwen2"}) {
    const ModelConfig c = named_config(name);
    DecodeStepShape s;
    s.batch = 2;
    s.max_seq_len = 256;
    s.layout = KvLayout::Paged;
    s.page_size = 32;
    std::vector<int> table(size_t(s.batch) * s.pages_per_seq());
    for (size_t i = 0; i < table.size(); ++i) table[i] = int(table.size() - 1 - i);
    const std::vector<int> lens{100, 200};
    const StepGraph g = build_step_graph(c, s, lens, table, plan_step_tiling(c, s.batch, 132));
    CacheConfig cc;
    cc.capacity_bytes = 1 << 20;  // smaller than the weights: nothing is read twice for free
    cc.in_flight = 132;
    const TrafficReport r = simulate(g.graph, make_order(g.graph, "kslices/col_major"), cc);
    const int64_t floor = step_floor_bytes(c, lens);
    // Every weight and K/V byte at least once, less the norms (folded away) and the 16-token unit of
    // K/V holding each appended row (written by the QKV tiles, so the model finds it in the cache),
    // and little more: activations, partial sums and whole 16-token units of K/V.
    const int64_t folded = (2 * c.num_layers + 1) * c.hidden_size * 2;
    const int64_t appended = int64_t(c.num_layers) * s.batch * c.kv_dim() * 16 * 2 * 2;
    EXPECT_GE(r.dram_read, floor - folded - appended) << name;
    EXPECT_LE(r.dram_read, floor * 1.25) << name;
  }
}

// A tensor-parallel step's collectives, per rank: two all-reduces of the fp32 stream per layer and the
// LM head's maxima gathered once; ring link bytes.
TEST(StepGraph, TensorParallelCollectives) {
  const ModelConfig c = named_config("llama-3-70b");
  const StepCollectives k = step_collectives(c, 2, 1);
  EXPECT_EQ(k.all_reduces, 160);
  EXPECT_EQ(k.all_reduce_bytes, 8192 * 4);
  EXPECT_EQ(k.max_reduces, 1);
  EXPECT_EQ(k.max_reduce_bytes, 8);
  EXPECT_EQ(k.link_bytes, 160 * 32768 + 8);  // 2 (tp - 1) / tp of each message
  EXPECT_EQ(step_collectives(c, 1, 4).all_reduces, 0);
  EXPECT_EQ(step_collectives(c, 4, 16).link_bytes, 160 * (6 * 16 * 8192 * 4 / 4) + 6 * 16 * 8 / 4);
  // A rank's graph: the shard's step with an all-reduce after every o_proj and down, between them and
  // their consumers, moving what step_collectives counts for them.
  const ModelConfig tiny = named_config("tiny-llama");
  const ModelConfig shard = tensor_parallel_shard(tiny, 2);
  DecodeStepShape s;
  s.batch = 3;
  s.max_seq_len = 64;
  s.tp = 2;
  const StepGraph g = build_step_graph(shard, s, {10, 20, 30}, {}, plan_step_tiling(shard, 3, 132));
  const StepCollectives want = step_collectives(tiny, 2, 3);
  EXPECT_EQ(g.graph.link_bytes(), want.link_bytes);
  ASSERT_GE(g.op_maxima_reduce, 0);
  EXPECT_EQ(g.graph.op(g.op_maxima_reduce).c, g.maxima);
  // The rank's launches: one per segment between collectives, in the step's default order.
  const Schedule sched = make_order(g.graph, "kslices/col_major");
  const std::vector<StepSegment> seg = step_segments(g, sched);
  ASSERT_EQ(seg.size(), size_t(2 * tiny.num_layers + 2));
  EXPECT_EQ(seg.front().begin, 0);
  EXPECT_EQ(seg.back().end, g.graph.num_tiles());
  EXPECT_EQ(seg.back().collective, -1);
  EXPECT_EQ(seg[seg.size() - 2].collective, g.op_maxima_reduce);
  EXPECT_EQ(seg[0].collective, g.layers[0].op_o_proj_reduce);
  EXPECT_EQ(seg[1].collective, g.layers[0].op_down_reduce);
  for (size_t i = 0; i + 1 < seg.size(); ++i)
    EXPECT_EQ(seg[i + 1].begin - seg[i].end, g.graph.op(seg[i].collective).num_tiles);
  EXPECT_EQ(g.graph.tile(sched.order[seg.back().begin]).op, g.op_sample);
  // A collective whose tiles are not one run of tickets is refused by name.
  // (Its first tile moved to right after the o_proj tiles it reads: a topological order still.)
  Schedule split = sched;
  const int ar0 = split.order[seg[0].end];
  split.order.erase(split.order.begin() + seg[0].end);
  int last_reader = -1;
  for (int i = 0; i < seg[0].end; ++i) {
    const Tile& t = g.graph.tile(split.order[i]);
    if (t.op == g.layers[0].op_o_proj && t.tn == 0) last_reader = i;
  }
  ASSERT_LT(last_reader + 1, seg[0].end);  // d 256: two collective tiles, o_proj tiles of tn 1 after tn 0's
  split.order.insert(split.order.begin() + last_reader + 1, ar0);
  EXPECT_NO_THROW(validate(g.graph, split));
  EXPECT_NE(error_of([&] { step_segments(g, split); }).find("o_proj.all_reduce"), std::string::npos);
  for (const auto& L : g.layers) {
    ASSERT_GE(L.op_o_proj_reduce, 0);
    const Op& r = g.graph.op(L.op_o_proj_reduce);
    EXPECT_EQ(r.kind, OpKind::AllReduce);
    EXPECT_EQ(r.c, L.x_mid);
    // gate/up waits for the reduction, which waits for o_proj.
    const Tile& gu = g.graph.tile(g.graph.op(L.op_gate_up).first_tile);
    for (int d : gu.deps) EXPECT_NE(g.graph.tile(d).op, L.op_o_proj);
    bool on_reduce = false;
    for (int d : gu.deps) on_reduce |= g.graph.tile(d).op == L.op_o_proj_reduce;
    EXPECT_TRUE(on_reduce);
    EXPECT_GE(L.op_down_reduce, 0);
  }
  s.tp = 0;
  EXPECT_NE(error_of([&] { build_step_graph(shard, s, {10, 20, 30}, {}, plan_step_tiling(shard, 3, 132)); }).find("ranks 0"),
            std::string::npos);
}

TEST(StepGraph, BadInputNamesTheValue) {
  const ModelConfig c = named_config("tiny-llama");
  const StepTiling t = plan_step_tiling(c, 2, 132);
  DecodeStepShape s;
  s.batch = 2;
  s.max_seq_len = 32;
  EXPECT_NE(error_of([&] { build_step_graph(c, s, {1}, {}, t); }).find("seq_lens has 1 entries"), std::string::npos);
  EXPECT_NE(error_of([&] { build_step_graph(c, s, {1, 32}, {}, t); }).find("max_seq_len 32"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_step_tiling(c, 0, 132); }).find("batch 0"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_step_tiling(c, 300, 132); }).find("batch 300"), std::string::npos);
  ModelConfig window = c;  // a sliding-window model: caches up to the window only
  window.sliding_window = 16;
  const std::string e = error_of([&] { build_step_graph(window, s, {1, 2}, {}, t); });
  EXPECT_NE(e.find("max_seq_len 32"), std::string::npos) << e;
  EXPECT_NE(e.find("sliding_window 16"), std::string::npos) << e;
  DecodeStepShape within = s;
  within.max_seq_len = 16;
  EXPECT_NO_THROW(build_step_graph(window, within, {1, 2}, {}, t));
  ModelConfig odd = c;
  odd.head_dim = 96;
  EXPECT_NE(error_of([&] { build_step_graph(odd, s, {1, 2}, {}, t); }).find("head_dim 96"), std::string::npos);
}

}  // namespace
}  // namespace tw
