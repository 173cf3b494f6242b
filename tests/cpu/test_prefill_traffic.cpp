// The prefill attention traffic replay (model/prefill_traffic.hpp) on cases worked out by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tileweave/model/prefill_traffic.hpp"

namespace tw {
namespace {

PrefillAttentionShape shape(int hq, int hkv, bool causal = false) {
  PrefillAttentionShape s;
  s.num_q_heads = hq;
  s.num_kv_heads = hkv;
  s.head_dim = 128;
  s.causal = causal;
  return s;
}

// 2 heads, one sequence of 256: 2 query tiles of 128, 2 key tiles (160 + 96 keys; a K/V tile of
// 160 keys is 2 x 160 x 128 x 2 B = 80 KiB); two workers and an L2 holding one K/V tile.
TEST(PrefillTraffic, HandWorkedOrders) {
  const std::vector<int> cu = {0, 256};
  const int64_t one_tile_l2 = 2 * 2 * 160 * 128 * 2;  // / kv_copies 2 = one tile
  // heads: both workers on head 0 in lockstep (the second hits what the first brought), then head 1.
  const PrefillTraffic h = predict_prefill_traffic(shape(2, 2), cu, {}, PrefillOrder::Heads, 2, one_tile_l2);
  EXPECT_EQ(h.block_n, 160);
  EXPECT_EQ(h.block_m, 128);
  EXPECT_EQ(h.items, 4);
  EXPECT_EQ(h.kv_tile_reads, 8);
  EXPECT_EQ(h.kv_tile_misses, 4);
  EXPECT_DOUBLE_EQ(h.kv_bytes, 2.0 * 256 * 2 * 128 * 2);  // K and V of 2 heads
  EXPECT_DOUBLE_EQ(h.kv_read_bytes, h.kv_bytes);
  EXPECT_DOUBLE_EQ(h.q_bytes, 256.0 * 2 * 128 * 2);
  EXPECT_DOUBLE_EQ(h.read_bytes(), h.compulsory_read_bytes());
  // tiles: the two heads side by side evict each other's tile every step: every read misses.
  const PrefillTraffic t = predict_prefill_traffic(shape(2, 2), cu, {}, PrefillOrder::Tiles, 2, one_tile_l2);
  EXPECT_EQ(t.kv_tile_reads, 8);
  EXPECT_EQ(t.kv_tile_misses, 8);
  EXPECT_DOUBLE_EQ(t.kv_read_bytes, 2 * h.kv_bytes);
}

TEST(PrefillTraffic, LargeL2ReadsEveryKvTileOnceAndNoL2ReadsThemAll) {
  const std::vector<int> cu = {0, 1, 700, 3000};  // ragged, a one-row sequence included
  for (bool causal : {false, true}) {
    for (PrefillOrder o : {PrefillOrder::Heads, PrefillOrder::Tiles}) {
      SCOPED_TRACE(std::string(to_string(o)) + (causal ? " causal" : ""));
      const PrefillTraffic big = predict_prefill_traffic(shape(8, 2, causal), cu, {}, o, 132, int64_t{1} << 40);
      EXPECT_DOUBLE_EQ(big.kv_read_bytes, big.kv_bytes);
      const PrefillTraffic none = predict_prefill_traffic(shape(8, 2, causal), cu, {}, o, 132, 0);
      EXPECT_EQ(none.kv_tile_misses, none.kv_tile_reads);
      EXPECT_GT(none.kv_read_bytes, big.kv_read_bytes);
      // Every item reads its own tiles whatever L2 holds.
      EXPECT_EQ(big.kv_tile_reads, none.kv_tile_reads);
    }
  }
}

TEST(PrefillTraffic, KernelOrderReadsTheMinimumAtDiTSizes) {
  // H = 24, L = 14034 (Qwen-Image's joint sequence): 172 MB of K/V against a 60 MB L2.
  PrefillAttentionShape s = shape(24, 24);
  const PrefillTraffic h = predict_prefill_traffic(s, {0, 14034}, {}, PrefillOrder::Heads, 132, int64_t{60} << 20);
  const PrefillTraffic t = predict_prefill_traffic(s, {0, 14034}, {}, PrefillOrder::Tiles, 132, int64_t{60} << 20);
  EXPECT_DOUBLE_EQ(h.kv_read_bytes, h.kv_bytes);
  EXPECT_GT(t.kv_read_bytes, 10 * h.kv_read_bytes);
  s.fp8 = true;  // one byte an element, 192-key tiles
  const PrefillTraffic f = predict_prefill_traffic(s, {0, 14034}, {}, PrefillOrder::Heads, 132, int64_t{60} << 20);
  EXPECT_EQ(f.block_n, kPrefillFp8TileKeys);
  EXPECT_DOUBLE_EQ(f.kv_bytes, h.kv_bytes / 2);
}

TEST(PrefillTraffic, BadInputNamesTheValue) {
  EXPECT_THROW(prefill_order_from_string("rows"), InvalidArgument);
  EXPECT_EQ(prefill_order_from_string("tiles"), PrefillOrder::Tiles);
  EXPECT_THROW(predict_prefill_traffic(shape(2, 2), {0, 5}, {}, PrefillOrder::Heads, 0, 1 << 20), InvalidArgument);
  EXPECT_THROW(predict_prefill_traffic(shape(3, 2), {0, 5}, {}, PrefillOrder::Heads, 4, 1 << 20), InvalidArgument);
}

}  // namespace
}  // namespace tw
