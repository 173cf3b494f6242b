// Prefill attention on the host (graph/prefill_attention_graph.hpp): validation that names the bad
// value, the sm90 kernel's work tiles (counts, key tiles under both masks, launch order) and the
// FLOP count, each against a brute force over the bottom-right-aligned causal mask.
#include <gtest/gtest.h>

#include "llm_test_util.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tileweave/graph/prefill_attention_graph.hpp"

using namespace tw;

namespace {

using tw::test::error_of;

PrefillAttentionShape shape(bool causal, int hq = 8, int hkv = 2, int d = 128) {
  PrefillAttentionShape s;
  s.num_q_heads = hq;
  s.num_kv_heads = hkv;
  s.head_dim = d;
  s.causal = causal;
  return s;
}

std::vector<int> offsets(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// Does query row i of a sequence see key j? The op's definition, written out once here.
bool visible(bool causal, int i, int j, int len_q, int len_k) { return !causal || j <= i + (len_k - len_q); }

// Key tiles a query tile needs, by brute force: one past the tile of the last key any of its rows sees.
int brute_kv_tiles(bool causal, int len_q, int len_k, int t) {
  int last = -1;
  for (int i = t * kPrefillBlockM; i < std::min(len_q, (t + 1) * kPrefillBlockM); ++i)
    for (int j = len_k - 1; j > last; --j)
      if (visible(causal, i, j, len_q, len_k)) {
        last = j;
        break;
      }
  return last < 0 ? 0 : last / kPrefillBlockN + 1;
}

// Checks the plan of (cu_q, cu_k) against the brute force: every (seq, q_tile) once, the right
// key tiles, and the launch order (most key tiles first, ties in (seq, q_tile) order).
void check_plan(bool causal, const std::vector<int>& cu_q, const std::vector<int>& cu_k_in) {
  const std::vector<int>& cu_k = cu_k_in.empty() ? cu_q : cu_k_in;
  const auto tiles = plan_prefill_tiles(shape(causal), cu_q, cu_k_in);
  std::vector<PrefillTile> want;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int lq = cu_q[b + 1] - cu_q[b], lk = cu_k[b + 1] - cu_k[b];
    for (int t = 0; t < (lq + kPrefillBlockM - 1) / kPrefillBlockM; ++t)
      want.push_back({int(b), t, brute_kv_tiles(causal, lq, lk, t)});
  }
  ASSERT_EQ(tiles.size(), want.size());
  for (size_t i = 1; i < tiles.size(); ++i) {
    const PrefillTile &a = tiles[i - 1], &b = tiles[i];
    ASSERT_GE(a.kv_tiles, b.kv_tiles) << "tile " << i;
    if (a.kv_tiles == b.kv_tiles)
      ASSERT_TRUE(a.seq < b.seq || (a.seq == b.seq && a.q_tile < b.q_tile)) << "tie out of order at tile " << i;
  }
  for (const PrefillTile& w : want) {
    const auto it = std::find_if(tiles.begin(), tiles.end(),
                                 [&](const PrefillTile& t) { return t.seq == w.seq && t.q_tile == w.q_tile; });
    ASSERT_NE(it, tiles.end()) << "seq " << w.seq << " q_tile " << w.q_tile << " missing";
    EXPECT_EQ(it->kv_tiles, w.kv_tiles) << "seq " << w.seq << " q_tile " << w.q_tile << (causal ? " causal" : "");
  }
}

}  // namespace

TEST(PrefillAttentionGraph, ValidationNamesTheBadValue) {
  const std::vector<int> cu = {0, 5, 9};
  EXPECT_NO_THROW(validate_prefill_attention(shape(true), cu, {}));
  EXPECT_NO_THROW(validate_prefill_attention(shape(false, 7, 1, 64), cu, {0, 0, 300}));  // empty keys are fine
  EXPECT_NO_THROW(validate_prefill_attention(shape(false), {0, 0, 0}, {}));                // so are empty queries

  auto expect_named = [](const std::string& why, const PrefillAttentionShape& s, const std::vector<int>& q,
                         const std::vector<int>& k, const std::vector<std::string>& words) {
    SCOPED_TRACE(why);
    const std::string e = error_of([&] { validate_prefill_attention(s, q, k); });
    ASSERT_FALSE(e.empty()) << "no InvalidArgument";
    EXPECT_EQ(e.rfind("prefill attention: ", 0), 0u) << e;
    for (const std::string& w : words) EXPECT_NE(e.find(w), std::string::npos) << "'" << w << "' not in: " << e;
  };
  expect_named("head_dim 96", shape(false, 8, 2, 96), cu, {}, {"head_dim", "96"});
  {
    PrefillAttentionShape s256 = shape(false, 8, 2, 256);
    EXPECT_NO_THROW(validate_prefill_attention(s256, cu, {}));
    EXPECT_EQ(prefill_block_n(s256), 64);  // Q 64 KiB + two stages of 32 KiB K and V tiles
    s256.mainloop = "sm80";
    expect_named("head_dim 256 on sm80", s256, cu, {}, {"256", "sm90"});
  }
  expect_named("Hq 30 over Hkv 8", shape(false, 30, 8), cu, {}, {"num_q_heads", "30", "8"});
  expect_named("Hkv 0", shape(false, 8, 0), cu, {}, {"num_kv_heads", "0"});
  expect_named("Hq 0", shape(false, 0, 1), cu, {}, {"num_q_heads", "0"});
  expect_named("Hq past the grid", shape(false, 65536, 1), cu, {}, {"num_q_heads", "65536"});
  expect_named("cu_q starts at 3", shape(false), {3, 5, 9}, {}, {"cu_seqlens_q[0]", "3"});
  expect_named("cu_q decreases", shape(false), {0, 9, 5}, {}, {"cu_seqlens_q", "decreases", "9", "5"});
  expect_named("cu_q one entry", shape(false), {0}, {}, {"cu_seqlens_q", "got 1"});
  expect_named("cu_q empty", shape(false), {}, {}, {"cu_seqlens_q", "got 0"});
  expect_named("cu_k starts at 2", shape(true), cu, {2, 5, 9}, {"cu_seqlens_k[0]", "2"});
  expect_named("cu_k decreases", shape(true), cu, {0, 7, 6}, {"cu_seqlens_k", "decreases", "7", "6"});
  expect_named("cu_k one entry", shape(true), cu, {0}, {"cu_seqlens_k", "got 1"});
  expect_named("cu_k size mismatch", shape(true), cu, {0, 5}, {"cu_seqlens_k", "2", "3"});
  // The scale message names the field (and the rule), not the number: a NaN reads the same.
  PrefillAttentionShape s = shape(false);
  for (float bad : {-0.5f, NAN, INFINITY}) {
    s.scale = bad;
    expect_named("scale " + std::to_string(bad), s, cu, {}, {"scale"});
  }
  s.scale = 0.1f;
  EXPECT_NO_THROW(validate_prefill_attention(s, cu, {}));
}

// One 128-row query tile per started 128 rows; without the mask every tile needs every key tile.
TEST(PrefillAttentionGraph, TileCounts) {
  struct Case {
    int len, tiles;
  };
  for (const Case c : {Case{1, 1}, Case{127, 1}, Case{128, 1}, Case{129, 2}, Case{4097, 33}}) {
    const auto tiles = plan_prefill_tiles(shape(false), {0, c.len}, {});
    ASSERT_EQ(int(tiles.size()), c.tiles) << "len " << c.len;
    for (int t = 0; t < c.tiles; ++t) {
      EXPECT_EQ(tiles[t].seq, 0);
      EXPECT_EQ(tiles[t].q_tile, t);  // all tie, so plan order
      EXPECT_EQ(tiles[t].kv_tiles, c.tiles);
    }
  }
  // Packed: the tiles of each sequence, none for an empty one.
  const auto tiles = plan_prefill_tiles(shape(false), offsets({1, 127, 0, 128, 129, 4097}), {});
  EXPECT_EQ(tiles.size(), 1u + 1 + 0 + 1 + 2 + 33);
  EXPECT_TRUE(plan_prefill_tiles(shape(true), {0, 0}, {}).empty());
}

TEST(PrefillAttentionGraph, CausalKeyTiles) {
  // Equal lengths: tile t sees keys up to its own last row, t + 1 key tiles.
  for (int len : {1, 127, 128, 129, 4097}) {
    const auto tiles = plan_prefill_tiles(shape(true), {0, len}, {});
    const int n = (len + 127) / 128;
    ASSERT_EQ(int(tiles.size()), n);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(tiles[i].q_tile, n - 1 - i) << "len " << len;  // longest first
      EXPECT_EQ(tiles[i].kv_tiles, tiles[i].q_tile + 1) << "len " << len;
    }
  }
  // len_q 300 < len_k 1000, bottom-right: row i sees keys <= i + 700. Tile 0 (rows ..127): keys
  // ..827, 7 tiles; tile 1 (..255): ..955, 8; tile 2 (..299): ..999, 8 = all of them.
  auto kv_of = [](const std::vector<PrefillTile>& tiles, int q_tile) {
    for (const auto& t : tiles)
      if (t.q_tile == q_tile) return t.kv_tiles;
    return -1;
  };
  auto short_q = plan_prefill_tiles(shape(true), {0, 300}, {0, 1000});
  EXPECT_EQ(kv_of(short_q, 0), 7);
  EXPECT_EQ(kv_of(short_q, 1), 8);
  EXPECT_EQ(kv_of(short_q, 2), 8);
  // One query against 1000 keys sees them all (the decode case).
  EXPECT_EQ(plan_prefill_tiles(shape(true), {0, 1}, {0, 1000})[0].kv_tiles, 8);
  // len_q 1000 > len_k 300: row i sees keys <= i - 700, so rows 0..699 (tiles 0..4) see nothing;
  // tile 5 (..767): key ..67, 1 tile; tile 6 (..895): ..195, 2; tile 7 (..999): ..299, 3.
  auto long_q = plan_prefill_tiles(shape(true), {0, 1000}, {0, 300});
  ASSERT_EQ(long_q.size(), 8u);
  for (int t = 0; t < 5; ++t) EXPECT_EQ(kv_of(long_q, t), 0) << "tile " << t;
  EXPECT_EQ(kv_of(long_q, 5), 1);
  EXPECT_EQ(kv_of(long_q, 6), 2);
  EXPECT_EQ(kv_of(long_q, 7), 3);
  // No keys at all: nothing to see under either mask.
  for (bool causal : {false, true})
    for (const auto& t : plan_prefill_tiles(shape(causal), {0, 200}, {0, 0})) EXPECT_EQ(t.kv_tiles, 0);
}

// The launch order on a packed batch: descending key tiles, ties in (seq, q_tile) order (stable).
TEST(PrefillAttentionGraph, OrderAndKeyTilesMatchBruteForce) {
  const std::vector<int> lens = {1, 200, 777, 1500, 0, 5, 300, 129};
  const std::vector<int> lens_k = {500, 129, 1000, 1500, 7, 0, 64, 700};
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    check_plan(causal, offsets(lens), {});
    check_plan(causal, offsets(lens), offsets(lens_k));
  }
  // Equal key tiles keep sequence order: three sequences of 128 rows, 2 key tiles each.
  const auto tiles = plan_prefill_tiles(shape(false), {0, 128, 256, 384}, {0, 200, 400, 600});
  ASSERT_EQ(tiles.size(), 3u);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(tiles[b].seq, b);
  // Random packed batches around the tile edges.
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<int> lq(1 + rng() % 6), lk(lq.size());
    for (size_t b = 0; b < lq.size(); ++b) {
      lq[b] = int(rng() % 700);
      lk[b] = int(rng() % 700);
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    for (bool causal : {false, true}) check_plan(causal, offsets(lq), offsets(lk));
  }
}

// 4 * D * Hq * visible (query, key) pairs, the pairs counted one by one.
TEST(PrefillAttentionGraph, FlopsCountVisiblePairs) {
  const std::vector<int> lens_q = {1, 3, 17, 9, 31, 0, 5}, lens_k = {7, 3, 5, 9, 45, 11, 0};
  for (bool causal : {false, true})
    for (bool own_keys : {false, true}) {
      const std::vector<int>& lk = own_keys ? lens_k : lens_q;
      double pairs = 0;
      for (size_t b = 0; b < lens_q.size(); ++b)
        for (int i = 0; i < lens_q[b]; ++i)
          for (int j = 0; j < lk[b]; ++j) pairs += visible(causal, i, j, lens_q[b], lk[b]);
      const PrefillAttentionShape s = shape(causal, 6, 3, 64);
      const double got = prefill_attention_flops(s, offsets(lens_q), own_keys ? offsets(lens_k) : std::vector<int>{});
      EXPECT_EQ(got, 4.0 * 64 * 6 * pairs) << (causal ? "causal" : "full") << (own_keys ? ", own keys" : "");
    }
  // Exactly half plus the diagonal for one causal square: 4 * 128 * 1 * (n (n + 1) / 2).
  EXPECT_EQ(prefill_attention_flops(shape(true, 1, 1), {0, 4097}, {}), 4.0 * 128 * 4097.0 * 4098 / 2);
}

TEST(PrefillAttentionGraph, BlockNFollowsTheShape) {
  EXPECT_EQ(prefill_block_n(shape(false, 8, 2, 128)), 160);  // d = 128, no mask: wider key tiles
  EXPECT_EQ(prefill_block_n(shape(true, 8, 2, 128)), kPrefillBlockN);
  EXPECT_EQ(prefill_block_n(shape(false, 8, 2, 64)), kPrefillBlockN);
  // The plan counts key tiles of the width it is given.
  const auto tiles = plan_prefill_tiles(shape(false), {0, 4097}, {}, 160);
  ASSERT_FALSE(tiles.empty());
  for (const auto& t : tiles) EXPECT_EQ(t.kv_tiles, 26);  // ceil(4097 / 160)
}

TEST(PrefillAttentionGraph, BlockMFromTheRoundsOverTheSms) {
  // d = 64, a large problem: three consumer warpgroups (192 rows per item).
  EXPECT_EQ(prefill_block_m(shape(false, 24, 24, 64), {0, 4429}, 132), 192);
  EXPECT_EQ(prefill_block_m(shape(false, 24, 24, 64), {0, 16384}, 132), 192);
  // H = 8, L = 4096: two rounds at either height, so the faster rows do not pay for the taller item.
  EXPECT_EQ(prefill_block_m(shape(false, 8, 8, 64), {0, 4096}, 132), kPrefillBlockM);
  EXPECT_EQ(prefill_block_m(shape(false, 7, 1, 64), {0, 200}, 132), kPrefillBlockM);
  // d = 128 always 128 rows (three warpgroups' S, P and O do not fit the registers).
  EXPECT_EQ(prefill_block_m(shape(false, 24, 24, 128), {0, 16384}, 132), kPrefillBlockM);
  // The plan cuts 192-row items.
  const auto tiles = plan_prefill_tiles(shape(true, 8, 2, 64), {0, 400}, {}, 128, 192);
  ASSERT_EQ(tiles.size(), 3u);  // rows 0-191, 192-383, 384-399
  EXPECT_EQ(tiles[0].kv_tiles, 4);  // causal: the last tile's rows see keys up to 399 (4 tiles of 128)
}

// The kernel choice is checked with the rest of the shape: auto / sm90 / sm80, and fp8 is sm90's.
TEST(PrefillAttentionGraph, MainloopNames) {
  PrefillAttentionShape s = shape(false, 8, 2, 64);
  for (const char* m : {"auto", "sm90", "sm80"}) {
    s.mainloop = m;
    EXPECT_NO_THROW(validate_prefill_attention(s, {0, 100}, {})) << m;
  }
  s.mainloop = "sm75";
  std::string e = error_of([&] { validate_prefill_attention(s, {0, 100}, {}); });
  EXPECT_NE(e.find("'sm75'"), std::string::npos) << e;
  s = shape(false, 8, 2, 128);
  s.fp8 = true;
  s.mainloop = "sm80";
  e = error_of([&] { validate_prefill_attention(s, {0, 100}, {}); });
  EXPECT_NE(e.find("fp8"), std::string::npos) << e;
}

TEST(PrefillAttentionGraph, Fp8PlanAndKeyOffsets) {
  PrefillAttentionShape s = shape(false, 24, 24, 128);
  s.fp8 = true;
  EXPECT_EQ(prefill_block_n(s), kPrefillFp8TileKeys);  // whole K scale blocks a tile
  EXPECT_EQ(kPrefillFp8TileKeys % kPrefillFp8KeyBlock, 0);
  EXPECT_EQ(prefill_block_m(s, {0, 16384}, 132), kPrefillBlockM);
  EXPECT_NO_THROW(validate_prefill_attention(s, {0, 4097}, {}));
  s.head_dim = 64;
  const std::string e = error_of([&] { validate_prefill_attention(s, {0, 4097}, {}); });
  EXPECT_NE(e.find("fp8"), std::string::npos) << e;
  EXPECT_NE(e.find("64"), std::string::npos) << e;
  // Lengths 1, 0, 128, 256, 4097: each sequence's keys start on a 192-key tile; an empty one takes none.
  EXPECT_EQ(prefill_fp8_key_offsets({0, 1, 1, 129, 385, 4482}),
            (std::vector<int>{0, 192, 192, 384, 768, 4992}));
  EXPECT_EQ(prefill_fp8_key_offsets({0, 0}), (std::vector<int>{0, 0}));
  EXPECT_EQ(prefill_fp8_key_offsets({0, 384}), (std::vector<int>{0, 384}));
}

namespace {

// Every (item, key tile) of a plan is run exactly once by the work's draws: whole items by theirs,
// the tail's by the pieces of its units (ranges of the tail's key tiles laid end to end); a split
// item's pieces name one counter and consecutive slots of their own, numbered as `parts` says.
void check_work(const std::vector<PrefillTile>& tiles, int heads, int sms, const PrefillWork& w) {
  const int64_t n_tiles = int64_t(tiles.size());
  ASSERT_EQ(w.items, n_tiles * heads);
  ASSERT_LE(w.whole, w.items);
  std::vector<std::vector<int>> seen(size_t(w.items));
  for (int64_t i = 0; i < w.whole; ++i) seen[size_t(i)].assign(size_t(tiles[size_t(i % n_tiles)].kv_tiles), 1);
  if (w.units() == 0) {
    EXPECT_EQ(w.whole, w.items);
    return;
  }
  EXPECT_LE(w.units(), std::max<int64_t>(sms, (w.items - w.whole) * kPrefillMaxParts));
  std::vector<int> slot_uses(size_t(w.slots), 0), group_pieces(size_t(w.groups), 0);
  int64_t last_item = w.whole - 1;
  for (int u = 0; u < w.units(); ++u)
    for (int k = w.unit_offsets[size_t(u)]; k < w.unit_offsets[size_t(u) + 1]; ++k) {
      const PrefillPiece& p = w.pieces[size_t(k)];
      ASSERT_GE(p.item, w.whole);
      ASSERT_LT(p.item, w.items);
      EXPECT_GE(p.item, last_item) << "pieces in item order";
      last_item = p.item;
      auto& s = seen[size_t(p.item)];
      const int n = tiles[size_t(p.item % n_tiles)].kv_tiles;
      if (s.empty()) s.assign(size_t(n), 0);
      ASSERT_LE(p.kv_first + p.kv_tiles, n);
      for (int j = p.kv_first; j < p.kv_first + p.kv_tiles; ++j) ++s[size_t(j)];
      if (p.group < 0) {
        EXPECT_EQ(p.kv_first, 0);
        EXPECT_EQ(p.kv_tiles, n) << "a piece that is not split is its whole item";
        continue;
      }
      EXPECT_GE(p.kv_tiles, 1);
      ASSERT_LT(p.group, w.groups);
      ASSERT_GE(p.slot, p.first_slot);
      ASSERT_LT(p.slot, p.first_slot + p.parts);
      ASSERT_LE(p.first_slot + p.parts, w.slots);
      ++slot_uses[size_t(p.slot)];
      ++group_pieces[size_t(p.group)];
    }
  for (int64_t i = 0; i < w.items; ++i) {
    const int n = tiles[size_t(i % n_tiles)].kv_tiles;
    if (n == 0) continue;
    ASSERT_EQ(seen[size_t(i)].size(), size_t(n)) << "item " << i << " never run";
    for (int j = 0; j < n; ++j) EXPECT_EQ(seen[size_t(i)][size_t(j)], 1) << "item " << i << " key tile " << j;
  }
  for (int s : slot_uses) EXPECT_EQ(s, 1) << "a slot written by more than one piece";
  for (const PrefillPiece& p : w.pieces)
    if (p.group >= 0) EXPECT_EQ(group_pieces[size_t(p.group)], p.parts);
}

}  // namespace

TEST(PrefillAttentionGraph, WorkSplitsTheLastRoundOverKeyRanges) {
  // Worked by hand: H = 8, L = 1024, 160-key tiles: 64 items of 7 tiles, fewer than 132 SMs. Whole,
  // the launch ends after one item (7 + 1 = 8 tile times). A stream-K tail (448 tiles in 132 units
  // of 3-4) gives most units pieces of two items: 3-4 + 2 x (1 + 1.5) = 8.4; each item in two units of
  // its own (3 and 4 tiles, 128 units): 4 + 1 + 1.5 = 6.5; in three (192 units, two rounds): 9.
  auto t = plan_prefill_tiles(shape(false, 8, 8, 128), {0, 1024}, {}, 160, 128);
  PrefillWork w = plan_prefill_work(t, 8, 132);
  check_work(t, 8, 132, w);
  EXPECT_EQ(w.whole, 0);
  EXPECT_EQ(w.units(), 128);
  EXPECT_EQ(w.groups, 64);
  EXPECT_DOUBLE_EQ(w.makespan_whole, 8.0);
  EXPECT_DOUBLE_EQ(w.makespan, 6.5);
  // H = 24, L = 4608: 864 items of 29 tiles, 6 rounds of 132 and 72 left: the 72 are the tail (2088
  // tiles, 132 units of 15-16, stream-K): 6 x 30 + 15.8 + up to two pieces' costs, against 7 x 30 whole.
  t = plan_prefill_tiles(shape(false, 24, 24, 128), {0, 4608}, {}, 160, 128);
  w = plan_prefill_work(t, 24, 132);
  check_work(t, 24, 132, w);
  EXPECT_EQ(w.whole, 792);
  EXPECT_EQ(w.units(), 132);
  EXPECT_EQ(w.groups, 72);
  EXPECT_DOUBLE_EQ(w.makespan_whole, 210.0);
  EXPECT_LT(w.makespan, 0.96 * w.makespan_whole);
  // Whole rounds (H = 16, L = 4097: 528 = 4 x 132 items) leave nothing to split, nor does split = false.
  t = plan_prefill_tiles(shape(false, 16, 16, 128), {0, 4097}, {}, 160, 128);
  EXPECT_EQ(plan_prefill_work(t, 16, 132).units(), 0);
  t = plan_prefill_tiles(shape(false, 8, 8, 128), {0, 1024}, {}, 160, 128);
  EXPECT_EQ(plan_prefill_work(t, 8, 132, false).units(), 0);
  EXPECT_THROW(plan_prefill_work(t, 0, 132), InvalidArgument);
}

TEST(PrefillAttentionGraph, WorkCoversEveryKeyTileOnceOnRandomPlans) {
  std::mt19937 rng(20261129);
  for (int trial = 0; trial < 300; ++trial) {
    const bool causal = rng() % 2;
    const int heads = 1 + int(rng() % 40), sms = 1 + int(rng() % 140), batch = 1 + int(rng() % 4);
    std::vector<int> lq, lk;
    for (int b = 0; b < batch; ++b) {
      lq.push_back(int(rng() % 3000));
      lk.push_back(rng() % 3 == 0 ? int(rng() % 3000) : lq.back());
    }
    const auto t = plan_prefill_tiles(shape(causal, heads, heads, 128), offsets(lq), offsets(lk), 128, 128);
    const PrefillWork w = plan_prefill_work(t, heads, sms);
    SCOPED_TRACE("trial " + std::to_string(trial));
    check_work(t, heads, sms, w);
    if (w.units() > 0) EXPECT_LE(w.makespan, 0.98 * w.makespan_whole);
  }
}
