// Attention -> o_proj in one executor launch (ops/attention_oproj.hpp) against a double-precision
// CPU reference: B = 3 with lengths 17/255/4096 and B = 20 (the 64-row o_proj tiles), GQA 1/4/8,
// head dim 64/128, contiguous and paged caches, odd hidden sizes, with and without a residual.
// Every launch gets fresh random q/k/v (and the reference for them) and a poisoned output; each
// op launches three times (epoch counters, merge counters, split-K accumulators left clean);
// option variants cover split-K, one block per SM, another order, and the stress mode (producers
// sleep at random before signalling, bounded waits) that exposes a missing wait.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "attention_ref.cuh"
#include "tileweave/ops/attention_oproj.hpp"

namespace {

using tw::AttentionOproj;
using tw::AttentionOprojOptions;
using tw::KvLayout;
using tw::test::AttnCase;
using tw::test::DeviceBuffer;
using bf16 = __nv_bfloat16;

constexpr uint32_t kSpinLimit = 2'000'000;  // ~0.5 s of polling: a missing edge fails fast
constexpr double kTol = 1e-2;

struct OprojCase {
  AttnCase attn;
  int64_t hidden;
  bool residual;
};

// y = O . Wo^T (+ R) with O the attention reference (double).
std::vector<double> oproj_ref(const std::vector<double>& o, const std::vector<float>& w, const std::vector<float>* r,
                              int64_t rows, int64_t k, int64_t n) {
  std::vector<double> y(rows * n);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t j = 0; j < n; ++j) {
      double s = r ? (*r)[m * n + j] : 0.0;
      const double* a = &o[m * k];
      const float* b = &w[j * k];
      for (int64_t i = 0; i < k; ++i) s += a[i] * b[i];
      y[m * n + j] = s;
    }
  return y;
}

void run_case(const OprojCase& c, const std::vector<AttentionOprojOptions>& variants, int launches = 3) {
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  tw::test::AttnData data(c.attn, rng);
  const int64_t B = data.B, K = int64_t(c.attn.hq) * data.D, N = c.hidden;
  // Wo scaled by 1/sqrt(K) so y has unit scale, like the residual.
  auto w = tw::test::random_bf16(size_t(N * K), rng, 1.f / std::sqrt(float(K)));
  DeviceBuffer<bf16> d_w(w.bits.size()), d_r(size_t(B * N)), d_y(size_t(B * N));
  d_w.upload(w.bits);
  for (const AttentionOprojOptions& base : variants) {
    AttentionOprojOptions opt = base;
    opt.residual = c.residual;
    if (opt.spin_limit == 0) opt.spin_limit = kSpinLimit;
    SCOPED_TRACE("split_k " + std::to_string(opt.split_k) + ", blocks/SM " + std::to_string(opt.blocks_per_sm) +
                 ", order " + opt.order + ", delay_ns " + std::to_string(opt.delay_ns));
    data.restore_stale_rows();
    AttentionOproj op(data.shape, N, c.attn.lens, data.table, opt);
    for (int launch = 0; launch < launches; ++launch) {
      data.new_token(rng);
      tw::test::HostBf16 r;
      if (c.residual) {
        r = tw::test::random_bf16(size_t(B * N), rng);
        d_r.upload(r.bits);
      }
      const std::vector<double> ref = oproj_ref(data.ref, w.val, c.residual ? &r.val : nullptr, B, K, N);
      d_y.poison();
      const tw::DecodeAttentionTensors a = data.tensors(nullptr);
      op.run({a.q, a.k_new, a.v_new, a.k_cache, a.v_cache, d_w.ptr, c.residual ? d_r.ptr : nullptr, d_y.ptr}, nullptr);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(op.plan().error(), 0u) << "a dependency wait timed out, launch " << launch;
      const double err = tw::test::rel_error(d_y.download(), ref);
      EXPECT_LT(err, kTol) << "launch " << launch << ": " << op.graph().graph.num_tiles() << " tiles, grid "
                           << op.grid();
      // O itself (the attention output, bf16) against the attention reference.
      std::vector<bf16> o(size_t(B * K));
      TW_CUDA_CHECK(cudaMemcpy(o.data(), op.attention_output(), o.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
      EXPECT_LT(tw::test::rel_error(o, data.ref), kTol) << "attention output, launch " << launch;
    }
  }
}

AttentionOprojOptions split(int s, int blocks = 0) {
  AttentionOprojOptions o;
  o.split_k = s;
  o.blocks_per_sm = blocks;
  return o;
}
AttentionOprojOptions stress() {
  AttentionOprojOptions o;
  o.spin_limit = 20'000'000;
  o.delay_ns = 20'000;
  return o;
}
AttentionOprojOptions order(const char* spec) {
  AttentionOprojOptions o;
  o.order = spec;
  return o;
}

const std::vector<int> kLens = {17, 255, 4096};

TEST(AttentionOproj, ContiguousGqa4D128Llama) {
  TW_REQUIRE_GPU();
  // Llama-3-8B heads and hidden size; every split from one slice to one per K step.
  run_case({{kLens, 32, 8, 128, KvLayout::Contiguous}, 4096, true},
           {{}, split(1), split(8), split(16, 1), order("dataflow/col_major"), stress()});
}

TEST(AttentionOproj, PagedGqa8D64Page16OddHidden) {
  TW_REQUIRE_GPU();
  run_case({{kLens, 16, 2, 64, KvLayout::Paged, 16}, 1000, false}, {{}, split(3), stress()});
}

TEST(AttentionOproj, ContiguousGqa1D128) {
  TW_REQUIRE_GPU();
  run_case({{kLens, 8, 8, 128, KvLayout::Contiguous}, 520, true}, {{}, split(1, 1), stress()});
}

TEST(AttentionOproj, PagedGqa4D128Page32Batch20) {
  TW_REQUIRE_GPU();
  // B > 16: 64-row o_proj tiles; random lengths, one of them the 4096 maximum.
  std::mt19937 rng(tw::test::fresh_seed());
  std::vector<int> lens(20);
  for (auto& l : lens) l = 1 + int(rng() % 600);
  lens[7] = 4096;
  run_case({{lens, 32, 8, 128, KvLayout::Paged, 32}, 4096, true}, {{}, split(2), stress()});
}

TEST(AttentionOproj, NoAppendNoRopeGqa2D64) {
  TW_REQUIRE_GPU();
  AttnCase a{{5, 300, 1000}, 8, 4, 64, KvLayout::Contiguous};
  a.append = false;
  a.theta = 0.f;
  run_case({a, 256, false}, {{}});
}

// The residual may be the output buffer: y += O . Wo^T in place.
TEST(AttentionOproj, ResidualInPlace) {
  TW_REQUIRE_GPU();
  std::mt19937_64 rng(tw::test::fresh_seed());
  tw::test::AttnData data({kLens, 32, 8, 128, KvLayout::Contiguous}, rng);
  const int64_t B = data.B, K = 32 * 128, N = 4096;
  auto w = tw::test::random_bf16(size_t(N * K), rng, 1.f / std::sqrt(float(K)));
  DeviceBuffer<bf16> d_w(w.bits.size()), d_y(size_t(B * N));
  d_w.upload(w.bits);
  AttentionOprojOptions opt;
  opt.residual = true;
  opt.spin_limit = kSpinLimit;
  AttentionOproj op(data.shape, N, kLens, {}, opt);
  for (int launch = 0; launch < 2; ++launch) {
    const auto r = tw::test::random_bf16(size_t(B * N), rng);
    d_y.upload(r.bits);
    op.run({data.d_q->ptr, data.d_kn->ptr, data.d_vn->ptr, data.d_k->ptr, data.d_v->ptr, d_w.ptr, d_y.ptr, d_y.ptr},
           nullptr);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(tw::test::rel_error(d_y.download(), oproj_ref(data.ref, w.val, &r.val, B, K, N)), kTol);
  }
}

TEST(AttentionOproj, BadInputThrowsBeforeLaunch) {
  TW_REQUIRE_GPU();
  tw::DecodeAttentionShape s;
  s.batch = 2;
  s.max_seq_len = 100;
  const std::vector<int> lens = {5, 9};
  auto make = [&](tw::DecodeAttentionShape sh, int64_t hidden, AttentionOprojOptions o = {}) {
    AttentionOproj op(sh, hidden, lens, {}, o);
  };
  EXPECT_NO_THROW(make(s, 64));
  EXPECT_THROW(make(s, 0), tw::InvalidArgument);  // hidden
  tw::DecodeAttentionShape g3 = s;
  g3.num_q_heads = 24;  // group 3: not instantiated
  EXPECT_THROW(make(g3, 64), tw::InvalidArgument);
  tw::DecodeAttentionShape bulk = s;
  bulk.kv_load = tw::KvLoad::Bulk;
  EXPECT_THROW(make(bulk, 64), tw::InvalidArgument);
  EXPECT_THROW(make(s, 64, split(0, 3)), tw::InvalidArgument);   // blocks per SM
  EXPECT_THROW(make(s, 64, split(17)), tw::InvalidArgument);     // K = 4096 has 16 steps of 256
  EXPECT_THROW(make(s, 64, order("no_such_order")), tw::InvalidArgument);
  EXPECT_THROW(AttentionOproj(s, 64, {5, 101}), tw::InvalidArgument);  // past max_seq_len

  // Null or misaligned pointers, and a residual the op was not built for, are refused at run().
  AttentionOproj op(s, 64, lens);
  DeviceBuffer<bf16> q(2 * 32 * 128), kv(2 * 8 * 100 * 128), nw(2 * 8 * 128), w(64 * 32 * 128), y(2 * 64);
  const tw::AttentionOprojTensors ok{q.ptr, nw.ptr, nw.ptr, kv.ptr, kv.ptr, w.ptr, nullptr, y.ptr};
  auto with = [&](auto change) {
    tw::AttentionOprojTensors t = ok;
    change(t);
    return t;
  };
  EXPECT_THROW(op.run(with([](auto& t) { t.w_o = nullptr; }), nullptr), tw::InvalidArgument);
  EXPECT_THROW(op.run(with([](auto& t) { t.y = nullptr; }), nullptr), tw::InvalidArgument);
  EXPECT_THROW(op.run(with([&](auto& t) { t.w_o = w.ptr + 1; }), nullptr), tw::InvalidArgument);
  EXPECT_THROW(op.run(with([](auto& t) { t.q = nullptr; }), nullptr), tw::InvalidArgument);
  EXPECT_THROW(op.run(with([&](auto& t) { t.residual = y.ptr; }), nullptr), tw::InvalidArgument);
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
