// Decode attention (ops/attention.hpp) against a double-precision CPU reference on fresh random
// inputs: mixed lengths 1 .. 100003 in one batch, B = 64, GQA 1/3/4/8, head dim 64/128, contiguous
// and paged caches, several stream-K plans; outputs poisoned before every run, the appended cache rows checked, and bad
// input rejected before any launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_util.cuh"
#include "tileweave/ops/attention.hpp"

namespace {

using tw::DecodeAttention;
using tw::DecodeAttentionShape;
using tw::DecodeAttentionTensors;
using tw::KvLayout;
using tw::test::DeviceBuffer;
using bf16 = __nv_bfloat16;

// Fast uniform bf16 noise (unit variance): the long sequences need ~10^8 values.
void fill_uniform(std::vector<bf16>& v, uint64_t seed) {
  uint64_t s = seed | 1;
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const float u = float(s >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    x = __float2bfloat16((2.f * u - 1.f) * 1.7320508f);
  }
}

float f(bf16 x) { return __bfloat162float(x); }

struct AttnCase {
  std::vector<int> lens;
  int hq = 32, hkv = 8, d = 128;
  KvLayout layout = KvLayout::Contiguous;
  int page_size = 16;
  bool append = true;
  float theta = 10000.f;
};

// Rotate-half RoPE as the op defines it (fp32 angle, cos/sin in double), rounded to bf16.
void rope_ref(const bf16* x, int d, int pos, const std::vector<float>& inv, bool rope, float* y) {
  for (int i = 0; i < d / 2; ++i) {
    double x1 = f(x[i]), x2 = f(x[i + d / 2]), y1 = x1, y2 = x2;
    if (rope) {
      const float angle = float(pos) * inv[i];
      const double c = std::cos(double(angle)), s = std::sin(double(angle));
      y1 = x1 * c - x2 * s;
      y2 = x2 * c + x1 * s;
    }
    y[i] = f(__float2bfloat16(float(y1)));
    y[i + d / 2] = f(__float2bfloat16(float(y2)));
  }
}

void run_case(const AttnCase& c) {
  const int B = int(c.lens.size()), G = c.hq / c.hkv, D = c.d;
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int max_len = *std::max_element(c.lens.begin(), c.lens.end());

  // The logical cache, per (b, h): len x D values (the new token's row holds stale junk when appending).
  std::vector<std::vector<bf16>> kc(B * c.hkv), vc(B * c.hkv);
  for (int i = 0; i < B * c.hkv; ++i) {
    kc[i].resize(size_t(c.lens[i / c.hkv]) * D);
    vc[i].resize(kc[i].size());
    fill_uniform(kc[i], rng());
    fill_uniform(vc[i], rng());
  }
  auto q = tw::test::random_bf16(size_t(B) * c.hq * D, rng);
  auto k_new = tw::test::random_bf16(size_t(B) * c.hkv * D, rng);
  auto v_new = tw::test::random_bf16(size_t(B) * c.hkv * D, rng);

  DecodeAttentionShape shape;
  shape.batch = B;
  shape.num_q_heads = c.hq;
  shape.num_kv_heads = c.hkv;
  shape.head_dim = D;
  shape.layout = c.layout;
  shape.append = c.append;
  shape.rope_theta = c.theta;
  std::vector<int> table;
  int64_t cache_elems = 0;
  // Device row offset (elements) of token t of (b, h).
  std::function<int64_t(int, int, int)> row;
  if (c.layout == KvLayout::Contiguous) {
    shape.max_seq_len = max_len + 3;  // slack the kernel must not read
    cache_elems = int64_t(B) * c.hkv * shape.max_seq_len * D;
    row = [&](int b, int h, int t) { return ((int64_t(b) * c.hkv + h) * shape.max_seq_len + t) * D; };
  } else {
    int pages = 0;
    for (int len : c.lens) pages += (len + c.page_size - 1) / c.page_size;
    shape.page_size = c.page_size;
    shape.num_pages = pages + 5;
    shape.pages_per_seq = (max_len + c.page_size - 1) / c.page_size + 1;
    std::vector<int> perm(shape.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    table.assign(size_t(B) * shape.pages_per_seq, 0);
    int next = 0;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < (c.lens[b] + c.page_size - 1) / c.page_size; ++i)
        table[size_t(b) * shape.pages_per_seq + i] = perm[next++];
    cache_elems = int64_t(shape.num_pages) * c.hkv * c.page_size * D;
    row = [&](int b, int h, int t) {
      const int page = table[size_t(b) * shape.pages_per_seq + t / c.page_size];
      return ((int64_t(page) * c.hkv + h) * c.page_size + t % c.page_size) * D;
    };
  }

  DeviceBuffer<bf16> d_k(cache_elems), d_v(cache_elems), d_q(q.bits.size()), d_kn(k_new.bits.size()),
      d_vn(v_new.bits.size()), d_out(size_t(B) * c.hq * D);
  d_k.poison();  // every row the kernel may read without writing is uploaded below
  d_v.poison();
  // Upload runs of rows that are contiguous on the device (a page, or a whole contiguous sequence).
  const int run_len = c.layout == KvLayout::Contiguous ? max_len : c.page_size;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < c.hkv; ++h)
      for (int t = 0; t < c.lens[b]; t += run_len) {
        const int n = std::min(run_len - t % run_len, c.lens[b] - t);
        const size_t src = size_t(t) * D, bytes = size_t(n) * D * sizeof(bf16);
        TW_CUDA_CHECK(cudaMemcpy(d_k.ptr + row(b, h, t), kc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
        TW_CUDA_CHECK(cudaMemcpy(d_v.ptr + row(b, h, t), vc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
      }
  d_q.upload(q.bits);
  d_kn.upload(k_new.bits);
  d_vn.upload(v_new.bits);

  DecodeAttentionTensors t{d_q.ptr, d_kn.ptr, d_vn.ptr, d_k.ptr, d_v.ptr, d_out.ptr};

  // Reference (double), with the appended rows as the op defines them.
  const auto inv = tw::rope_inv_freq(D, c.theta > 0 ? c.theta : 1.f);
  const bool rope = c.theta > 0;
  std::vector<double> ref(size_t(B) * c.hq * D);
  std::vector<float> k_app(size_t(B) * c.hkv * D);
  const double scale = 1.0 / std::sqrt(double(D));
  for (int b = 0; b < B; ++b) {
    const int len = c.lens[b], pos = len - 1;
    for (int h = 0; h < c.hkv; ++h) {
      const size_t nh = size_t(b) * c.hkv + h;
      rope_ref(&k_new.bits[nh * D], D, pos, inv, rope, &k_app[nh * D]);
      auto key = [&](int tok, int i) {
        return (c.append && tok == pos) ? double(k_app[nh * D + i]) : double(f(kc[nh][size_t(tok) * D + i]));
      };
      auto val = [&](int tok, int i) {
        return (c.append && tok == pos) ? double(f(v_new.bits[nh * D + i])) : double(f(vc[nh][size_t(tok) * D + i]));
      };
      std::vector<float> qr(D);
      std::vector<double> s(len), acc(D);
      for (int g = 0; g < G; ++g) {
        const size_t hq = size_t(b) * c.hq + h * G + g;
        rope_ref(&q.bits[hq * D], D, pos, inv, rope, qr.data());
        double mx = -INFINITY;
        for (int tok = 0; tok < len; ++tok) {
          double dot = 0;
          for (int i = 0; i < D; ++i) dot += qr[i] * key(tok, i);
          s[tok] = dot * scale;
          mx = std::max(mx, s[tok]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int tok = 0; tok < len; ++tok) {
          const double pr = std::exp(s[tok] - mx);
          sum += pr;
          for (int i = 0; i < D; ++i) acc[i] += pr * val(tok, i);
        }
        for (int i = 0; i < D; ++i) ref[hq * D + i] = acc[i] / sum;
      }
    }
  }

  // Both K/V loaders (bulk copies on sm_90 only) x three plans (the default; 37 tiles with one
  // stage in flight per warp, so tiles hold many pairs and pairs many tiles; two tiles per SM with
  // two slots), each launched twice: the second launch checks that the merge counters were left
  // at zero. Before each op the appended rows get their stale contents back, so each one must
  // overwrite them (and use the new row, not the stale one).
  int major = 0;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  std::vector<tw::KvLoad> loads = {tw::KvLoad::CpAsync};
  if (major >= 9) loads.push_back(tw::KvLoad::Bulk);
  struct Plan {
    int num_tiles, tiles_per_sm, ring_slots;
  };
  for (const tw::KvLoad load : loads)
  for (const Plan plan : {Plan{0, 0, 0}, Plan{37, 0, 1}, Plan{0, 2, 2}}) {
    SCOPED_TRACE(load == tw::KvLoad::Bulk ? "bulk copies" : "cp.async");
    SCOPED_TRACE("num_tiles " + std::to_string(plan.num_tiles) + ", tiles_per_sm " + std::to_string(plan.tiles_per_sm) +
                 ", ring_slots " + std::to_string(plan.ring_slots));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < c.hkv; ++h) {
        const size_t src = size_t(c.lens[b] - 1) * D, bytes = D * sizeof(bf16);
        const int64_t r = row(b, h, c.lens[b] - 1);
        TW_CUDA_CHECK(cudaMemcpy(d_k.ptr + r, kc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
        TW_CUDA_CHECK(cudaMemcpy(d_v.ptr + r, vc[b * c.hkv + h].data() + src, bytes, cudaMemcpyHostToDevice));
      }
    shape.kv_load = load;
    shape.num_tiles = plan.num_tiles;
    shape.tiles_per_sm = plan.tiles_per_sm;
    shape.ring_slots = plan.ring_slots;
    DecodeAttention op(shape, c.lens, table);
    for (int launch = 0; launch < 2; ++launch) {
      d_out.poison();
      op.run(t, nullptr);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      const double err = tw::test::rel_error(d_out.download(), ref);
      EXPECT_LT(err, 1e-2) << "launch " << launch << ", tiles " << op.num_tiles() << ", slots " << op.ring_slots();
    }

    // The appended rows: roped k (within a bf16 rounding step of the reference) and v exactly.
    if (!c.append) continue;
    int bad_k = 0, bad_v = 0;
    std::vector<bf16> kr(D), vr(D);
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < c.hkv; ++h) {
        const size_t nh = size_t(b) * c.hkv + h;
        const int64_t r = row(b, h, c.lens[b] - 1);
        TW_CUDA_CHECK(cudaMemcpy(kr.data(), d_k.ptr + r, D * sizeof(bf16), cudaMemcpyDeviceToHost));
        TW_CUDA_CHECK(cudaMemcpy(vr.data(), d_v.ptr + r, D * sizeof(bf16), cudaMemcpyDeviceToHost));
        for (int i = 0; i < D; ++i) {
          const float want = k_app[nh * D + i];
          if (!(std::fabs(f(kr[i]) - want) <= 1e-2f * std::fabs(want) + 1e-6f)) ++bad_k;
          if (f(vr[i]) != f(v_new.bits[nh * D + i])) ++bad_v;
        }
      }
    EXPECT_EQ(bad_k, 0) << "appended k rows differ from the roped reference";
    EXPECT_EQ(bad_v, 0) << "appended v rows differ from v_new";
  }
}

const std::vector<int> kMixedLens = {1, 2, 17, 255, 4096, 100003};

TEST(AttentionDecode, ContiguousMixedLengthsGqa4D128) {
  TW_REQUIRE_GPU();
  run_case({kMixedLens, 32, 8, 128, KvLayout::Contiguous});
}

TEST(AttentionDecode, PagedMixedLengthsGqa8D64Page16) {
  TW_REQUIRE_GPU();
  run_case({kMixedLens, 16, 2, 64, KvLayout::Paged, 16});
}

TEST(AttentionDecode, PagedMixedLengthsGqa1D128Page256) {
  TW_REQUIRE_GPU();
  run_case({kMixedLens, 4, 4, 128, KvLayout::Paged, 256});
}

TEST(AttentionDecode, Batch64ContiguousGqa4) {
  TW_REQUIRE_GPU();
  std::mt19937 rng(tw::test::fresh_seed());
  std::vector<int> lens(64);
  for (auto& l : lens) l = 1 + int(rng() % 1200);
  run_case({lens, 32, 8, 128, KvLayout::Contiguous});
}

TEST(AttentionDecode, Batch64PagedGqa8Page48) {
  TW_REQUIRE_GPU();
  std::mt19937 rng(tw::test::fresh_seed());
  std::vector<int> lens(64);
  for (auto& l : lens) l = 1 + int(rng() % 700);
  run_case({lens, 16, 2, 128, KvLayout::Paged, 48});
}

// Equal lengths take the kernel's arithmetic plan (no table loads).
TEST(AttentionDecode, EqualLengthsContiguousGqa8D128) {
  TW_REQUIRE_GPU();
  run_case({std::vector<int>(5, 1000), 32, 4, 128, KvLayout::Contiguous});
}

TEST(AttentionDecode, EqualLengthsPagedGqa4D64Page32) {
  TW_REQUIRE_GPU();
  run_case({std::vector<int>(3, 333), 16, 4, 64, KvLayout::Paged, 32});
}

TEST(AttentionDecode, NoAppendNoRopeGqa3D64) {
  TW_REQUIRE_GPU();
  AttnCase c{{5, 300, 1000, 17}, 6, 2, 64, KvLayout::Contiguous};
  c.append = false;
  c.theta = 0.f;
  run_case(c);
}

// The stream-K plan: every tile gets the same units to one, the pair table is a prefix sum, and
// tile_first names the pair holding each tile's first unit.
TEST(AttentionDecode, PlanCutsUnitsEvenly) {
  TW_REQUIRE_GPU();
  std::mt19937 rng(tw::test::fresh_seed());
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int> lens(1 + rng() % 40);
    for (auto& l : lens) l = 1 + int(rng() % (rng() % 2 ? 40 : 20000));
    const int hkv = 1 + int(rng() % 8), want_tiles = 1 + int(rng() % 300);
    const tw::DecodePlan pl = tw::plan_decode(lens, hkv, want_tiles);
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
      const int u0 = tw::kernels::decode_tile_start(c, pl.num_tiles, units);
      const int u1 = tw::kernels::decode_tile_start(c + 1, pl.num_tiles, units);
      lo = std::min(lo, u1 - u0);
      hi = std::max(hi, u1 - u0);
      const int pair = pl.tile_first[4 * c];
      ASSERT_LE(pl.pair_info[2 * pair], u0);
      ASSERT_GT(pl.pair_info[2 * (pair + 1)], u0);
      ASSERT_EQ(pl.tile_first[4 * c + 1], pl.pair_info[2 * pair]);
      ASSERT_EQ(pl.tile_first[4 * c + 2], pl.pair_info[2 * (pair + 1)]);
      ASSERT_EQ(pl.tile_first[4 * c + 3], lens[pair / hkv]);
      ASSERT_EQ(tw::kernels::decode_tile_of(u0, pl.num_tiles, units), c);
      ASSERT_EQ(tw::kernels::decode_tile_of(u1 - 1, pl.num_tiles, units), c);
    }
    EXPECT_GE(lo, 1);
    EXPECT_LE(hi - lo, 1);
  }
}

// The executor's tile list: tiles in order, their pair ranges overlapping by at most the pair
// they share, together covering every pair.
TEST(AttentionDecode, TilesCoverEveryPair) {
  TW_REQUIRE_GPU();
  DecodeAttentionShape s;
  s.batch = 3;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.max_seq_len = 70000;
  DecodeAttention op(s, {70000, 3, 900});
  const auto tiles = op.tiles();
  ASSERT_EQ(int(tiles.size()), op.num_tiles());
  EXPECT_EQ(tiles.front().pair_begin, 0);
  EXPECT_EQ(tiles.back().pair_end, 6);
  for (size_t i = 0; i < tiles.size(); ++i) {
    EXPECT_EQ(tiles[i].tile, int(i));
    EXPECT_LT(tiles[i].pair_begin, tiles[i].pair_end);
    if (i > 0) EXPECT_GE(tiles[i].pair_begin, tiles[i - 1].pair_end - 1);
    if (i > 0) EXPECT_LE(tiles[i].pair_begin, tiles[i - 1].pair_end);
  }
}

TEST(AttentionDecode, BadInputThrowsBeforeLaunch) {
  TW_REQUIRE_GPU();
  DecodeAttentionShape s;
  s.batch = 2;
  s.max_seq_len = 100;
  EXPECT_THROW(DecodeAttention(s, {5, 0}), tw::InvalidArgument);     // length 0
  EXPECT_THROW(DecodeAttention(s, {5, 101}), tw::InvalidArgument);   // past max_seq_len
  EXPECT_THROW(DecodeAttention(s, {5}), tw::InvalidArgument);        // lengths for one sequence
  DecodeAttentionShape h = s;
  h.num_q_heads = 30;  // 30 % 8 != 0
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h.num_q_heads = 72;  // group 9
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h = s;
  h.head_dim = 96;
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h = s;
  h.num_tiles = tw::kernels::kDecodeMaxTiles + 1;
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h = s;
  h.ring_slots = tw::kernels::kDecodeMaxSlots + 1;
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);

  DecodeAttentionShape p = s;
  p.layout = KvLayout::Paged;
  p.page_size = 16;
  p.num_pages = 4;
  p.pages_per_seq = 2;
  EXPECT_NO_THROW(DecodeAttention(p, {20, 3}, {0, 1, 2, 3}));
  EXPECT_THROW(DecodeAttention(p, {20, 3}, {0, 4, 2, 3}), tw::InvalidArgument);   // page 4 of 4
  EXPECT_THROW(DecodeAttention(p, {20, 3}, {0, 1, -1, 3}), tw::InvalidArgument);  // negative page
  EXPECT_THROW(DecodeAttention(p, {33, 3}, {0, 1, 2, 3}), tw::InvalidArgument);   // needs 3 pages
  EXPECT_THROW(DecodeAttention(p, {20, 3}, {0, 1, 2}), tw::InvalidArgument);      // table too short
  p.page_size = 24;
  EXPECT_THROW(DecodeAttention(p, {20, 3}, {0, 1, 2, 3}), tw::InvalidArgument);

  // Null or misaligned tensors are rejected at run(), before the launch.
  DecodeAttention ok(s, {5, 5});
  DecodeAttentionTensors t;
  EXPECT_THROW(ok.run(t, nullptr), tw::InvalidArgument);
}

}  // namespace
