// Decode attention on the host: the stream-K plan, the attention op's tiles in a TileGraph, and the
// attention -> o_proj graph (dependencies, schedules, executor plan, traffic model, bounds, search).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "tileweave/graph/attention_graph.hpp"
#include "tileweave/kernels/attention/decode_units.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/order/bounds.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/order/search.hpp"
#include "tileweave/runtime/exec_plan.hpp"

using namespace tw;

namespace {

// Llama-3-8B-like attention heads, odd lengths and a hidden size that is not a tile multiple.
DecodeAttentionShape contiguous_shape(const std::vector<int>& lens, int hq, int hkv, int d) {
  DecodeAttentionShape s;
  s.batch = static_cast<int>(lens.size());
  s.num_q_heads = hq;
  s.num_kv_heads = hkv;
  s.head_dim = d;
  s.max_seq_len = *std::max_element(lens.begin(), lens.end()) + 5;
  return s;
}

// A paged shape with the pages of all sequences dealt in a shuffled order.
DecodeAttentionShape paged_shape(const std::vector<int>& lens, int hq, int hkv, int d, int page, std::vector<int>& table) {
  DecodeAttentionShape s = contiguous_shape(lens, hq, hkv, d);
  s.layout = KvLayout::Paged;
  s.max_seq_len = 0;
  s.page_size = page;
  s.pages_per_seq = (*std::max_element(lens.begin(), lens.end()) + page - 1) / page;
  s.num_pages = s.batch * s.pages_per_seq + 3;
  std::vector<int> perm(s.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(11));
  table.assign(size_t(s.batch) * s.pages_per_seq, 0);
  for (size_t i = 0; i < table.size(); ++i) table[i] = perm[i];
  return s;
}

// The attention tiles a consumer of O[rows, cols) must wait for, by brute force over the plan:
// every tile holding a unit of a pair (b, h) whose output columns [h*G*D, (h+1)*G*D) meet cols.
std::vector<int> covering_tiles(const DecodeAttentionShape& s, const DecodePlan& pl, int first_tile, int64_t r0,
                                int64_t r1, int64_t c0, int64_t c1) {
  const int G = s.num_q_heads / s.num_kv_heads, D = s.head_dim;
  std::set<int> out;
  for (int b = int(r0); b < r1; ++b)
    for (int h = 0; h < s.num_kv_heads; ++h) {
      if (int64_t(h + 1) * G * D <= c0 || int64_t(h) * G * D >= c1) continue;
      const int pair = b * s.num_kv_heads + h;
      for (int u = pl.pair_info[2 * pair]; u < pl.pair_info[2 * (pair + 1)]; ++u)
        out.insert(first_tile + kernels::decode_tile_of(u, pl.num_tiles, pl.total_units));
    }
  return {out.begin(), out.end()};
}

void check_deps(const AttentionOprojGraph& g, const DecodeAttentionShape& s, const DecodePlan& pl) {
  const TileGraph& G = g.graph;
  const Op& attn = G.op(g.op_attention);
  const Op& oproj = G.op(g.op_oproj);
  ASSERT_EQ(attn.num_tiles, pl.num_tiles);
  for (int i = attn.first_tile; i < attn.first_tile + attn.num_tiles; ++i) EXPECT_TRUE(G.tile(i).deps.empty());
  for (int i = oproj.first_tile; i < oproj.first_tile + oproj.num_tiles; ++i) {
    const Tile& t = G.tile(i);
    const Region& o = t.reads[0];
    ASSERT_EQ(o.tensor, g.attn.out);
    EXPECT_EQ(t.deps, covering_tiles(s, pl, attn.first_tile, o.r0, o.r1, o.c0, o.c1)) << "o_proj tile " << i;
  }
}

int64_t tensor_bytes_read(const TrafficReport& r, int tensor) { return r.per_tensor.at(tensor).dram_read; }

}  // namespace

// The stream-K plan: every tile gets the same units to one, the pair table is a prefix sum, and
// tile_first names the pair holding each tile's first unit.
TEST(DecodePlan, CutsUnitsEvenly) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int> lens(1 + rng() % 40);
    for (auto& l : lens) l = 1 + int(rng() % (rng() % 2 ? 40 : 20000));
    const int hkv = 1 + int(rng() % 8), want_tiles = 1 + int(rng() % 300);
    const DecodePlan pl = plan_decode(lens, hkv, want_tiles);
    const int npairs = int(lens.size()) * hkv;
    int units = 0;
    for (int i = 0; i < npairs; ++i) {
      ASSERT_EQ(pl.pair_info[2 * i], units);
      ASSERT_EQ(pl.pair_info[2 * i + 1], lens[i / hkv]);
      units += (lens[i / hkv] + 15) / 16;
    }
    ASSERT_EQ(pl.pair_info[2 * npairs], units);
    ASSERT_EQ(pl.total_units, units);
    ASSERT_EQ(pl.num_tiles, std::min(want_tiles, units));
    int lo = INT32_MAX, hi = 0;
    for (int c = 0; c < pl.num_tiles; ++c) {
      const int u0 = kernels::decode_tile_start(c, pl.num_tiles, units);
      const int u1 = kernels::decode_tile_start(c + 1, pl.num_tiles, units);
      lo = std::min(lo, u1 - u0);
      hi = std::max(hi, u1 - u0);
      const int pair = pl.tile_first[4 * c];
      ASSERT_LE(pl.pair_info[2 * pair], u0);
      ASSERT_GT(pl.pair_info[2 * (pair + 1)], u0);
      ASSERT_EQ(pl.tile_first[4 * c + 1], pl.pair_info[2 * pair]);
      ASSERT_EQ(pl.tile_first[4 * c + 2], pl.pair_info[2 * (pair + 1)]);
      ASSERT_EQ(pl.tile_first[4 * c + 3], lens[pair / hkv]);
      ASSERT_EQ(kernels::decode_tile_of(u0, pl.num_tiles, units), c);
      ASSERT_EQ(kernels::decode_tile_of(u1 - 1, pl.num_tiles, units), c);
    }
    EXPECT_GE(lo, 1);
    EXPECT_LE(hi - lo, 1);
  }
}

// The executor's tile list: tiles in order, their pair ranges overlapping by at most the pair
// they share, together covering every pair.
TEST(DecodePlan, TilesCoverEveryPair) {
  DecodeAttentionShape s = contiguous_shape({70000, 3, 900}, 8, 2, 128);
  const auto tiles = decode_tile_descs(plan_decode_for(s, {70000, 3, 900}, 132));
  EXPECT_EQ(tiles.front().pair_begin, 0);
  EXPECT_EQ(tiles.back().pair_end, 6);
  for (size_t i = 0; i < tiles.size(); ++i) {
    EXPECT_EQ(tiles[i].tile, int(i));
    EXPECT_LT(tiles[i].pair_begin, tiles[i].pair_end);
    if (i > 0) EXPECT_GE(tiles[i].pair_begin, tiles[i - 1].pair_end - 1);
    if (i > 0) EXPECT_LE(tiles[i].pair_begin, tiles[i - 1].pair_end);
  }
}

// Head layouts the op takes: 1..16 query heads per KV head, head dim 64, 128 or 256; the rest is
// refused by name.
TEST(DecodePlan, ValidationTakesEveryHeadLayout) {
  const std::vector<int> lens = {17, 300};
  for (int d : {64, 128, 256})
    for (int g : {1, 7, 8, 9, 13, 16}) EXPECT_NO_THROW(validate_decode_attention(contiguous_shape(lens, 2 * g, 2, d), lens, {}));
  auto message = [&](const DecodeAttentionShape& s) {
    try {
      validate_decode_attention(s, lens, {});
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(contiguous_shape(lens, 34, 2, 128)).find("group size 17"), std::string::npos);
  EXPECT_NE(message(contiguous_shape(lens, 8, 2, 96)).find("head_dim 96"), std::string::npos);
  EXPECT_NE(message(contiguous_shape(lens, 8, 2, 512)).find("head_dim 512"), std::string::npos);
}

// What a plan does, worked out by hand: B = 1, 8 KV heads, L = 4096 on 132 SMs is 8 pairs of 16
// tiles each (aligned, one per SM: 128 tiles, 8 warps); every pair is merged from 16 partials of
// 4 x 128 floats + 4 LSEs (2064 bytes). 64 sequences of 512 tokens with 8 KV heads (512 pairs, more
// than the slots): whole pairs per tile, no partials. Head dim 256 runs 4 warps.
TEST(DecodePlan, SummaryCountsPartialsAndMerges) {
  const std::vector<int> one(1, 4096);
  const DecodeAttentionShape s = contiguous_shape(one, 32, 8, 128);
  const DecodePlanSummary m = summarize_decode_plan(s, one, plan_decode_for(s, one, 132));
  EXPECT_EQ(m.pairs, 8);
  EXPECT_EQ(m.tiles, 128);
  EXPECT_EQ(m.tiles_per_sm, 1);
  EXPECT_EQ(m.warps, 8);
  EXPECT_EQ(m.units_per_tile, 16);  // 256 units a pair over 16 tiles
  EXPECT_EQ(m.split_pairs, 8);
  EXPECT_EQ(m.partials, 128);
  EXPECT_EQ(m.widest_pair_tiles, 16);
  EXPECT_EQ(m.kv_bytes, int64_t(4096) * 8 * 128 * 2 * 2);
  EXPECT_EQ(m.partial_bytes, 2 * 128 * 2064);
  EXPECT_EQ(m.widest_merge_bytes, 16 * 2064);

  const std::vector<int> many(64, 512);
  const DecodeAttentionShape w = contiguous_shape(many, 32, 8, 128);
  const DecodePlanSummary n = summarize_decode_plan(w, many, plan_decode_for(w, many, 132));
  EXPECT_EQ(n.split_pairs, 0);
  EXPECT_EQ(n.partials, 0);
  EXPECT_EQ(n.widest_pair_tiles, 1);
  EXPECT_EQ(n.widest_merge_bytes, 0);
  EXPECT_EQ(n.partial_bytes, 0);

  const DecodeAttentionShape d256 = contiguous_shape(one, 8, 1, 256);
  EXPECT_EQ(summarize_decode_plan(d256, one, plan_decode_for(d256, one, 132)).warps, 4);
  EXPECT_EQ(decode_tile_warps(128, 2), 4);
}

// The cost model, worked by hand from DecodeCostModel's constants: one pair of 32 units (512 tokens,
// head dim 128) on 2 tiles of 16 units at one tile per SM: 2 of 132 SMs active, each at the SM's most
// (sm_gbps; the GPU's share, read_tbps x 0.54 x (2 / 33) / 2, is more), so the widest tile streams
// 16 x 16 x 128 x 4 bytes at that rate; the pair is merged from 2 partials of 4 x 128 + 4 floats.
TEST(DecodePlan, CostModelWorkedByHand) {
  const std::vector<int> one(1, 512);
  const DecodeAttentionShape s = contiguous_shape(one, 4, 1, 128);
  const DecodeCostModel m;
  const DecodeCost c = predict_decode_cost(s, one, 2, 1, 132);
  EXPECT_EQ(c.max_units, 16);
  EXPECT_EQ(c.max_segments, 1);
  EXPECT_EQ(c.widest_pair, 2);
  const double stream = m.stream_scale * 16 * 16 * 128 * 4 / (m.sm_gbps * 1e3);
  const double merge = m.merge_us + m.merge_us_per_kb * 2 * (4 * 128 + 4) * 4 / 1e3;
  EXPECT_NEAR(c.stream_us, stream, 1e-9);
  EXPECT_NEAR(c.merge_us, merge, 1e-9);
  EXPECT_NEAR(c.us, m.base_us + stream + merge, 1e-9);
  // One tile: no merge; two tiles per SM halve a tile's rate.
  EXPECT_EQ(predict_decode_cost(s, one, 1, 1, 132).merge_us, 0);
  EXPECT_NEAR(predict_decode_cost(s, one, 2, 2, 132).stream_us, 2 * stream, 1e-9);
  // Every SM streaming: each gets the GPU's rate over 132.
  const std::vector<int> wide(1, 132 * 16 * 8);
  const DecodeCost all = predict_decode_cost(contiguous_shape(wide, 4, 1, 128), wide, 132, 1, 132);
  EXPECT_NEAR(all.stream_us, m.stream_scale * 8 * 16 * 128 * 4 / (m.read_tbps * 1e6 / 132), 1e-9);
  EXPECT_NEAR(decode_active_fraction(33, 132), 0.54, 1e-12);
  EXPECT_NEAR(decode_active_fraction(66, 132), 0.86, 1e-12);
  EXPECT_NEAR(decode_active_fraction(132, 132), 1.0, 1e-12);
  EXPECT_THROW(predict_decode_cost(s, one, 2, 3, 132), InvalidArgument);
}

// Where the model overrules the rules (shapes of the H200 sweeps, each faster there as picked):
// short ragged pairs one unit a tile (no tile holds parts of two pairs: 9.97 -> 6.58 us); short
// equal pairs whole, one tile each, no merges (7.87 -> 6.51 us); head dim 256 with 7 heads a pair,
// fewer tiles than the SMs for fewer and narrower merges (32.1 -> 25.1 us). Large work keeps the
// rules' plans (the existing expectations below).
TEST(DecodePlan, CostModelOverrulesTheRulesWhereTheyLose) {
  const std::vector<int> ragged = {21, 21, 12, 19, 7, 11, 5, 7, 16, 5, 15, 7, 8, 2, 12, 4};
  const DecodePlan a = plan_decode_for(contiguous_shape(ragged, 14, 2, 64), ragged, 132);
  EXPECT_EQ(a.num_tiles, a.total_units);
  EXPECT_EQ(a.rule_tiles, 32);
  EXPECT_LT(a.predicted_us, 0.9 * a.rule_us);
  const std::vector<int> equal(4, 190);
  const DecodePlan b = plan_decode_for(contiguous_shape(equal, 16, 8, 128), equal, 132);
  EXPECT_EQ(b.num_tiles, 32);
  EXPECT_EQ(b.tiles_per_sm, 1);
  EXPECT_EQ(summarize_decode_plan(contiguous_shape(equal, 16, 8, 128), equal, b).split_pairs, 0);
  const std::vector<int> long_ragged = {3764, 1990, 1624, 1285};
  const DecodePlan c = plan_decode_for(contiguous_shape(long_ragged, 14, 2, 256), long_ragged, 132);
  EXPECT_EQ(c.rule_tiles, 132);
  EXPECT_LT(c.num_tiles, 100);
  // Overrides are the caller's: no model.
  DecodeAttentionShape forced = contiguous_shape(equal, 16, 8, 128);
  forced.num_tiles = 96;
  EXPECT_EQ(plan_decode_for(forced, equal, 132).num_tiles, 96);
  // Every candidate fits the op: at most twice the SMs, at most the units, two per SM never at head
  // dim 256 with more than 8 heads a pair.
  const std::vector<int> lens = {5000, 17, 900};
  for (const auto& [t, per_sm] : decode_plan_candidates(contiguous_shape(lens, 32, 2, 256), lens, 132)) {
    EXPECT_LE(t, 132 * per_sm);
    EXPECT_EQ(per_sm, 1);
  }
}

// The planner: one tile per SM aligned to pairs for equal lengths up to 32 MiB per SM (and small
// unequal work), two per SM otherwise.
TEST(DecodePlan, PlannerFollowsTheWork) {
  const std::vector<int> one(1, 4096), many(64, 32768);
  const DecodePlan small = plan_decode_for(contiguous_shape(one, 32, 8, 128), one, 132);
  EXPECT_EQ(small.tiles_per_sm, 1);
  EXPECT_EQ(small.num_tiles % 8, 0);  // whole tiles per pair
  const DecodePlan large = plan_decode_for(contiguous_shape(many, 32, 8, 128), many, 132);
  EXPECT_EQ(large.tiles_per_sm, 2);
  EXPECT_EQ(large.num_tiles, 264);
  DecodeAttentionShape forced = contiguous_shape(one, 32, 8, 128);
  forced.tiles_per_sm = 2;
  EXPECT_EQ(plan_decode_for(forced, one, 132).num_tiles, 264);
  EXPECT_THROW(plan_decode_for(forced, one, 0), InvalidArgument);
  // More short equal pairs than slots: whole pairs per tile at two per SM (512 pairs of 512
  // tokens: 2 per tile), unless that would leave > 10% of the slots; longer equal pairs: whole
  // pairs per tile at one per SM (512 pairs of 4096 tokens: 4 per tile), up to 32 MiB per SM.
  const std::vector<int> short64(64, 512), short48(48, 512), long64(64, 4096), long40(40, 4096);
  EXPECT_EQ(plan_decode_for(contiguous_shape(short64, 32, 8, 128), short64, 132).num_tiles, 256);
  EXPECT_EQ(plan_decode_for(contiguous_shape(short48, 32, 8, 128), short48, 132).num_tiles, 264);
  const DecodePlan aligned = plan_decode_for(contiguous_shape(long64, 32, 8, 128), long64, 132);
  EXPECT_EQ(aligned.tiles_per_sm, 1);
  EXPECT_EQ(aligned.num_tiles, 128);
  // 320 pairs: 3 per tile would fill 106 of 132 SMs (80%): two per SM, cut evenly.
  const DecodePlan uneven = plan_decode_for(contiguous_shape(long40, 32, 8, 128), long40, 132);
  EXPECT_EQ(uneven.tiles_per_sm, 2);
  EXPECT_EQ(uneven.num_tiles, 264);
  // Equal pairs, fewer than SMs: one tile per SM up to 32 MiB per SM (16 x 32768: 16 MiB).
  const std::vector<int> mid16(16, 32768), huge16(16, 131072);
  EXPECT_EQ(plan_decode_for(contiguous_shape(mid16, 32, 8, 128), mid16, 132).num_tiles, 128);
  EXPECT_EQ(plan_decode_for(contiguous_shape(huge16, 32, 8, 128), huge16, 132).tiles_per_sm, 2);
  DecodeAttentionShape fixed = contiguous_shape(short64, 32, 8, 128);
  fixed.tiles_per_sm = 2;
  EXPECT_EQ(plan_decode_for(fixed, short64, 132).num_tiles, 264);
  // Small work takes one tile per SM whatever the layout and page size.
  const std::vector<int> sixteen(16, 4096);
  std::vector<int> table;
  for (int page : {16, 128})
    EXPECT_EQ(plan_decode_for(paged_shape(sixteen, 32, 8, 128, page, table), sixteen, 132).tiles_per_sm, 1) << page;
  EXPECT_EQ(plan_decode_for(contiguous_shape(sixteen, 32, 8, 128), sixteen, 132).tiles_per_sm, 1);
}

// The few-token rule (decode_few_tokens): pairs of at most 64 tokens (one 16-token unit per warp of a
// block) take one block each when every pair's block is resident at once (H200: 132 SMs x 5 / 4 / 2
// blocks at head dim 64 / 128 / 256); longer pairs, more pairs than one wave, plan overrides and lengths
// on the device keep the stream-K plan, whose tiles are planned either way.
TEST(DecodePlan, FewTokenPathForShortPairsOnly) {
  std::vector<int> table;
  // The sweep's shapes that lost to SDPA (seed 16), ragged and paged ones included.
  const std::vector<int> b16(16, 13), b64(64, 9), b4(4, 3), b2(2, 45), b1(1, 19), b32(32, 8), b8(8, 1);
  EXPECT_TRUE(plan_decode_for(paged_shape(b16, 8, 1, 64, 64, table), b16, 132).few_tokens);
  EXPECT_TRUE(plan_decode_for(contiguous_shape(b64, 64, 8, 64), b64, 132).few_tokens);  // 512 pairs <= 660
  EXPECT_TRUE(plan_decode_for(paged_shape(b4, 64, 8, 64, 32, table), b4, 132).few_tokens);
  EXPECT_TRUE(plan_decode_for(contiguous_shape(b2, 32, 8, 128), b2, 132).few_tokens);
  EXPECT_TRUE(plan_decode_for(contiguous_shape(b1, 16, 8, 64), b1, 132).few_tokens);
  EXPECT_TRUE(plan_decode_for(contiguous_shape(b32, 14, 2, 256), b32, 132).few_tokens);
  EXPECT_TRUE(plan_decode_for(contiguous_shape(b8, 8, 1, 256), b8, 132).few_tokens);
  const std::vector<int> ragged = {64, 1, 33, 17, 2, 63, 16};
  EXPECT_TRUE(plan_decode_for(paged_shape(ragged, 112, 7, 256, 16, table), ragged, 132).few_tokens);
  EXPECT_TRUE(decode_few_tokens(paged_shape(ragged, 112, 7, 256, 16, table), ragged, 132));

  // 65 tokens: a pair of 5 units, more than a block's warps.
  const std::vector<int> at64(4, 64), past64 = {64, 65, 3};
  EXPECT_TRUE(plan_decode_for(contiguous_shape(at64, 32, 8, 128), at64, 132).few_tokens);
  EXPECT_FALSE(plan_decode_for(contiguous_shape(past64, 32, 8, 128), past64, 132).few_tokens);
  const std::vector<int> long1(1, 4096);
  EXPECT_FALSE(plan_decode_for(contiguous_shape(long1, 32, 8, 128), long1, 132).few_tokens);
  // One wave: 512 pairs fit 132 SMs at head dim 64 and 128, not at 256, nor 100 SMs at 64.
  EXPECT_TRUE(plan_decode_for(contiguous_shape(b64, 64, 8, 128), b64, 132).few_tokens);
  EXPECT_FALSE(plan_decode_for(contiguous_shape(b64, 64, 8, 256), b64, 132).few_tokens);
  EXPECT_FALSE(plan_decode_for(contiguous_shape(b64, 64, 8, 64), b64, 100).few_tokens);
  const std::vector<int> b132(132, 4), b133(133, 4), b257(257, 4);
  EXPECT_TRUE(plan_decode_for(contiguous_shape(b132, 4, 2, 256), b132, 132).few_tokens);  // 264 pairs = 132 x 2
  EXPECT_FALSE(plan_decode_for(contiguous_shape(b133, 4, 2, 256), b133, 132).few_tokens);
  EXPECT_FALSE(plan_decode_for(contiguous_shape(b257, 1, 1, 64), b257, 132).few_tokens);  // lengths past the parameters' 256
  // Lengths on the device (the op's plan for full caches): the stream-K kernel, which cuts at run time.
  EXPECT_FALSE(plan_decode_for(contiguous_shape(b16, 8, 1, 64), b16, 132, /*lengths_on_device=*/true).few_tokens);

  // Any override of the stream-K plan keeps it; the CpAsync loader does not count as one.
  const DecodeAttentionShape base = contiguous_shape(b16, 8, 1, 64);
  auto few_with = [&](auto&& set) {
    DecodeAttentionShape v = base;
    set(v);
    return plan_decode_for(v, b16, 132).few_tokens;
  };
  EXPECT_FALSE(few_with([](DecodeAttentionShape& v) { v.few_tokens = false; }));
  EXPECT_FALSE(few_with([](DecodeAttentionShape& v) { v.num_tiles = 16; }));
  EXPECT_FALSE(few_with([](DecodeAttentionShape& v) { v.tiles_per_sm = 1; }));
  EXPECT_FALSE(few_with([](DecodeAttentionShape& v) { v.ring_slots = 2; }));
  EXPECT_FALSE(few_with([](DecodeAttentionShape& v) { v.kv_load = KvLoad::Bulk; }));
  EXPECT_TRUE(few_with([](DecodeAttentionShape& v) { v.kv_load = KvLoad::CpAsync; }));
  EXPECT_TRUE(few_with([](DecodeAttentionShape& v) { v.overlap_previous = true; }));

  // The stream-K tiles stay planned, the same as with the path off (the executor and the model use them).
  DecodeAttentionShape off = base;
  off.few_tokens = false;
  const DecodePlan with = plan_decode_for(base, b16, 132), without = plan_decode_for(off, b16, 132);
  EXPECT_EQ(with.num_tiles, without.num_tiles);
  EXPECT_EQ(with.tiles_per_sm, without.tiles_per_sm);
  EXPECT_EQ(with.tile_first, without.tile_first);
  EXPECT_EQ(with.pair_info, without.pair_info);
}

// o_proj tiles depend on exactly the attention tiles that hold their rows and heads, for plans
// whose tiles hold many pairs and pairs many tiles, every split and both tile shapes.
TEST(AttentionOprojGraph, DepsAreExactlyTheCoveringAttentionTiles) {
  const std::vector<int> lens = {17, 255, 4096};
  for (int hkv : {8, 4, 32})
    for (int d : {64, 128})
      for (int tiles : {1, 5, 37, 264})
        for (int split : {0, 1, 3, 8}) {
          SCOPED_TRACE("hkv " + std::to_string(hkv) + ", d " + std::to_string(d) + ", tiles " + std::to_string(tiles) +
                       ", split " + std::to_string(split));
          const DecodeAttentionShape s = contiguous_shape(lens, 32, hkv, d);
          const DecodePlan pl = plan_decode(lens, hkv, tiles);
          const auto g = build_attention_oproj_graph(s, lens, {}, pl, 1000, attention_oproj_tiling(s, 1000, split), false);
          check_deps(g, s, pl);
        }
  // More sequences than one o_proj row block (64 rows at B > 16): rows select the tiles too.
  std::vector<int> many(70);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 1 + int(i * 37 % 300);
  const DecodeAttentionShape s = contiguous_shape(many, 32, 8, 128);
  const DecodePlan pl = plan_decode(many, 8, 131);
  const Tiling t = attention_oproj_tiling(s, 4096, 0);
  EXPECT_EQ(t.bm, 64);
  const auto g = build_attention_oproj_graph(s, many, {}, pl, 4096, t, true);
  check_deps(g, s, pl);
  EXPECT_EQ(g.graph.op(g.op_oproj).grid_m, 2);
}

// The default o_proj split: slices of whole KV-head groups, about 128 KiB of weights per tile.
TEST(AttentionOprojGraph, DefaultSplitFollowsHeadGroups) {
  const std::vector<int> one(1, 4096), wide(64, 4096);
  const Tiling small = attention_oproj_tiling(contiguous_shape(one, 32, 8, 128), 4096);
  EXPECT_EQ(small.bm, 16);
  EXPECT_EQ(small.bn, 16);
  EXPECT_EQ(small.split_k, 1);  // 16 weight rows x all 4096 columns
  const Tiling large = attention_oproj_tiling(contiguous_shape(wide, 32, 8, 128), 4096);
  EXPECT_EQ(large.bm, 64);
  EXPECT_EQ(large.split_k, 4);  // 1024 columns = 2 groups of 4 heads x 128
  // One group per slice where a group holds the target: 8 heads x 128, 64 weight rows.
  EXPECT_EQ(attention_oproj_tiling(contiguous_shape(wide, 64, 8, 128), 4096).split_k, 8);
  EXPECT_THROW(attention_oproj_tiling(contiguous_shape(one, 32, 8, 128), 4096, 17), InvalidArgument);
  EXPECT_THROW(attention_oproj_tiling(contiguous_shape(one, 32, 8, 128), 0), InvalidArgument);
}

// What the tiles read: every cached token's K and V row exactly once (paged: page by page), q and
// the new k/v of each pair, and every pair's output rows written.
TEST(AttentionOprojGraph, TilesReadEveryTokenOnce) {
  const std::vector<int> lens = {17, 255, 4096, 1};
  std::vector<int> table;
  for (bool paged : {false, true}) {
    const DecodeAttentionShape s = paged ? paged_shape(lens, 16, 4, 64, 32, table) : contiguous_shape(lens, 16, 4, 64);
    if (!paged) table.clear();
    const DecodePlan pl = plan_decode(lens, 4, 29);
    const auto g = build_attention_oproj_graph(s, lens, table, pl, 512, attention_oproj_tiling(s, 512), false);
    const TileGraph& G = g.graph;
    const Op& attn = G.op(g.op_attention);
    std::vector<int> seen(G.tensor(g.attn.k_cache).rows, 0);
    int64_t k_new_cols = 0, out_cols = 0;
    for (int i = attn.first_tile; i < attn.first_tile + attn.num_tiles; ++i) {
      for (const Region& r : G.tile(i).reads) {
        if (r.tensor == g.attn.k_cache)
          for (int64_t row = r.r0; row < r.r1; ++row) ++seen[row];
        if (r.tensor == g.attn.k_new) k_new_cols += r.cols();
      }
      for (const Region& w : G.tile(i).writes) out_cols += w.cols();
    }
    // Expected rows: token t of (b, h) at its contiguous or paged row.
    std::vector<int> want(seen.size(), 0);
    for (int b = 0; b < s.batch; ++b)
      for (int h = 0; h < 4; ++h)
        for (int t = 0; t < lens[b]; ++t) {
          const int64_t row = paged ? (int64_t(table[b * s.pages_per_seq + t / 32]) * 4 + h) * 32 + t % 32
                                    : (int64_t(b) * 4 + h) * s.max_seq_len + t;
          want[row] = 1;
        }
    EXPECT_EQ(seen, want) << (paged ? "paged" : "contiguous");
    // A pair split over n tiles is read (q, k_new) and written by each of them.
    EXPECT_GE(k_new_cols, int64_t(s.batch) * 4 * 64);
    EXPECT_GE(out_cols, int64_t(s.batch) * 16 * 64);
  }
}

// Every named order of the graph is a valid schedule, and the executor plan maps each o_proj
// tile's dependencies to one wait per attention tile counter.
TEST(AttentionOprojGraph, SchedulesAndExecPlan) {
  const std::vector<int> lens = {17, 255, 4096};
  const DecodeAttentionShape s = contiguous_shape(lens, 32, 8, 128);
  const DecodePlan pl = plan_decode(lens, 8, 37);
  const auto g = build_attention_oproj_graph(s, lens, {}, pl, 4096, attention_oproj_tiling(s, 4096, 4), true);
  const TileGraph& G = g.graph;
  for (const std::string& spec : named_orders(G)) {
    SCOPED_TRACE(spec);
    const Schedule sch = make_order(G, spec);
    EXPECT_NO_THROW(validate(G, sch));
    const ExecPlan plan = make_exec_plan(G, sch);
    for (int id = 0; id < G.num_tiles(); ++id) {
      const DeviceTile& d = plan.tiles[id];
      const Tile& t = G.tile(id);
      ASSERT_EQ(d.wait_end - d.wait_begin, int(t.deps.size()));
      for (int w = d.wait_begin; w < d.wait_end; ++w) {
        // Tile sync on the attention op: counter c is attention tile c, signalled once per launch.
        EXPECT_EQ(plan.waits[w].counter, t.deps[w - d.wait_begin]);
        EXPECT_EQ(plan.waits[w].count, 1u);
      }
    }
  }
  const Schedule ks = make_order(G, "kslices/col_major");
  for (int i = 0; i < G.op(g.op_attention).num_tiles; ++i) EXPECT_EQ(G.tile(ks.order[i]).op, g.op_attention);
  // A row-synchronised attention op: one counter for all tiles, so o_proj waits for all of them.
  const ExecPlan row = make_exec_plan(G, ks, {{g.op_attention, {SyncPolicy::Row, 1}}});
  const DeviceTile& last = row.tiles[G.num_tiles() - 1];
  ASSERT_EQ(last.wait_end - last.wait_begin, 1);
  EXPECT_EQ(row.waits[last.wait_begin].count, uint32_t(pl.num_tiles));
}

// The traffic model on the graph: K/V, Wo and q read once each from DRAM, bounds below it, and a
// search that starts from the named orders.
TEST(AttentionOprojGraph, ModelCountsTheBytesTheTilesRead) {
  const std::vector<int> lens = {17, 255, 4096};
  std::vector<int> table;
  for (bool paged : {false, true}) {
    SCOPED_TRACE(paged ? "paged" : "contiguous");
    const DecodeAttentionShape s = paged ? paged_shape(lens, 32, 8, 128, 16, table) : contiguous_shape(lens, 32, 8, 128);
    if (!paged) table.clear();
    const DecodePlan pl = plan_decode(lens, 8, 64);
    const auto g = build_attention_oproj_graph(s, lens, table, pl, 4096, attention_oproj_tiling(s, 4096), false);
    CacheConfig c;  // 60 MiB, 32 B lines
    c.in_flight = 132;
    const TrafficReport r = simulate(g.graph, make_order(g.graph, "kslices/col_major"), c);
    const int64_t tokens = 17 + 255 + 4096;
    EXPECT_EQ(tensor_bytes_read(r, g.attn.k_cache), tokens * 8 * 128 * 2);
    EXPECT_EQ(tensor_bytes_read(r, g.attn.v_cache), tokens * 8 * 128 * 2);
    EXPECT_EQ(tensor_bytes_read(r, g.w_o), int64_t(4096) * 4096 * 2);
    EXPECT_EQ(tensor_bytes_read(r, g.attn.q), 3 * 4096 * 2);
    EXPECT_EQ(tensor_bytes_read(r, g.attn.out), 0);  // O stays in the cache between the ops
    const TrafficBounds b = traffic_bounds(g.graph, c);
    EXPECT_LE(b.best(), r.dram_total());
  }
  // The heuristic search runs on it (small graph, few evaluations).
  const std::vector<int> tiny = {40, 7};
  const DecodeAttentionShape s = contiguous_shape(tiny, 4, 2, 64);
  const DecodePlan pl = plan_decode(tiny, 2, 3);
  const auto g = build_attention_oproj_graph(s, tiny, {}, pl, 64, attention_oproj_tiling(s, 64), false);
  CacheConfig c;
  c.capacity_bytes = 8 << 10;
  c.in_flight = 2;
  HeuristicOptions o;
  o.max_evaluations = 200;
  const HeuristicResult h = heuristic_search(g.graph, c, o);
  EXPECT_NO_THROW(validate(g.graph, h.best));
  EXPECT_LE(h.traffic, h.seed_traffic);
}

TEST(AttentionOprojGraph, BadInputIsNamed) {
  const std::vector<int> lens = {17, 255};
  const DecodeAttentionShape s = contiguous_shape(lens, 32, 8, 128);
  const DecodePlan pl = plan_decode(lens, 8, 10);
  const Tiling t = attention_oproj_tiling(s, 4096);
  try {
    build_attention_oproj_graph(s, {17, 256}, {}, pl, 4096, t, false);  // the plan is for other lengths
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
  EXPECT_THROW(build_attention_oproj_graph(s, lens, {}, plan_decode(lens, 4, 10), 4096, t, false), InvalidArgument);
  EXPECT_THROW(build_attention_oproj_graph(s, lens, {}, pl, 0, t, false), InvalidArgument);
  EXPECT_THROW(build_attention_oproj_graph(s, {17, 0}, {}, pl, 4096, t, false), InvalidArgument);
  // The op checks its tensors' shapes.
  TileGraph G;
  DecodeAttentionTensorIds ids;
  ids.q = G.add_tensor("q", 2, 4096, 2, TensorRole::Input);
  ids.k_new = G.add_tensor("k_new", 2, 1024, 2, TensorRole::Input);
  ids.v_new = G.add_tensor("v_new", 2, 1024, 2, TensorRole::Input);
  ids.k_cache = G.add_tensor("k", 2 * 8 * s.max_seq_len, 128, 2, TensorRole::Input);
  ids.v_cache = G.add_tensor("v", 2 * 8 * s.max_seq_len, 64, 2, TensorRole::Input);  // wrong head dim
  ids.out = G.add_tensor("o", 2, 4096, 2, TensorRole::Intermediate);
  try {
    G.add_decode_attention("attn", s, lens, {}, pl, ids);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("v_cache"), std::string::npos) << e.what();
  }
}
