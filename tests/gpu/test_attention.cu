// Decode attention (ops/attention.hpp) against a double-precision CPU reference on fresh random
// inputs: mixed lengths 1 .. 100003 in one batch, B = 64, GQA 1/3/4/8, head dim 64/128, contiguous
// and paged caches, several stream-K plans, and the few-token path (a grid of short caches, the
// sweep's short shapes); outputs poisoned before every run, the appended cache rows checked, and bad
// input rejected before any launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_ref.cuh"
#include "tileweave/runtime/grid_dependency.cuh"

namespace {

using tw::DecodeAttention;
using tw::DecodeAttentionShape;
using tw::DecodeAttentionTensors;
using tw::KvLayout;
using tw::test::AttnCase;
using tw::test::DeviceBuffer;
using tw::test::bf;
using bf16 = __nv_bfloat16;

// The new token's cache rows after a launch: roped k (within a bf16 rounding step of the reference)
// and v exactly.
void check_appended_rows(const tw::test::AttnData& data) {
  if (!data.c.append) return;
  const int D = data.D, hkv = data.c.hkv;
  int bad_k = 0, bad_v = 0;
  std::vector<bf16> kr(D), vr(D);
  for (int b = 0; b < data.B; ++b)
    for (int h = 0; h < hkv; ++h) {
      const size_t nh = size_t(b) * hkv + h;
      const int64_t r = data.row(b, h, data.c.lens[b] - 1);
      TW_CUDA_CHECK(cudaMemcpy(kr.data(), data.d_k->ptr + r, D * sizeof(bf16), cudaMemcpyDeviceToHost));
      TW_CUDA_CHECK(cudaMemcpy(vr.data(), data.d_v->ptr + r, D * sizeof(bf16), cudaMemcpyDeviceToHost));
      for (int i = 0; i < D; ++i) {
        const float want = data.k_app[nh * D + i];
        if (!(std::fabs(bf(kr[i]) - want) <= 1e-2f * std::fabs(want) + 1e-6f)) ++bad_k;
        if (bf(vr[i]) != bf(data.v_new.bits[nh * D + i])) ++bad_v;
      }
    }
  EXPECT_EQ(bad_k, 0) << "appended k rows differ from the roped reference";
  EXPECT_EQ(bad_v, 0) << "appended v rows differ from v_new";
}

void run_case(const AttnCase& c) {
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  tw::test::AttnData data(c, rng);
  const int B = data.B, D = data.D;
  DecodeAttentionShape shape = data.shape;
  DeviceBuffer<bf16> d_out(size_t(B) * c.hq * D);
  const DecodeAttentionTensors t = data.tensors(d_out.ptr);

  // Both K/V loaders (bulk copies on sm_90 only, built up to head dim 128 and 8 heads per KV head) x
  // three plans (the default; 37 tiles with one stage in flight per warp, so tiles hold many pairs
  // and pairs many tiles; two tiles per SM with two slots, one at head dim 256), each launched twice:
  // the second launch checks that the merge counters were left at zero. Before each op the appended
  // rows get their stale contents back, so each one must overwrite them (and use the new row, not
  // the stale one).
  int major = 0;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  std::vector<tw::KvLoad> loads = {tw::KvLoad::CpAsync};
  if (major >= 9 && D <= 128 && c.hq <= 8 * c.hkv) loads.push_back(tw::KvLoad::Bulk);
  struct Plan {
    int num_tiles, tiles_per_sm, ring_slots;
  };
  const bool two_per_sm = D <= 128 || c.hq <= 8 * c.hkv;  // head dim 256 with 16 heads: one tile per SM only
  std::vector<Plan> plans = {Plan{0, 0, 0}, Plan{37, 0, 1}};
  if (two_per_sm) plans.push_back(Plan{0, 2, D <= 128 ? 2 : 1});
  for (const tw::KvLoad load : loads)
  for (const Plan plan : plans) {
    SCOPED_TRACE(load == tw::KvLoad::Bulk ? "bulk copies" : "cp.async");
    SCOPED_TRACE("num_tiles " + std::to_string(plan.num_tiles) + ", tiles_per_sm " + std::to_string(plan.tiles_per_sm) +
                 ", ring_slots " + std::to_string(plan.ring_slots));
    data.restore_stale_rows();
    shape.kv_load = load;
    shape.num_tiles = plan.num_tiles;
    shape.tiles_per_sm = plan.tiles_per_sm;
    shape.ring_slots = plan.ring_slots;
    DecodeAttention op(shape, c.lens, data.table);
    for (int launch = 0; launch < 2; ++launch) {
      d_out.poison();
      op.run(t, nullptr);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      const double err = tw::test::rel_error(d_out.download(), data.ref);
      EXPECT_LT(err, 1e-2) << "launch " << launch << ", tiles " << op.num_tiles() << ", slots " << op.ring_slots();
    }

    check_appended_rows(data);
  }
}

// The few-token path (kernels/attention/decode_short.cuh): the default plan must take it. Each op is
// launched twice (outputs poisoned, the new token's stale rows restored before the first launch), and
// the output and the appended rows are checked against the reference; then the same data through the
// stream-K kernel (few_tokens = false), the switch an A/B uses.
void run_few_token_case(const AttnCase& c) {
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  tw::test::AttnData data(c, rng);
  DecodeAttentionShape shape = data.shape;
  DeviceBuffer<bf16> d_out(size_t(data.B) * c.hq * data.D);
  const DecodeAttentionTensors t = data.tensors(d_out.ptr);
  for (const bool few : {true, false}) {
    SCOPED_TRACE(few ? "few-token path" : "stream-K kernel (few_tokens = false)");
    shape.few_tokens = few;
    DecodeAttention op(shape, c.lens, data.table);
    ASSERT_EQ(op.few_tokens(), few) << "the planner's rule (decode_few_tokens) did not take this shape";
    data.restore_stale_rows();
    for (int launch = 0; launch < 2; ++launch) {
      d_out.poison();
      op.run(t, nullptr);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_LT(tw::test::rel_error(d_out.download(), data.ref), 1e-2) << "launch " << launch;
    }
    check_appended_rows(data);
  }
}

std::string describe(const AttnCase& c) {
  const bool ragged = std::any_of(c.lens.begin(), c.lens.end(), [&](int l) { return l != c.lens[0]; });
  return std::to_string(c.hq) + "/" + std::to_string(c.hkv) + " heads, d " + std::to_string(c.d) + ", B " +
         std::to_string(c.lens.size()) + ", longest " + std::to_string(*std::max_element(c.lens.begin(), c.lens.end())) +
         (ragged ? " ragged" : "") +
         (c.layout == KvLayout::Paged ? ", paged " + std::to_string(c.page_size) : ", contiguous") +
         (c.append ? ", append" : "") + (c.theta > 0 ? ", rope" : "");
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

// Groups of 9..16 heads (two mma row blocks, the group read at run time) and head dim 256 (q's
// fragments from shared memory).
TEST(AttentionDecode, PagedMixedLengthsGqa16D128Page32) {
  TW_REQUIRE_GPU();
  run_case({kMixedLens, 32, 2, 128, KvLayout::Paged, 32});
}

TEST(AttentionDecode, ContiguousMixedLengthsGqa11D64) {
  TW_REQUIRE_GPU();
  run_case({kMixedLens, 33, 3, 64, KvLayout::Contiguous});
}

TEST(AttentionDecode, ContiguousMixedLengthsGqa8D256) {
  TW_REQUIRE_GPU();
  run_case({kMixedLens, 16, 2, 256, KvLayout::Contiguous});
}

TEST(AttentionDecode, PagedMixedLengthsGqa5D256Page16) {
  TW_REQUIRE_GPU();
  run_case({kMixedLens, 20, 4, 256, KvLayout::Paged, 16});
}

TEST(AttentionDecode, Batch40PagedGqa13D256Page64) {
  TW_REQUIRE_GPU();
  std::mt19937 rng(tw::test::fresh_seed());
  std::vector<int> lens(40);
  for (auto& l : lens) l = 1 + int(rng() % 900);
  run_case({lens, 13, 1, 256, KvLayout::Paged, 64});
}

// Shapes drawn from a seed, as issue 16's attention sweep draws them (bench_attention_sweep), at test
// sizes: 1..16 query heads per KV head, 1..8 KV heads, head dim 64 / 128 / 256, B 1..24, the longest
// length log-uniform in 1..6000 (the CPU reference's work capped), equal or ragged, contiguous or
// paged 16 .. 64, with or without the append and RoPE; each through run_case's plans and loaders.
// TW_SHAPE_SEED picks the grid: the default is the same every run, any other one a grid no test names.
TEST(AttentionDecode, RandomShapeGrid) {
  TW_REQUIRE_GPU();
  const uint64_t seed = tw::test::shape_seed();
  SCOPED_TRACE("TW_SHAPE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed ^ 0xA77E);
  static const int kDims[] = {64, 128, 256};
  static const int kPages[] = {16, 32, 48, 64};
  for (int i = 0; i < 10; ++i) {
    AttnCase c;
    const int group = 1 + int(rng() % 16);
    c.hkv = 1 + int(rng() % 8);
    c.hq = group * c.hkv;
    c.d = kDims[rng() % std::size(kDims)];
    const int batch = 1 + int(rng() % 24);
    int longest = std::max(1, int(std::exp2(std::uniform_real_distribution<double>(0.0, std::log2(6000.0))(rng))));
    while (double(batch) * longest * c.hq * c.d > 1.5e8 && longest > 1) longest /= 2;
    const bool ragged = rng() % 2 == 1;
    for (int b = 0; b < batch; ++b) c.lens.push_back(ragged && b > 0 ? 1 + int(rng() % uint64_t(longest)) : longest);
    c.layout = rng() % 2 ? KvLayout::Paged : KvLayout::Contiguous;
    c.page_size = kPages[rng() % std::size(kPages)];
    c.append = rng() % 4 != 0;
    c.theta = rng() % 4 == 0 ? 0.f : 10000.f;
    SCOPED_TRACE("shape " + std::to_string(i) + ": " + std::to_string(c.hq) + "/" + std::to_string(c.hkv) + " heads, d " +
                 std::to_string(c.d) + ", B " + std::to_string(batch) + ", longest " + std::to_string(longest) +
                 (ragged ? " ragged" : "") +
                 (c.layout == KvLayout::Paged ? ", paged " + std::to_string(c.page_size) : ", contiguous") +
                 (c.append ? ", append" : "") + (c.theta > 0 ? ", rope" : ""));
    run_case(c);
  }
}

// The few-token path on a grid from the shape seed: every head dim x groups 1, 4, 7, 16 x contiguous
// and paged (16 / 32 / 64, pages shuffled), the append and RoPE each on and off across the grid; 1..4
// KV heads, B 1..64 (fewer where the GPU's one wave of blocks holds fewer pairs), the longest length
// 1..64 (odd ones most of the time), equal or ragged. run_few_token_case asserts the path was taken.
TEST(AttentionDecode, FewTokenRandomGrid) {
  TW_REQUIRE_GPU();
  const uint64_t seed = tw::test::shape_seed();
  SCOPED_TRACE("TW_SHAPE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed ^ 0xFE7);
  int sms = 0;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  static const int kPages[] = {16, 32, 64};
  int i = 0;
  for (const int d : {64, 128, 256})
    for (const int group : {1, 4, 7, 16})
      for (const KvLayout layout : {KvLayout::Contiguous, KvLayout::Paged}) {
        AttnCase c;
        c.d = d;
        c.hkv = 1 + int(rng() % 4);
        c.hq = group * c.hkv;
        c.layout = layout;
        c.page_size = kPages[rng() % std::size(kPages)];
        const int k = (i + i / 8) % 4;  // each (append, RoPE) pair meets both layouts over the head dims
        ++i;
        c.append = (k & 1) == 0;
        c.theta = (k & 2) == 0 ? 10000.f : 0.f;
        const int most = std::min(64, sms * tw::kernels::decode_short_blocks_per_sm(d) / c.hkv);
        const int batch = 1 + int(rng() % uint64_t(most));
        int longest = 1 + int(rng() % 64);
        if (longest % 2 == 0 && rng() % 4 != 0) longest -= 1;
        const bool ragged = rng() % 2 == 1;
        for (int b = 0; b < batch; ++b) c.lens.push_back(ragged && b > 0 ? 1 + int(rng() % uint64_t(longest)) : longest);
        SCOPED_TRACE("shape " + std::to_string(i - 1) + ": " + describe(c));
        run_few_token_case(c);
      }
}

// The sweep's shapes that lost to SDPA (bench/results/h200/attention_sweep.json, seed 16), as they
// were benchmarked (RoPE and the append on), plus the extremes of the rule: 64 tokens at head dim 256
// and 16 heads, ragged, in 16-token pages; 1 token; and lengths on the device keeping the stream-K kernel.
TEST(AttentionDecode, FewTokenSweepShapes) {
  TW_REQUIRE_GPU();
  const std::vector<AttnCase> cases = {
      {std::vector<int>(16, 13), 8, 1, 64, KvLayout::Paged, 64},
      {std::vector<int>(64, 9), 64, 8, 64, KvLayout::Contiguous},
      {std::vector<int>(4, 3), 64, 8, 64, KvLayout::Paged, 32},
      {std::vector<int>(2, 45), 32, 8, 128, KvLayout::Contiguous},
      {std::vector<int>(1, 19), 16, 8, 64, KvLayout::Contiguous},
      {std::vector<int>(32, 8), 14, 2, 256, KvLayout::Contiguous},
      {std::vector<int>(64, 4), 14, 2, 128, KvLayout::Paged, 32},
      {std::vector<int>(8, 1), 8, 1, 256, KvLayout::Contiguous},
      {std::vector<int>(2, 7), 8, 1, 64, KvLayout::Contiguous},
      {{64, 1, 33, 17, 48, 63, 16, 2}, 32, 2, 256, KvLayout::Paged, 16},
  };
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(describe(c));
    run_few_token_case(c);
  }
  DecodeAttentionShape dyn;
  dyn.batch = 4;
  dyn.num_q_heads = 8;
  dyn.num_kv_heads = 1;
  dyn.head_dim = 64;
  dyn.max_seq_len = 13;
  EXPECT_FALSE(DecodeAttention(dyn).few_tokens()) << "lengths on the device take the stream-K kernel";
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

// Stands in for the QKV projection before attention in a decode step: writes the new token's q,
// k_new and v_new after ~20 us, having let the next launch start at once (so an overlapped
// attention that read them before its wait would read the poison).
__global__ void write_token(bf16* q, const bf16* q_src, size_t nq, bf16* kn, const bf16* kn_src, bf16* vn,
                            const bf16* vn_src, size_t nkv) {
  tw::runtime::allow_next_launch();
  for (int i = 0; i < 20; ++i) __nanosleep(1000);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < nq; i += size_t(gridDim.x) * blockDim.x) {
    q[i] = q_src[i];
    if (i < nkv) kn[i] = kn_src[i], vn[i] = vn_src[i];
  }
}

// Overlapped launches (overlap_previous) after a kernel that writes q, k_new and v_new (poisoned
// until then), three steps on three caches back to back with one op (shared partials and merge
// counts), on a stream and in a CUDA graph: a launch must read the new token, append, write partials
// and merge only after the kernel before ends. `few`: the few-token path (its K/V and page ids read
// before the wait); else both loaders and both plans of the stream-K kernel.
void run_overlapped(const AttnCase& c, bool few) {
  int major = 0;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) GTEST_SKIP() << "overlap_previous needs an sm_90 GPU";
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int kSteps = 3;
  std::vector<std::unique_ptr<tw::test::AttnData>> step;
  for (int i = 0; i < kSteps; ++i) step.push_back(std::make_unique<tw::test::AttnData>(c, rng));
  const int B = step[0]->B, D = step[0]->D;
  const size_t nq = size_t(B) * c.hq * D, nkv = size_t(B) * c.hkv * D;
  // The real q / k_new / v_new of each step, kept aside: the token writer copies them in.
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> q_src, kn_src, vn_src;
  for (auto& s : step) {
    q_src.push_back(std::make_unique<DeviceBuffer<bf16>>(nq));
    kn_src.push_back(std::make_unique<DeviceBuffer<bf16>>(nkv));
    vn_src.push_back(std::make_unique<DeviceBuffer<bf16>>(nkv));
    q_src.back()->upload(s->q.bits);
    kn_src.back()->upload(s->k_new.bits);
    vn_src.back()->upload(s->v_new.bits);
  }
  std::vector<std::unique_ptr<DeviceBuffer<bf16>>> out;
  for (int i = 0; i < kSteps; ++i) out.push_back(std::make_unique<DeviceBuffer<bf16>>(nq));
  cudaStream_t st;
  TW_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  struct Variant {
    tw::KvLoad load;
    int per_sm;
  };
  std::vector<Variant> variants = {{tw::KvLoad::Auto, 0}};
  if (!few) variants = {{tw::KvLoad::CpAsync, 1}, {tw::KvLoad::CpAsync, 2}, {tw::KvLoad::Bulk, 1}, {tw::KvLoad::Bulk, 2}};
  for (const Variant& v : variants)
    for (bool graph : {false, true}) {
      SCOPED_TRACE(std::string(few ? "few-token path" : v.load == tw::KvLoad::Bulk ? "bulk copies" : "cp.async") +
                   ", tiles per SM " + std::to_string(v.per_sm) + (graph ? ", graph" : ", stream"));
      DecodeAttentionShape shape = step[0]->shape;
      shape.kv_load = v.load;
      shape.tiles_per_sm = v.per_sm;
      shape.overlap_previous = true;
      // Paged steps have page tables of their own, so ops of their own; contiguous ones share one op.
      std::vector<std::unique_ptr<DecodeAttention>> ops;
      for (int i = 0; i < (step[0]->table.empty() ? 1 : kSteps); ++i) {
        ops.push_back(std::make_unique<DecodeAttention>(shape, c.lens, step[i]->table));
        ASSERT_EQ(ops.back()->few_tokens(), few);
      }
      for (int i = 0; i < kSteps; ++i) {
        step[i]->restore_stale_rows();
        step[i]->d_q->poison();
        step[i]->d_kn->poison();
        step[i]->d_vn->poison();
        out[i]->poison();
      }
      auto enqueue = [&](cudaStream_t st) {
        for (int i = 0; i < kSteps; ++i) {
          write_token<<<16, 256, 0, st>>>(step[i]->d_q->ptr, q_src[i]->ptr, nq, step[i]->d_kn->ptr, kn_src[i]->ptr,
                                          step[i]->d_vn->ptr, vn_src[i]->ptr, nkv);
          ops[std::min<size_t>(i, ops.size() - 1)]->run(step[i]->tensors(out[i]->ptr), st);
        }
      };
      if (graph) {
        tw::test::run_in_graph(st, enqueue);
      } else {
        enqueue(st);
        TW_CUDA_CHECK(cudaStreamSynchronize(st));
      }
      for (int i = 0; i < kSteps; ++i) {
        SCOPED_TRACE("step " + std::to_string(i));
        EXPECT_LT(tw::test::rel_error(out[i]->download(), step[i]->ref), 1e-2);
        check_appended_rows(*step[i]);
      }
    }
  TW_CUDA_CHECK(cudaStreamDestroy(st));
}

TEST(AttentionDecode, OverlappedLaunchesAfterTheTokenWriter) {
  TW_REQUIRE_GPU();
  run_overlapped({{3000, 70, 1}, 32, 8, 128, KvLayout::Contiguous}, false);
}

TEST(AttentionDecode, OverlappedFewTokenLaunchesAfterTheTokenWriter) {
  TW_REQUIRE_GPU();
  run_overlapped({{13, 64, 1, 40}, 32, 8, 128, KvLayout::Paged, 16}, true);
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
  h.num_q_heads = 136;  // group 17
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h = s;
  h.head_dim = 96;
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h.head_dim = 512;
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  // Variants that are not built: bulk copies past head dim 128 or 8 heads per KV head; head dim
  // 256 with 16 heads at two tiles per SM (no room for a ring).
  h = s;
  h.kv_load = tw::KvLoad::Bulk;
  h.head_dim = 256;
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h.head_dim = 128;
  h.num_q_heads = 80;  // group 10
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h = s;
  h.head_dim = 256;
  h.num_q_heads = 128;  // group 16
  h.tiles_per_sm = 2;
  EXPECT_THROW(DecodeAttention(h, {5, 5}), tw::InvalidArgument);
  h.tiles_per_sm = 0;
  EXPECT_NO_THROW(DecodeAttention(h, {5, 5}));
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

  // Null or misaligned tensors are rejected at run(), before the launch -- of either kernel.
  DecodeAttention ok(s, {5, 5});
  EXPECT_TRUE(ok.few_tokens());
  DecodeAttentionTensors t;
  EXPECT_THROW(ok.run(t, nullptr), tw::InvalidArgument);
  DecodeAttentionShape off = s;
  off.few_tokens = false;
  DecodeAttention ok_stream_k(off, {5, 5});
  EXPECT_FALSE(ok_stream_k.few_tokens());
  EXPECT_THROW(ok_stream_k.run(t, nullptr), tw::InvalidArgument);

  // Lengths on the device: a plan for a cache of no tokens is refused; a run without the device
  // lengths (or a fixed-length plan given some) throws before the launch.
  DecodeAttentionShape z = s;
  z.max_seq_len = 0;
  EXPECT_THROW(DecodeAttention{z}, tw::InvalidArgument);
  DeviceBuffer<bf16> q(2 * 32 * 128), kv(2 * 8 * 100 * 128), out(2 * 32 * 128);
  DeviceBuffer<int> lens(2);
  DecodeAttentionTensors dt{q.ptr, q.ptr, q.ptr, kv.ptr, kv.ptr, out.ptr};
  DecodeAttention dyn(s);
  EXPECT_THROW(dyn.run(dt, nullptr), tw::InvalidArgument);
  dt.seq_lens = lens.ptr;
  EXPECT_THROW(ok.run(dt, nullptr), tw::InvalidArgument);
}

// Lengths and page table on the device (DecodeAttention(shape)): one plan serves two batches of
// lengths of the same shape (the second a shuffle of the first), each launched twice; bad lengths and
// pages give NaN, leave the caches alone and are named by take_device_error, and the plan computes
// normally afterwards.
TEST(AttentionDecode, DeviceLengthsOnePlanEveryLength) {
  TW_REQUIRE_GPU();
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const KvLayout layout : {KvLayout::Contiguous, KvLayout::Paged}) {
    SCOPED_TRACE(layout == KvLayout::Paged ? "paged" : "contiguous");
    std::vector<int> lens_a = {1, 17, 300, 4096, 33, 2, 1000};
    std::vector<int> lens_b = lens_a;
    std::shuffle(lens_b.begin(), lens_b.end(), rng);
    tw::test::AttnData a({lens_a, 32, 8, 128, layout, 16}, rng), b({lens_b, 32, 8, 128, layout, 16}, rng);
    DecodeAttention op(a.shape);
    EXPECT_TRUE(op.device_lengths());
    DeviceBuffer<bf16> d_out(size_t(a.B) * 32 * 128);
    DeviceBuffer<int> d_lens(a.B), d_table(std::max<size_t>(a.table.size(), 1));
    for (tw::test::AttnData* d : {&a, &b, &a}) {
      d_lens.upload(d->c.lens);
      if (!d->table.empty()) d_table.upload(d->table);
      DecodeAttentionTensors t = d->tensors(d_out.ptr);
      t.seq_lens = d_lens.ptr;
      t.page_table = d->table.empty() ? nullptr : d_table.ptr;
      for (int launch = 0; launch < 2; ++launch) {
        d->restore_stale_rows();
        d_out.poison();
        op.run(t, nullptr);
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_LT(tw::test::rel_error(d_out.download(), d->ref), 1e-2) << "launch " << launch;
      }
      EXPECT_EQ(op.take_device_error(), "");
    }

    // Bad values: NaN out, the caches untouched, the first bad value named; then a good launch.
    std::vector<int> bad_lens = lens_a;
    bad_lens[3] = layout == KvLayout::Paged ? a.shape.pages_per_seq * 16 + 1 : int(a.shape.max_seq_len) + 1;
    d_lens.upload(bad_lens);
    if (!a.table.empty()) d_table.upload(a.table);
    DecodeAttentionTensors t = a.tensors(d_out.ptr);
    t.seq_lens = d_lens.ptr;
    t.page_table = a.table.empty() ? nullptr : d_table.ptr;
    const std::vector<bf16> k_before = a.d_k->download();
    op.run(t, nullptr);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    for (bf16 v : d_out.download()) ASSERT_TRUE(std::isnan(bf(v)));
    const std::vector<bf16> k_after = a.d_k->download();  // bytes: the poisoned rows are NaN
    EXPECT_EQ(std::memcmp(k_after.data(), k_before.data(), k_before.size() * sizeof(bf16)), 0)
        << "a cancelled launch wrote the cache";
    const std::string e = op.take_device_error();
    EXPECT_NE(e.find("seq_lens[3] = " + std::to_string(bad_lens[3]) + " is outside"), std::string::npos) << e;
    EXPECT_EQ(op.take_device_error(), "");  // reported once
    if (layout == KvLayout::Paged) {
      std::vector<int> bad_table = a.table;
      bad_table[size_t(4) * a.shape.pages_per_seq + 1] = a.shape.num_pages;  // sequence 4 (33 tokens) uses 3 pages
      d_lens.upload(lens_a);
      d_table.upload(bad_table);
      op.run(t, nullptr);
      const std::string ep = op.take_device_error();
      const std::string want = "page_table[4][1] = " + std::to_string(a.shape.num_pages) + " is outside";
      EXPECT_NE(ep.find(want), std::string::npos) << ep;
      d_table.upload(a.table);
    }
    d_lens.upload(lens_a);
    a.restore_stale_rows();
    d_out.poison();
    op.run(t, nullptr);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(tw::test::rel_error(d_out.download(), a.ref), 1e-2) << "after the bad launches";
  }
}

}  // namespace
