// Prefill attention (ops/prefill_attention.hpp) against a naive fp32 CUDA reference written apart
// from the kernel: fresh random inputs, outputs and lse poisoned before every run, single and packed
// sequences on both sides of the 128-row tiles, both masks (causal bottom-right aligned, rows that
// see no key), GQA, head dims 64 and 128, keys of their own, a sharper softmax, no lse, a CUDA
// graph, and bad input rejected before any launch. The kernel is sm_90a only: other GPUs skip.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "tileweave/ops/prefill_attention.hpp"

namespace {

using namespace tw;
using tw::test::DeviceBuffer;
using bf16 = __nv_bfloat16;


__device__ inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform noise of standard deviation `scale`, a hash of (seed, index): the packed cases need ~10^7
// values, too slow through the host's normal distribution, and the seed still reproduces them.
__global__ void fill_random(bf16* x, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(mix64(seed + i * 0x9E3779B97F4A7C15ull) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    x[i] = __float2bfloat16((2.f * u - 1.f) * 1.7320508f * scale);
  }
}

// Gaussian noise (Box-Muller on two hashes) of standard deviation `scale`, with channels 3, 40, 77
// and 101 of every head (index % d) `outlier` times larger: activations with a few large channels,
// the FP8 path's hard case.
__global__ void fill_outliers(bf16* x, size_t n, uint64_t seed, float scale, int d, float outlier) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed + i * 0x9E3779B97F4A7C15ull);
    const float u1 = (float(h >> 40) + 1.f) * (1.0f / 16777217.0f), u2 = float((h >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    const float g = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    const int c = int(i % d);
    const bool big = c == 3 || c == 40 || c == 77 || c == 101;
    x[i] = __float2bfloat16(g * scale * (big ? outlier : 1.f));
  }
}

// The last key query row i of a sequence sees (-1: none), from the op's definition of the mask.
__host__ __device__ inline int last_visible_key(bool causal, int i, int len_q, int len_k) {
  const int diag = i + (len_k - len_q);
  return causal && diag < len_k - 1 ? diag : len_k - 1;
}

// One warp per (query row, query head): an fp32 online softmax over every key the row sees, each
// lane holding D / 32 elements of q, of the key and value rows and of the output.
template <int kD>
__global__ void ref_prefill(const bf16* q, const bf16* k, const bf16* v, const int* cu_q, const int* cu_k, int total_q,
                            int hq, int hkv, bool causal, float scale, float* out, float* lse) {
  constexpr int kPer = kD / 32;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= int64_t(total_q) * hq) return;
  const int row = int(warp / hq), h = int(warp % hq), kvh = h / (hq / hkv);
  int b = 0;
  while (cu_q[b + 1] <= row) ++b;  // skips empty sequences too
  const int len_q = cu_q[b + 1] - cu_q[b], len_k = cu_k[b + 1] - cu_k[b];
  const int last = last_visible_key(causal, row - cu_q[b], len_q, len_k);

  float qr[kPer], acc[kPer];
  for (int e = 0; e < kPer; ++e) {
    qr[e] = __bfloat162float(q[(int64_t(row) * hq + h) * kD + lane * kPer + e]);
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int j = 0; j <= last; ++j) {
    const int64_t kv = (int64_t(cu_k[b] + j) * hkv + kvh) * kD + lane * kPer;
    float s = 0.f;
    for (int e = 0; e < kPer; ++e) s += qr[e] * __bfloat162float(k[kv + e]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= scale;
    const float m_new = fmaxf(m, s), corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
    for (int e = 0; e < kPer; ++e) acc[e] = acc[e] * corr + p * __bfloat162float(v[kv + e]);
    m = m_new;
  }
  for (int e = 0; e < kPer; ++e) out[(int64_t(row) * hq + h) * kD + lane * kPer + e] = last >= 0 ? acc[e] / l : 0.f;
  if (lane == 0) lse[int64_t(h) * total_q + row] = last >= 0 ? m + logf(l) : -INFINITY;
}

struct Case {
  std::string name;
  std::vector<int> lens_q, lens_k;  // lens_k empty: the op gets no cu_seqlens_k (keys = queries)
  int d = 128, hq = 3, hkv = 3;
  bool causal = false;
  bool lse = true;
  float q_scale = 1.f;  // > 1 sharpens the softmax
  float scale = 0.f;    // the shape's softmax scale (0: 1/sqrt(D))
  bool fp8 = false;     // the op's e4m3 path
  float outlier = 0.f;  // > 0: Gaussian inputs with four channels this many times larger (fill_outliers)
  std::string mainloop = "auto";  // the shape's kernel ("sm80": the mma.sync one, on any sm_80+ GPU)
  bool split_tail = true;         // the shape's split_tail (the sm90 bf16 kernel's key-range tail)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }  // gtest would print the bytes

std::vector<int> offsets(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// A case's random inputs on the device and the reference outputs, downloaded.
struct PrefillData {
  Case c;
  std::vector<int> cu_q, cu_k;  // cu_k equals cu_q when the case has no keys of its own
  int total_q, total_k;
  PrefillAttentionShape shape;
  DeviceBuffer<bf16> q, k, v;
  std::vector<float> out_ref, lse_ref;  // [total_q, Hq, D], [Hq, total_q]

  PrefillData(const Case& cs, std::mt19937_64& rng)
      : c(cs),
        cu_q(offsets(cs.lens_q)),
        cu_k(cs.lens_k.empty() ? cu_q : offsets(cs.lens_k)),
        total_q(cu_q.back()),
        total_k(cu_k.back()),
        q(size_t(total_q) * cs.hq * cs.d),
        k(size_t(total_k) * cs.hkv * cs.d),
        v(size_t(total_k) * cs.hkv * cs.d) {
    shape.num_q_heads = c.hq;
    shape.num_kv_heads = c.hkv;
    shape.head_dim = c.d;
    shape.causal = c.causal;
    shape.scale = c.scale;
    shape.fp8 = c.fp8;
    shape.mainloop = c.mainloop;
    shape.split_tail = c.split_tail;
    if (c.outlier > 0.f) {
      fill_outliers<<<1024, 256>>>(q.ptr, q.n, rng(), c.q_scale, c.d, c.outlier);
      fill_outliers<<<1024, 256>>>(k.ptr, k.n, rng(), 1.f, c.d, c.outlier);
      fill_outliers<<<1024, 256>>>(v.ptr, v.n, rng(), 1.f, c.d, c.outlier);
    } else {
      fill_random<<<1024, 256>>>(q.ptr, q.n, rng(), c.q_scale);
      fill_random<<<1024, 256>>>(k.ptr, k.n, rng(), 1.f);
      fill_random<<<1024, 256>>>(v.ptr, v.n, rng(), 1.f);
    }
    TW_CUDA_CHECK_LAUNCH();

    DeviceBuffer<int> d_cu_q(cu_q.size()), d_cu_k(cu_k.size());
    d_cu_q.upload(cu_q);
    d_cu_k.upload(cu_k);
    DeviceBuffer<float> o(size_t(total_q) * c.hq * c.d), l(size_t(c.hq) * total_q);
    o.poison();  // the reference must write every element too
    l.poison();
    const float scale = c.scale > 0.f ? c.scale : float(1.0 / std::sqrt(double(c.d)));
    const int64_t threads = int64_t(total_q) * c.hq * 32;
    const unsigned blocks = unsigned((threads + 255) / 256);
    if (c.d == 256)
      ref_prefill<256><<<blocks, 256>>>(q.ptr, k.ptr, v.ptr, d_cu_q.ptr, d_cu_k.ptr, total_q, c.hq, c.hkv, c.causal,
                                        scale, o.ptr, l.ptr);
    else if (c.d == 128)
      ref_prefill<128><<<blocks, 256>>>(q.ptr, k.ptr, v.ptr, d_cu_q.ptr, d_cu_k.ptr, total_q, c.hq, c.hkv, c.causal,
                                        scale, o.ptr, l.ptr);
    else
      ref_prefill<64><<<blocks, 256>>>(q.ptr, k.ptr, v.ptr, d_cu_q.ptr, d_cu_k.ptr, total_q, c.hq, c.hkv, c.causal,
                                       scale, o.ptr, l.ptr);
    TW_CUDA_CHECK_LAUNCH();
    out_ref = o.download();
    lse_ref = l.download();
  }

  std::vector<int> op_cu_k() const { return c.lens_k.empty() ? std::vector<int>{} : cu_k; }

  PrefillAttentionTensors tensors(bf16* out, float* lse) const { return {q.ptr, k.ptr, v.ptr, out, lse}; }

  // out: every element finite and within 2e-2 of max|ref| (+1e-3); rows that see no key exactly
  // 0. lse (when given): within 2e-3 of the reference, -inf exactly on the rows that see no key.
  // fp8 (e4m3 Q, K, P and V: 3 mantissa bits, ~2.5% rounding per element): within 0.2 of max|ref|,
  // lse within 5% of |lse| + 0.4 (the largest scores' rounding, relative to their size) and a cosine
  // similarity to the reference >= 0.997 (measured 0.9975-0.9992 over seeds on these cases; a wrong
  // key order or scale gives far less). On noise inputs the output is
  // an average of thousands of values that cancel, and e4m3 alone leaves ~0.9987 (simulated: QK^T
  // in e4m3 alone 0.9993); a bug shows as far less.
  void check(const std::vector<bf16>& out, const std::vector<float>* lse) const {
    const int H = c.hq, D = c.d;
    const double out_tol = c.fp8 ? 0.2 : 2e-2;
    auto lse_tol = [&](float want) { return c.fp8 ? 0.05f * std::fabs(want) + 0.4f : 2e-3f; };
    int64_t ref_bad = 0, nonfinite = 0, empty_rows = 0, bad_empty = 0, bad_lse = 0;
    double max_ref = 0, max_err = 0, round_err = 0, lse_err = 0, dot = 0, norm_o = 0, norm_r = 0;
    for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
      const int len_q = cu_q[b + 1] - cu_q[b], len_k = cu_k[b + 1] - cu_k[b];
      for (int i = 0; i < len_q; ++i) {
        const int row = cu_q[b] + i;
        const bool sees = last_visible_key(c.causal, i, len_q, len_k) >= 0;
        empty_rows += !sees;
        for (int h = 0; h < H; ++h) {
          for (int e = 0; e < D; ++e) {
            const size_t idx = (size_t(row) * H + h) * D + e;
            const double o = __bfloat162float(out[idx]), r = out_ref[idx];
            if (!std::isfinite(r) || (!sees && r != 0)) ++ref_bad;
            if (!std::isfinite(o)) {
              ++nonfinite;
              continue;
            }
            if (!sees && o != 0) ++bad_empty;
            max_ref = std::max(max_ref, std::fabs(r));
            max_err = std::max(max_err, std::fabs(o - r));
            dot += o * r;
            norm_o += o * o;
            norm_r += r * r;
            round_err = std::max(round_err, std::fabs(double(__bfloat162float(__float2bfloat16(float(r)))) - r));
          }
          const size_t li = size_t(h) * total_q + row;
          const float want = lse_ref[li];
          if (sees != std::isfinite(want)) ++ref_bad;
          if (!lse) continue;
          const float got = (*lse)[li];
          if (!sees) {
            bad_lse += !(got == -INFINITY);
          } else if (!std::isfinite(got) || !(std::fabs(got - want) <= lse_tol(want))) {
            ++bad_lse;
          }
          if (sees && std::isfinite(got)) lse_err = std::max(lse_err, double(std::fabs(got - want)));
        }
      }
    }
    ASSERT_EQ(ref_bad, 0) << "the reference itself is wrong";
    const double tol = out_tol * max_ref + 1e-3, rel = max_err / std::max(max_ref, 1e-30);
    const double cosine = norm_o > 0 && norm_r > 0 ? dot / std::sqrt(norm_o * norm_r) : 1.0;
    std::printf("[   info   ] %s: max|ref| %.3g, max|out - ref| %.3g = %.2e of max|ref| (bf16 rounding of ref: %.2e), "
                "cosine %.6f, max lse err %.2e%s, %lld rows see no key\n",
                c.name.c_str(), max_ref, max_err, rel, round_err / std::max(max_ref, 1e-30), cosine, lse_err,
                lse ? "" : " (no lse)", (long long)empty_rows);
    if (c.fp8) EXPECT_GE(cosine, 0.997) << "fp8 output's cosine similarity to the fp32 reference";
    EXPECT_EQ(nonfinite, 0) << "non-finite outputs: elements left poisoned or overflowed";
    EXPECT_LE(max_err, tol) << "max|ref| " << max_ref;
    EXPECT_EQ(bad_empty, 0) << "rows that see no key must output 0";
    EXPECT_EQ(bad_lse, 0) << "lse off by more than its tolerance (max " << lse_err << "), or -inf on the wrong rows";
  }
};

// One launch of `op` on the case's inputs into poisoned outputs (lse when the case asks), then check().
void run_and_check(const PrefillData& data, const PrefillAttention& op) {
  const Case& c = data.c;
  DeviceBuffer<bf16> out(size_t(data.total_q) * c.hq * c.d);
  DeviceBuffer<float> lse(size_t(c.hq) * data.total_q);
  out.poison();
  lse.poison();
  op.run(data.tensors(out.ptr, c.lse ? lse.ptr : nullptr), nullptr);
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> l = c.lse ? lse.download() : std::vector<float>{};
  data.check(out.download(), c.lse ? &l : nullptr);
}

class PrefillAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(PrefillAttentionTest, MatchesReference) {
  const Case& c = GetParam();
  if (c.mainloop == "sm80") {
    TW_REQUIRE_GPU();
  } else {
    TW_REQUIRE_SM90A("prefill attention");
  }
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (TW_TEST_SEED reruns it)");
  std::mt19937_64 rng(seed);
  const PrefillData data(c, rng);
  const PrefillAttention op(data.shape, data.cu_q, data.op_cu_k());
  EXPECT_EQ(op.total_k(), data.total_k);
  run_and_check(data, op);
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  for (bool causal : {false, true}) {
    const std::string m = causal ? "Causal" : "Full";
    for (int len : {1, 127, 128, 129, 1000, 4097})
      cs.push_back({"D128" + m + "L" + std::to_string(len), {len}, {}, 128, 3, 3, causal});
    for (int len : {1, 200, 3001})  // no lse at L 200
      cs.push_back({"D64Gqa7" + m + "L" + std::to_string(len), {len}, {}, 64, 7, 1, causal, len != 200});
    cs.push_back({"Packed" + m, {1, 200, 777, 1500, 9000, 5}, {}, 128, 8, 2, causal});
    // Sequence 1 has more queries than keys: under the causal mask its rows 0 .. 170 see none.
    for (int d : {64, 128})
      cs.push_back({"OwnKeysD" + std::to_string(d) + m, {64, 300, 1}, {500, 129, 1000}, d, 6, 2, causal, d == 64});
    // A sequence without keys, one without queries.
    cs.push_back({"EmptySequences" + m, {130, 0, 3}, {0, 40, 200}, 128, 4, 2, causal});
    cs.push_back({"SharpQx4" + m, {1000, 129}, {}, 128, 4, 2, causal, true, 4.f});
    // Head dim 256 (the sm90 kernel only): 64-key tiles, O in 128 registers a thread.
    for (int len : {1, 129, 1000})
      cs.push_back({"D256Gqa4" + m + "L" + std::to_string(len), {len}, {}, 256, 8, 2, causal, len != 129});
    cs.push_back({"D256Packed" + m, {1, 200, 777, 3000, 5}, {}, 256, 4, 4, causal});
    cs.push_back({"D256OwnKeys" + m, {64, 300, 1}, {500, 129, 1000}, 256, 6, 2, causal});
  }
  cs.push_back({"D64Scale02Causal", {333, 64}, {400, 64}, 64, 2, 1, true, true, 1.f, 0.2f});
  // The sm80 kernel (mma.sync, 64-row tiles of 64 keys) on every bf16 case: the same tolerances.
  for (size_t i = 0, n = cs.size(); i < n; ++i) {
    if (cs[i].d == 256) continue;  // the sm80 kernel takes 64 and 128 (BadInputThrowsBeforeLaunch)
    Case k = cs[i];
    k.name = "Sm80" + k.name;
    k.mainloop = "sm80";
    cs.push_back(k);
  }
  // FP8: the same kinds of shapes, Gaussian inputs with outlier channels (x4) unless noted.
  for (bool causal : {false, true}) {
    const std::string m = causal ? "Causal" : "Full";
    auto fp8 = [&](std::string name, std::vector<int> lq, std::vector<int> lk, int hq, int hkv, float outlier,
                   bool lse = true) {
      Case k{"Fp8" + name + m, std::move(lq), std::move(lk), 128, hq, hkv, causal, lse};
      k.fp8 = true;
      k.outlier = outlier;
      cs.push_back(k);
    };
    for (int len : {1, 127, 129, 4097}) fp8("L" + std::to_string(len), {len}, {}, 3, 3, 4.f, len != 127);
    fp8("Packed", {1, 200, 777, 1500, 9000, 5}, {}, 8, 2, 4.f);
    fp8("OwnKeys", {64, 300, 1}, {500, 129, 1000}, 6, 2, 4.f);
    fp8("EmptySequences", {130, 0, 3}, {0, 40, 200}, 4, 2, 4.f);
    fp8("UniformL3001", {3001}, {}, 4, 4, 0.f);
  }
  return cs;
}
INSTANTIATE_TEST_SUITE_P(Shapes, PrefillAttentionTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// run() captured in a CUDA graph, before any plain launch (so the first launch's setup happens
// under capture when this test runs alone), then on the stream: both right, and bit for bit equal.
// (fp8: the quantization's launches are captured too.)
void check_graph_matches_stream(const Case& c) {
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (TW_TEST_SEED reruns it)");
  std::mt19937_64 rng(seed);
  const PrefillData data(c, rng);
  const PrefillAttention op(data.shape, data.cu_q);
  const size_t n_out = size_t(data.total_q) * c.hq * c.d, n_lse = size_t(c.hq) * data.total_q;
  DeviceBuffer<bf16> out_g(n_out), out_s(n_out);
  DeviceBuffer<float> lse_g(n_lse), lse_s(n_lse);
  out_g.poison();
  out_s.poison();
  lse_g.poison();
  lse_s.poison();
  TW_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets ran on the legacy stream, `st` does not wait for it
  cudaStream_t st;
  TW_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  tw::test::run_in_graph(st, [&](cudaStream_t s) { op.run(data.tensors(out_g.ptr, lse_g.ptr), s); });
  op.run(data.tensors(out_s.ptr, lse_s.ptr), st);
  TW_CUDA_CHECK(cudaStreamSynchronize(st));
  TW_CUDA_CHECK(cudaStreamDestroy(st));
  const auto og = out_g.download(), os = out_s.download();
  const auto lg = lse_g.download(), ls = lse_s.download();
  {
    SCOPED_TRACE("graph");
    data.check(og, &lg);
  }
  EXPECT_EQ(std::memcmp(og.data(), os.data(), n_out * sizeof(bf16)), 0) << "graph and stream outputs differ";
  EXPECT_EQ(std::memcmp(lg.data(), ls.data(), n_lse * sizeof(float)), 0) << "graph and stream lse differ";
}

// The tail split over key ranges (plan_prefill_work) and the same cases with every item whole: both
// match the reference, the planner took a tail with split items where it should, and a second
// launch (the split counters zeroed by the first) gives the same bits.
TEST(PrefillAttention, TailSplitsMatchReference) {
  TW_REQUIRE_SM90A("prefill attention");
  int dev = 0, sms = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (TW_TEST_SEED reruns it)");
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = {
      {"FewItemsD128", {1024}, {}, 128, 8, 8, false},             // 64 items: every one split
      {"LastRoundD128", {4608}, {}, 128, 24, 24, false},          // 864 items: the last 72 split
      {"ThreeWarpgroupsD64Gqa", {4429}, {}, 64, 24, 4, false},    // 192-row items
      {"CausalPackedGqa7", {1, 200, 777, 1500, 3000, 5}, {}, 128, 14, 2, true},
      {"OwnKeysD64Causal", {64, 300, 1}, {500, 129, 1000}, 64, 6, 2, true, false},  // rows that see no key, no lse
      {"D256Gqa2", {2500}, {}, 256, 16, 8, false},
  };
  for (const Case& base : cases) {
    SCOPED_TRACE(base.name);
    const PrefillData data(base, rng);
    const size_t n_out = size_t(data.total_q) * base.hq * base.d, n_lse = size_t(base.hq) * data.total_q;
    for (bool split : {true, false}) {
      PrefillAttentionShape shape = data.shape;
      shape.split_tail = split;
      const PrefillAttention op(shape, data.cu_q, data.op_cu_k());
      const PrefillWork& w = op.work();
      std::printf("[   info   ] %s split_tail=%d: %lld items, %lld whole, %d units, %d split items, simulated end %.1f "
                  "(whole %.1f)\n", base.name.c_str(), int(split), (long long)w.items, (long long)w.whole, w.units(),
                  w.groups, w.makespan, w.makespan_whole);
      if (!split) EXPECT_EQ(w.units(), 0);
      // The first three on a GPU of >= 100 SMs: partial last rounds of equal items (plan_prefill_work's case).
      if (split && sms >= 100 && &base - cases.data() < 3) EXPECT_GT(w.groups, 0) << "no split items planned";
      DeviceBuffer<bf16> out(n_out), again(n_out);
      DeviceBuffer<float> lse(n_lse), lse2(n_lse);
      out.poison(), again.poison(), lse.poison(), lse2.poison();
      op.run(data.tensors(out.ptr, base.lse ? lse.ptr : nullptr), nullptr);
      op.run(data.tensors(again.ptr, base.lse ? lse2.ptr : nullptr), nullptr);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      const auto o1 = out.download(), o2 = again.download();
      const std::vector<float> l1 = base.lse ? lse.download() : std::vector<float>{};
      data.check(o1, base.lse ? &l1 : nullptr);
      EXPECT_EQ(std::memcmp(o1.data(), o2.data(), n_out * sizeof(bf16)), 0) << "a second launch differs";
    }
  }
}

// Shapes drawn from a seed, none of them named elsewhere: 1..32 query heads, groups 1..8 (odd ones
// too), head dim 64 / 128 / 256, both masks, 1..4 packed sequences of log-uniform lengths 1..6000,
// keys of their own now and then; the reference's work capped. Whatever tail the planner takes for
// the shape runs (the small ones mostly split). TW_SHAPE_SEED picks the grid: the default is the
// same every run, any other one a grid no test names.
TEST(PrefillAttention, RandomShapeGrid) {
  TW_REQUIRE_SM90A("prefill attention");
  const uint64_t shape_seed = tw::test::shape_seed();
  SCOPED_TRACE("TW_SHAPE_SEED=" + std::to_string(shape_seed));
  std::mt19937_64 shapes(shape_seed ^ 0x9F3D);
  const uint64_t seed = tw::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (TW_TEST_SEED reruns it)");
  std::mt19937_64 rng(seed);
  static const int kDims[] = {64, 128, 256};
  auto length = [&](int cap) {
    return std::max(1, int(std::exp2(std::uniform_real_distribution<double>(0.0, std::log2(double(cap)))(shapes))));
  };
  for (int i = 0; i < 12; ++i) {
    Case c;
    c.d = kDims[shapes() % std::size(kDims)];
    const int group = 1 + int(shapes() % 8);
    c.hkv = 1 + int(shapes() % 4);
    c.hq = group * c.hkv;
    c.causal = shapes() % 2 == 1;
    c.lse = shapes() % 4 != 0;
    const int batch = 1 + int(shapes() % 4);
    const bool own_keys = shapes() % 3 == 0;
    double work = 0;
    for (int b = 0; b < batch; ++b) {
      c.lens_q.push_back(length(6000));
      if (own_keys) c.lens_k.push_back(length(6000));
      work += double(c.lens_q.back()) * (own_keys ? c.lens_k.back() : c.lens_q.back());
    }
    // The reference: one warp per (row, head) over its keys; keep it to a few seconds.
    while (work * c.hq * c.d > 2e11 && c.lens_q[0] > 1) {
      c.lens_q[0] /= 2;
      if (own_keys) c.lens_k[0] = std::max(1, c.lens_k[0] / 2);
      work = 0;
      for (int b = 0; b < batch; ++b) work += double(c.lens_q[b]) * (own_keys ? c.lens_k[b] : c.lens_q[b]);
    }
    c.name = "shape " + std::to_string(i);
    std::string lens;
    for (int b = 0; b < batch; ++b)
      lens += (b ? "," : "") + std::to_string(c.lens_q[b]) + (own_keys ? "/" + std::to_string(c.lens_k[b]) : "");
    SCOPED_TRACE(c.name + ": " + std::to_string(c.hq) + "/" + std::to_string(c.hkv) + " heads, d " + std::to_string(c.d) +
                 (c.causal ? ", causal" : "") + ", lengths " + lens + (c.lse ? "" : ", no lse"));
    const PrefillData data(c, rng);
    const PrefillAttention op(data.shape, data.cu_q, data.op_cu_k());
    std::printf("[   info   ] %s: %d/%d heads d %d%s, lengths %s: %lld items, %d tail units, %d split\n", c.name.c_str(),
                c.hq, c.hkv, c.d, c.causal ? " causal" : "", lens.c_str(), (long long)op.work().items, op.work().units(),
                op.work().groups);
    run_and_check(data, op);
  }
}

TEST(PrefillAttention, CudaGraphMatchesStream) {
  TW_REQUIRE_SM90A("prefill attention");
  check_graph_matches_stream({"Graph", {1, 200, 777, 130}, {}, 64, 8, 2, true});
}

TEST(PrefillAttention, Fp8CudaGraphMatchesStream) {
  TW_REQUIRE_SM90A("prefill attention");
  Case c{"Fp8Graph", {1, 200, 777, 130}, {}, 128, 8, 2, true};
  c.fp8 = true;
  c.outlier = 4.f;
  check_graph_matches_stream(c);
}

TEST(PrefillAttention, BadInputThrowsBeforeLaunch) {
  // The constructor validates before it touches the GPU, so this part runs on any machine.
  PrefillAttentionShape s;
  s.head_dim = 96;
  EXPECT_THROW(PrefillAttention(s, {0, 128}), InvalidArgument);
  s.head_dim = 128;
  EXPECT_THROW(PrefillAttention(s, {0, 128, 64}), InvalidArgument);       // decreasing offsets
  EXPECT_THROW(PrefillAttention(s, {0, 128}, {0, 5, 9}), InvalidArgument);  // key offsets of another batch
  {
    PrefillAttentionShape f = s;
    f.fp8 = true;
    f.head_dim = 64;
    EXPECT_THROW(PrefillAttention(f, {0, 128}), InvalidArgument);  // fp8 takes head_dim 128 only
    f.head_dim = 128;
    f.mainloop = "sm80";
    EXPECT_THROW(PrefillAttention(f, {0, 128}), InvalidArgument);  // fp8 is the sm90 kernel's
    PrefillAttentionShape m = s;
    m.mainloop = "sm100";
    EXPECT_THROW(PrefillAttention(m, {0, 128}), InvalidArgument);
    m.mainloop = "sm80";
    m.head_dim = 256;
    EXPECT_THROW(PrefillAttention(m, {0, 128}), InvalidArgument);  // 256 is the sm90 kernel's
  }

  TW_REQUIRE_SM90A("prefill attention");
  const PrefillAttention op(s, {0, 128});
  const size_t n = size_t(128) * s.num_q_heads * s.head_dim;
  DeviceBuffer<bf16> q(n), k(n), v(n), out(n);
  DeviceBuffer<float> lse(size_t(128) * s.num_q_heads);
  out.poison();
  const PrefillAttentionTensors ok{q.ptr, k.ptr, v.ptr, out.ptr, lse.ptr};
  auto with = [&](auto edit) {
    PrefillAttentionTensors t = ok;
    edit(t);
    return t;
  };
  EXPECT_THROW(op.run(with([](auto& t) { t.q = nullptr; }), nullptr), InvalidArgument);
  EXPECT_THROW(op.run(with([](auto& t) { t.k = nullptr; }), nullptr), InvalidArgument);
  EXPECT_THROW(op.run(with([](auto& t) { t.v = nullptr; }), nullptr), InvalidArgument);
  EXPECT_THROW(op.run(with([](auto& t) { t.out = nullptr; }), nullptr), InvalidArgument);
  EXPECT_THROW(op.run(with([&](auto& t) { t.k = k.ptr + 1; }), nullptr), InvalidArgument);  // 2 B off
  EXPECT_THROW(op.quantize(ok, nullptr), InvalidArgument);       // a bf16 op has no fp8 half
  EXPECT_THROW(op.run_quantized(ok, nullptr), InvalidArgument);
  EXPECT_THROW(op.run(with([&](auto& t) {
                 t.lse = reinterpret_cast<float*>(reinterpret_cast<char*>(lse.ptr) + 2);
               }),
                      nullptr),
               InvalidArgument);  // lse rows start anywhere (h * total_q floats), but on a float
  // Nothing was launched: the output is still all poison.
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  const auto o = out.download();
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](bf16 x) { return std::isnan(__bfloat162float(x)); }));
}

}  // namespace
