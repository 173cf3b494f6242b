// The DiT attention chain on the executor (ops/dit_attention_chain.hpp) against a double-precision
// CPU reference written apart from the kernel: fresh random inputs, the output poisoned before every
// run, L on both sides of the 128-row tiles (odd ones among them), both RoPE forms, with and without
// biases, the default order and another topological one, two launches in a row (the counters' epochs),
// and bad input refused before any launch. Each stage is checked on its own: q|k|v after the norm
// and the rotation, the attention's output, y. sm_90a only: other GPUs skip.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "tileweave/ops/dit_attention_chain.hpp"

namespace {

using namespace tw;
using tw::test::DeviceBuffer;
using tw::test::HostBf16;
using bf16 = __nv_bfloat16;

constexpr int kD = 128;
double round_bf16(double v) { return double(__bfloat162float(__float2bfloat16(float(v)))); }

struct ChainCase {
  int64_t tokens;
  int heads;
  bool interleaved = false;
  bool biases = true;
  std::string order;  // empty: the op's default
};

struct Host {
  HostBf16 x, w_qkv, b_qkv, q_norm, k_norm, w_o, b_o;
  std::vector<float> rope;
};

// The reference, stage by stage: q|k|v (bias, then per-head RMSNorm and RoPE on q and k), the
// attention over the bf16-rounded q, k, v (as the kernel reads them), y over the rounded attention.
struct Reference {
  std::vector<double> qkv, attn, y;
};
Reference reference(const ChainCase& c, const Host& h, float eps) {
  const int64_t L = c.tokens, H = c.heads, W = H * kD;
  Reference r;
  r.qkv.assign(size_t(L * 3 * W), 0.0);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t o = 0; o < 3 * W; ++o) {
      double s = c.biases ? h.b_qkv.val[o] : 0.0;
      for (int64_t j = 0; j < W; ++j) s += double(h.x.val[t * W + j]) * h.w_qkv.val[o * W + j];
      r.qkv[t * 3 * W + o] = s;
    }
  for (int64_t t = 0; t < L; ++t)
    for (int which = 0; which < 2; ++which)
      for (int64_t hd = 0; hd < H; ++hd) {
        double* v = &r.qkv[t * 3 * W + which * W + hd * kD];
        const std::vector<float>& g = which == 0 ? h.q_norm.val : h.k_norm.val;
        double ss = 0;
        for (int i = 0; i < kD; ++i) ss += v[i] * v[i];
        const double rs = 1.0 / std::sqrt(ss / kD + eps);
        for (int i = 0; i < kD; ++i) v[i] *= rs * g[i];
        const float* cs = &h.rope[t * kD];
        for (int j = 0; j < kD / 2; ++j) {
          const int a = c.interleaved ? 2 * j : j, b = c.interleaved ? 2 * j + 1 : j + kD / 2;
          const double co = cs[j], si = cs[kD / 2 + j], va = v[a], vb = v[b];
          v[a] = va * co - vb * si;
          v[b] = vb * co + va * si;
        }
      }
  std::vector<double> rq(r.qkv.size());
  for (size_t i = 0; i < rq.size(); ++i) rq[i] = round_bf16(r.qkv[i]);
  r.attn.assign(size_t(L * W), 0.0);
  const double scale = 1.0 / std::sqrt(double(kD));
  std::vector<double> p(static_cast<size_t>(L));
  for (int64_t hd = 0; hd < H; ++hd)
    for (int64_t t = 0; t < L; ++t) {
      const double* q = &rq[t * 3 * W + hd * kD];
      double mx = -INFINITY;
      for (int64_t u = 0; u < L; ++u) {
        const double* k = &rq[u * 3 * W + W + hd * kD];
        double s = 0;
        for (int i = 0; i < kD; ++i) s += q[i] * k[i];
        p[u] = s * scale;
        mx = std::max(mx, p[u]);
      }
      double sum = 0;
      for (int64_t u = 0; u < L; ++u) sum += (p[u] = std::exp(p[u] - mx));
      double* o = &r.attn[t * W + hd * kD];
      for (int64_t u = 0; u < L; ++u) {
        const double* v = &rq[u * 3 * W + 2 * W + hd * kD];
        for (int i = 0; i < kD; ++i) o[i] += p[u] / sum * v[i];
      }
    }
  r.y.assign(size_t(L * W), 0.0);
  for (int64_t t = 0; t < L; ++t)
    for (int64_t o = 0; o < W; ++o) {
      double s = c.biases ? h.b_o.val[o] : 0.0;
      for (int64_t j = 0; j < W; ++j) s += round_bf16(r.attn[t * W + j]) * h.w_o.val[o * W + j];
      r.y[t * W + o] = s;
    }
  return r;
}

std::vector<bf16> download(const bf16* p, size_t n) {
  std::vector<bf16> h(n);
  TW_CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(bf16), cudaMemcpyDeviceToHost));
  return h;
}

void run_case(const ChainCase& c, uint64_t seed) {
  SCOPED_TRACE("L " + std::to_string(c.tokens) + ", heads " + std::to_string(c.heads) +
               (c.interleaved ? ", interleaved RoPE" : ", rotate-half RoPE") + (c.biases ? ", biases" : "") +
               ", order '" + c.order + "', seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t L = c.tokens, W = int64_t(c.heads) * kD;
  Host h;
  h.x = tw::test::random_bf16(size_t(L * W), rng);
  h.w_qkv = tw::test::random_bf16(size_t(3 * W * W), rng, float(1 / std::sqrt(double(W))));
  h.b_qkv = tw::test::random_bf16(size_t(3 * W), rng, 0.1f);
  h.w_o = tw::test::random_bf16(size_t(W * W), rng, float(1 / std::sqrt(double(W))));
  h.b_o = tw::test::random_bf16(size_t(W), rng, 0.1f);
  // Norm weights around 1, some larger: scores of a few units, a softmax neither flat nor one-hot.
  std::uniform_real_distribution<float> gw(0.5f, 2.f);
  for (HostBf16* g : {&h.q_norm, &h.k_norm}) {
    g->bits.resize(kD), g->val.resize(kD);
    for (int i = 0; i < kD; ++i) g->bits[i] = __float2bfloat16(gw(rng)), g->val[i] = __bfloat162float(g->bits[i]);
  }
  // A 2-D image's positions: each token's row and column in a grid, half the frequencies each.
  h.rope.resize(size_t(L * kD));
  const int64_t side = int64_t(std::ceil(std::sqrt(double(L))));
  for (int64_t t = 0; t < L; ++t)
    for (int j = 0; j < kD / 2; ++j) {
      const double pos = j < kD / 4 ? double(t / side) : double(t % side);
      const double ang = pos * std::pow(10000.0, -double(j % (kD / 4)) / (kD / 4));
      h.rope[t * kD + j] = float(std::cos(ang));
      h.rope[t * kD + kD / 2 + j] = float(std::sin(ang));
    }
  DeviceBuffer<bf16> x(h.x.bits.size()), wq(h.w_qkv.bits.size()), bq(h.b_qkv.bits.size()), wo(h.w_o.bits.size()),
      bo(h.b_o.bits.size()), qn(kD), kn(kD), y(size_t(L * W));
  DeviceBuffer<float> rope(h.rope.size());
  x.upload(h.x.bits), wq.upload(h.w_qkv.bits), bq.upload(h.b_qkv.bits), wo.upload(h.w_o.bits), bo.upload(h.b_o.bits);
  qn.upload(h.q_norm.bits), kn.upload(h.k_norm.bits), rope.upload(h.rope);

  DitAttentionShape s;
  s.tokens = L;
  s.heads = c.heads;
  DitChainOptions opt;
  opt.rope_interleaved = c.interleaved;
  opt.order = c.order;
  opt.spin_limit = 1u << 22;  // a missing dependency fails the test instead of hanging the GPU
  DitAttentionChain chain(s, opt);
  DitChainTensors t;
  t.x = x.ptr, t.w_qkv = wq.ptr, t.q_norm = qn.ptr, t.k_norm = kn.ptr, t.rope = rope.ptr, t.w_o = wo.ptr, t.y = y.ptr;
  if (c.biases) t.qkv_bias = bq.ptr, t.o_bias = bo.ptr;
  const Reference ref = reference(c, h, opt.eps);
  for (int launch = 0; launch < 2; ++launch) {  // the second launch runs on the counters the first left
    y.poison();
    chain.run(t, nullptr);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(chain.error(), 0u) << "a bounded wait expired (launch " << launch << ")";
    const double e_qkv = tw::test::rel_error(download(chain.qkv(), size_t(L * 3 * W)), ref.qkv);
    const double e_attn = tw::test::rel_error(download(chain.attention_out(), size_t(L * W)), ref.attn);
    const double e_y = tw::test::rel_error(y.download(), ref.y);
    std::printf("  L=%lld H=%d%s%s launch %d: rel err q|k|v %.2e, attention %.2e, y %.2e\n", (long long)L, c.heads,
                c.interleaved ? " interleaved" : "", c.biases ? " biases" : "", launch, e_qkv, e_attn, e_y);
    // bf16 outputs of fp32 math: ~4e-3 each (one rounding of q|k|v, P and the attention's output)
    EXPECT_LT(e_qkv, 1e-2);
    EXPECT_LT(e_attn, 1.5e-2);
    EXPECT_LT(e_y, 1.5e-2);
  }
}

TEST(DitChain, MatchesReferenceOddLength) {
  TW_REQUIRE_SM90A("the DiT chain");
  run_case({333, 3}, tw::test::fresh_seed());  // 3 row tiles, the last of 77 rows; 3 key tiles, the last of 13
}

TEST(DitChain, MatchesReferenceInterleavedRopeNoBias) {
  TW_REQUIRE_SM90A("the DiT chain");
  ChainCase c{1000, 4, true, false};
  run_case(c, tw::test::fresh_seed());
}

TEST(DitChain, MatchesReferenceShortAndAnotherOrder) {
  TW_REQUIRE_SM90A("the DiT chain");
  run_case({77, 2}, tw::test::fresh_seed());  // fewer tokens than one tile
  ChainCase c{300, 2};
  c.order = "row_major";  // op by op: every topological order runs
  run_case(c, tw::test::fresh_seed());
}

TEST(DitChain, BadInputIsRefused) {
  TW_REQUIRE_SM90A("the DiT chain");
  DitAttentionShape s;
  s.tokens = 256;
  s.heads = 2;
  s.head_dim = 64;
  EXPECT_THROW(DitAttentionChain{s}, InvalidArgument);
  s.head_dim = 128;
  s.causal = true;
  EXPECT_THROW(DitAttentionChain{s}, InvalidArgument);
  s.causal = false;
  s.tokens = 0;
  EXPECT_THROW(DitAttentionChain{s}, InvalidArgument);
  s.tokens = 256;
  DitChainOptions o;
  o.order = "no_such_order";
  EXPECT_THROW((DitAttentionChain{s, o}), InvalidArgument);
  o.order.clear();
  o.order_lag = -2;  // -1 is the default (a wave), 0.. a ticket count
  EXPECT_THROW((DitAttentionChain{s, o}), InvalidArgument);
  DitAttentionChain chain(s);
  DitChainTensors t;  // every pointer null
  EXPECT_THROW(chain.run(t, nullptr), InvalidArgument);
}

}  // namespace
