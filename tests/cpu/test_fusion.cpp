// The fusion report (model/fusion.hpp): every class on a graph whose answer is worked out by hand,
// then the FFN chain, attention -> o_proj and a whole decode step.
#include <gtest/gtest.h>

#include <set>

#include "tileweave/graph/attention_graph.hpp"
#include "tileweave/graph/step_graph.hpp"
#include "tileweave/model/fusion.hpp"

using namespace tw;

namespace {

FusionEdge edge(const std::vector<FusionEdge>& es, int producer, int consumer, int tensor) {
  for (const FusionEdge& e : es)
    if (e.producer == producer && e.consumer == consumer && e.tensor == tensor) return e;
  throw std::runtime_error("no edge " + std::to_string(producer) + " -> " + std::to_string(consumer) + " via tensor " +
                           std::to_string(tensor));
}

// C1 = A B1^T (64x64 tiles), then C2 = A2 B2^T + C1 with `tiling`: C1 is the residual of GEMM 2.
struct TwoGemms {
  TileGraph g;
  int c1 = -1, op1 = -1, op2 = -1;
};
TwoGemms residual_chain(const Tiling& second) {
  TwoGemms t;
  const int a = t.g.add_tensor("a", 256, 64, 2, TensorRole::Input);
  const int b1 = t.g.add_tensor("b1", 256, 64, 2, TensorRole::Weight);
  t.c1 = t.g.add_tensor("c1", 256, 256, 2, TensorRole::Intermediate);
  const int a2 = t.g.add_tensor("a2", 256, 64, 2, TensorRole::Input);
  const int b2 = t.g.add_tensor("b2", 256, 64, 2, TensorRole::Weight);
  const int c2 = t.g.add_tensor("c2", 256, 256, 2, TensorRole::Output);
  t.op1 = t.g.add_gemm("gemm1", a, b1, t.c1, {64, 64, 64, 1});
  t.op2 = t.g.add_gemm("gemm2", a2, b2, c2, second, t.c1);
  return t;
}

}  // namespace

// Same tiling: tile (i, j) of GEMM 2 reads exactly the block tile (i, j) of GEMM 1 wrote.
TEST(Fusion, SameTilingResidualIsOneToOne) {
  const TwoGemms t = residual_chain({64, 64, 64, 1});
  const auto es = fusion_report(t.g);
  ASSERT_EQ(es.size(), 1u);
  const FusionEdge& e = es[0];
  EXPECT_EQ(e.cls, EdgeClass::OneToOne);
  EXPECT_EQ(e.pairs, 16);
  EXPECT_EQ(e.fan_in_max, 1);
  EXPECT_EQ(e.fan_out_max, 1);
  EXPECT_DOUBLE_EQ(e.reads_per_element, 1.0);
  EXPECT_FALSE(e.barrier);
}

// 128x128 tiles over 64x64 ones: each consumer reads a 2x2 block of producer tiles, each element once.
TEST(Fusion, RetiledResidualIsReorganize) {
  const TwoGemms t = residual_chain({128, 128, 64, 1});
  const FusionEdge& e = edge(fusion_report(t.g), t.op1, t.op2, t.c1);
  EXPECT_EQ(e.cls, EdgeClass::Reorganize);
  EXPECT_EQ(e.fan_in_min, 4);
  EXPECT_EQ(e.fan_in_max, 4);
  EXPECT_EQ(e.fan_out_max, 1);
  EXPECT_DOUBLE_EQ(e.reads_per_element, 1.0);
}

// Split-K 2 on the consumer: both slices read the residual (either may finish last), so every element
// is read twice by consumer tiles that each wait on one producer tile: one-to-many.
TEST(Fusion, SplitKConsumerReadsTheResidualTwice) {
  const TwoGemms t = residual_chain({64, 64, 32, 2});
  const FusionEdge& e = edge(fusion_report(t.g), t.op1, t.op2, t.c1);
  EXPECT_EQ(e.cls, EdgeClass::OneToMany);
  EXPECT_DOUBLE_EQ(e.reads_per_element, 2.0);
  EXPECT_EQ(e.fan_out_max, 2);
}

// The unfused FFN: a[M, 2F] = x Wgu^T, h = silu(a[:, :F]) * a[:, F:], y = h Wd^T. A SiLU*mul tile
// reads column block j of both halves: producer tiles j and F/bn + j, not neighbours -- a shuffle.
// The down GEMM reads whole K panels of h: many-to-many.
TEST(Fusion, UnfusedFfnShuffleThenManyToMany) {
  TileGraph g;
  const int64_t m = 128, d = 128, f = 256;
  const int x = g.add_tensor("x", m, d, 2, TensorRole::Input);
  const int wgu = g.add_tensor("w_gate_up", 2 * f, d, 2, TensorRole::Weight);
  const int a = g.add_tensor("a", m, 2 * f, 2, TensorRole::Intermediate);
  const int h = g.add_tensor("h", m, f, 2, TensorRole::Intermediate);
  const int wd = g.add_tensor("w_down", d, f, 2, TensorRole::Weight);
  const int y = g.add_tensor("y", m, d, 2, TensorRole::Output);
  const int gemm = g.add_gemm("gate_up", x, wgu, a, {64, 64, 64, 1});
  const int silu = g.add_silu_mul("silu_mul", a, h, 64, 64);
  const int down = g.add_gemm("down", h, wd, y, {64, 64, 64, 1});
  const auto es = fusion_report(g);
  ASSERT_EQ(es.size(), 2u);
  const FusionEdge& s = edge(es, gemm, silu, a);
  EXPECT_EQ(s.cls, EdgeClass::Shuffle);
  EXPECT_EQ(s.fan_in_max, 2);
  EXPECT_EQ(s.fan_out_max, 1);
  EXPECT_DOUBLE_EQ(s.reads_per_element, 1.0);
  const FusionEdge& md = edge(es, silu, down, h);
  EXPECT_EQ(md.cls, EdgeClass::ManyToMany);
  EXPECT_EQ(md.fan_in_max, 4);             // a row of h's 4 column blocks
  EXPECT_EQ(md.fan_out_max, 2);            // read by the down tiles of its row (d / 64 = 2)
  EXPECT_DOUBLE_EQ(md.reads_per_element, 2.0);
  EXPECT_FALSE(md.barrier);                // two row blocks: the second row's tiles can wait
}

// The fused FFN (gated, d 512, ffn 1024, M 256, 128x128 tiles): a down tile reads its row block of h
// over all of K: the 8 gate/up tiles of that row (of 16); each gate/up tile feeds the 4 down tiles of
// its row, which read each h element 4 times. With one row block (M = 128) a down tile waits on all
// gate/up tiles: a barrier.
TEST(Fusion, FfnChain) {
  FfnGraph f = build_ffn_graph({256, 512, 1024, true}, {{128, 128, 64, 1, {}}, {128, 128, 64, 1, {}}});
  auto es = fusion_report(f.graph);
  ASSERT_EQ(es.size(), 1u);
  const FusionEdge& e = edge(es, f.op_gate_up, f.op_down, f.h);
  EXPECT_EQ(e.cls, EdgeClass::ManyToMany);
  EXPECT_EQ(e.producer_tiles, 16);
  EXPECT_EQ(e.fan_in_min, 8);
  EXPECT_EQ(e.fan_in_max, 8);
  EXPECT_EQ(e.fan_out_max, 4);
  EXPECT_DOUBLE_EQ(e.reads_per_element, 4.0);
  EXPECT_FALSE(e.barrier);
  // Split-K 2 on down: each slice reads half of K, so it waits on 4 gate/up tiles.
  FfnGraph k2 = build_ffn_graph({256, 512, 1024, true}, {{128, 128, 64, 1, {}}, {128, 128, 64, 2, {}}});
  EXPECT_EQ(edge(fusion_report(k2.graph), k2.op_gate_up, k2.op_down, k2.h).fan_in_max, 4);
  FfnGraph one_row = build_ffn_graph({128, 512, 1024, true}, {{128, 128, 64, 1, {}}, {128, 128, 64, 1, {}}});
  EXPECT_TRUE(edge(fusion_report(one_row.graph), one_row.op_gate_up, one_row.op_down, one_row.h).barrier);
}

// Decode attention -> o_proj (Llama-3-8B heads, 4 sequences of 1024): o_proj reads all heads of its
// rows, and all 4 rows are one row block, so without split-K every o_proj tile waits on every
// attention tile; with 4 K slices a slice reads 8 of the 32 query heads (2 of 8 KV heads), so it
// waits only on the attention tiles of those pairs. Each element of O is read by every o_proj
// tile column (the op's grid_n of them).
TEST(Fusion, AttentionToOproj) {
  DecodeAttentionShape s;
  s.batch = 4;
  s.max_seq_len = 1024;
  s.tiles_per_sm = 2;
  const std::vector<int> lens(4, 1024);
  const DecodePlan plan = plan_decode_for(s, lens, 132);
  for (int split : {1, 4}) {
    const Tiling t = attention_oproj_tiling(s, 4096, split);
    const AttentionOprojGraph a = build_attention_oproj_graph(s, lens, {}, plan, 4096, t, false);
    const auto es = fusion_report(a.graph);
    ASSERT_EQ(es.size(), 1u) << split;
    const FusionEdge& e = es[0];
    EXPECT_EQ(e.cls, EdgeClass::ManyToMany) << split;
    EXPECT_DOUBLE_EQ(e.reads_per_element, double(a.graph.op(1).grid_n)) << split;
    EXPECT_EQ(e.barrier, split == 1) << split;
    if (split == 4) EXPECT_LT(e.fan_in_max, e.producer_tiles / 2);
  }
}

// A whole decode step (tiny-llama, 2 layers): the report covers exactly the op pairs the tiles'
// dependencies connect, and each kind of edge gets its class.
TEST(Fusion, DecodeStep) {
  const ModelConfig c = named_config("tiny-llama");
  DecodeStepShape s;
  s.batch = 2;
  s.max_seq_len = 64;
  const StepGraph g = build_step_graph(c, s, {10, 30}, {}, plan_step_tiling(c, s.batch, 132));
  const auto es = fusion_report(g.graph);
  std::set<std::pair<int, int>> from_deps, from_report;
  for (const Tile& t : g.graph.tiles())
    for (int d : t.deps) from_deps.insert({g.graph.tile(d).op, t.op});
  for (const FusionEdge& e : es) from_report.insert({e.producer, e.consumer});
  EXPECT_EQ(from_deps, from_report);
  for (int l = 0; l < c.num_layers; ++l) {
    const auto& L = g.layers[l];
    // The KV append: each new K row is read once, by the attention tile of its pair.
    EXPECT_EQ(edge(es, L.op_qkv, L.op_attention, L.k_cache).cls, EdgeClass::Reorganize);
    EXPECT_EQ(edge(es, L.op_qkv, L.op_attention, L.k_cache).fan_in_max, 1);
    EXPECT_EQ(edge(es, L.op_attention, L.op_o_proj, L.attn).cls, EdgeClass::ManyToMany);
    // gate/up reads whole rows of the stream (its norm needs their sums of squares): a barrier on o_proj.
    EXPECT_TRUE(edge(es, L.op_o_proj, L.op_gate_up, L.x_mid).barrier);
    EXPECT_EQ(edge(es, L.op_gate_up, L.op_down, L.h).cls, EdgeClass::ManyToMany);
  }
  // The embedding is one tile whose rows every QKV tile reads.
  EXPECT_EQ(edge(es, g.op_embed, g.layers[0].op_qkv, g.layers[0].x).cls, EdgeClass::OneToMany);
}
