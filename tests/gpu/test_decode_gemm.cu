// DecodeGemm (the executor's sm90 tile body on a one-op graph) vs a double-precision reference:
// fresh random inputs, outputs poisoned, odd shapes, packed and PyTorch-layout weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "gpu_util.cuh"
#include "tileweave/ops/decode_gemm.hpp"

namespace {

using namespace tw;
using namespace tw::test;
using bf16 = __nv_bfloat16;

bool have_sm90() {
  int dev = 0, major = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major == 9;
}
#define TW_REQUIRE_SM90() \
  if (!have_sm90()) GTEST_SKIP() << "DecodeGemm needs an sm_90 GPU"

struct GemmData {
  int64_t m, n, k;
  std::mt19937_64 rng{fresh_seed()};
  DeviceBuffer<bf16> x, w, y;
  std::vector<double> ref;
  GemmData(int64_t m_, int64_t n_, int64_t k_) : m(m_), n(n_), k(k_), x(m_ * k_), w(n_ * k_), y(m_ * n_) {
    w.upload(random_bf16(w.n, rng, 1.0f / std::sqrt(float(k))).bits);
    x.upload(random_bf16(x.n, rng).bits);
    DeviceBuffer<double> out(m * n);
    ref_linear_bf16w<bf16><<<(m * n + 255) / 256, 256>>>(x.ptr, w.ptr, out.ptr, m, n, k);
    TW_CUDA_CHECK_LAUNCH();
    ref = out.download();
  }
  // Packs into a poisoned buffer first when the op takes packed weights (unwritten padding -> NaN).
  double check(const DecodeGemm& g, bool packed) {
    y.poison();
    std::unique_ptr<DeviceBuffer<bf16>> p;
    if (packed) {
      p = std::make_unique<DeviceBuffer<bf16>>(g.packed_size());
      p->poison();
      g.pack(w.ptr, p->ptr, 0);
    }
    g.run(y.ptr, x.ptr, packed ? p->ptr : w.ptr, 0);
    EXPECT_EQ(g.plan().error(), 0u) << "a wait timed out";
    return rel_error(y.download(), ref);
  }
};

// (M, N, K, packed, k_slices; "streamk": the stream-K order instead; "fit": tile_rows fit)
using Case = std::tuple<int, int, int, bool, std::string>;
class DecodeGemmTest : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeGemmTest, MatchesReference) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_SM90();
  const auto [m, n, k, packed, slices] = GetParam();
  GemmData d(m, n, k);
  DecodeGemmOptions opt;
  opt.packed_weights = packed;
  if (slices == "streamk")
    opt.order = slices;
  else if (slices == "fit")
    opt.tile_rows = slices;
  else
    opt.k_slices = slices;
  opt.spin_limit = 2'000'000;
  DecodeGemm g(m, n, k, opt);
  for (int launch = 0; launch < 2; ++launch)  // the second reuses the counters and accumulators
    EXPECT_LT(d.check(g, packed), 1e-2) << "M=" << m << " N=" << n << " K=" << k << " packed=" << packed << " launch " << launch;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  for (bool packed : {false, true}) {
    for (int m : {1, 3, 16, 37, 64, 128, 255, 300}) c.emplace_back(m, 1000, 520, packed, "tail:1");
    c.emplace_back(1, 4096, 14336, packed, "tail:1");  // Llama-3-8B down: split-K with short last slices
    c.emplace_back(16, 4096, 14336, packed, "even");
    c.emplace_back(16, 28672, 4096, packed, "tail:2");  // gate_up-sized
    c.emplace_back(64, 1544, 8, packed, "tail:1");      // K of one 8-column chunk
    // Stream-K: runs of slices summed in registers, one or several tile rows, a K of one stage.
    for (int m : {1, 37, 300}) c.emplace_back(m, 1000, 520, packed, "streamk");
    c.emplace_back(200, 5760, 2048, packed, "streamk");
    c.emplace_back(16, 28672, 4096, packed, "streamk");
    c.emplace_back(64, 1544, 8, packed, "streamk");
    for (int m : {70, 150, 200, 300}) c.emplace_back(m, 1000, 520, packed, "fit");  // 96, 160, 224, 2 x 160 rows
    // Odd N: the epilogue's column pairs (ffn_sm90.cu, store_pair) store their halves apart.
    c.emplace_back(37, 999, 520, packed, "tail:1");
    c.emplace_back(200, 1001, 1032, packed, "fit");
  }
  return c;
}
INSTANTIATE_TEST_SUITE_P(Shapes, DecodeGemmTest, ::testing::ValuesIn(cases()));

// Launches that overlap the one before (overlap_previous), each layer's input the previous layer's
// output (poisoned until written): the first weights stream early, x is read and y, the counters
// and the split-K accumulators (K = 4096 is cut to fill the SMs) are touched only after the wait.
TEST(DecodeGemm, OverlappedLaunchesChainLayers) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_SM90();
  constexpr int kLayers = 4;
  for (int m : {1, 37})
    for (bool packed : {false, true}) {
      const int64_t n = 4096, k = 4096;
      DecodeGemmOptions opt;
      opt.packed_weights = packed;
      opt.overlap_previous = true;
      opt.spin_limit = 2'000'000;
      DecodeGemm g(m, n, k, opt);
      std::mt19937_64 rng(fresh_seed());
      std::vector<std::unique_ptr<DeviceBuffer<bf16>>> w, pw, y;
      DeviceBuffer<bf16> x0(m * k);
      x0.upload(random_bf16(x0.n, rng).bits);
      for (int i = 0; i < kLayers; ++i) {
        w.push_back(std::make_unique<DeviceBuffer<bf16>>(n * k));
        w[i]->upload(random_bf16(w[i]->n, rng, 1.0f / std::sqrt(float(k))).bits);
        y.push_back(std::make_unique<DeviceBuffer<bf16>>(m * n));
        y[i]->poison();
        if (packed) {
          pw.push_back(std::make_unique<DeviceBuffer<bf16>>(g.packed_size()));
          g.pack(w[i]->ptr, pw[i]->ptr, 0);
        }
      }
      TW_CUDA_CHECK(cudaDeviceSynchronize());  // the weights are written before any overlapped launch
      for (int i = 0; i < kLayers; ++i)
        g.run(y[i]->ptr, i ? y[i - 1]->ptr : x0.ptr, packed ? pw[i]->ptr : w[i]->ptr, 0);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(g.plan().error(), 0u) << "a wait timed out";
      for (int i = 0; i < kLayers; ++i) {
        DeviceBuffer<double> ref(m * n);
        ref_linear_bf16w<bf16><<<(m * n + 255) / 256, 256>>>(i ? y[i - 1]->ptr : x0.ptr, w[i]->ptr, ref.ptr, m, n, k);
        TW_CUDA_CHECK_LAUNCH();
        EXPECT_LT(rel_error(y[i]->download(), ref.download()), 1e-2) << "M=" << m << " packed=" << packed << " layer " << i;
      }
    }
}

// The trace option (the tile timeline `tileweave validate --timelines` replays, recorded by
// bench_model_vs_ncu --trace-dir): every tile of the launch gets its SM and times, and the result is
// still right. Each SM runs one CTA, whose consumers take its tiles one after another in ticket
// order: on one SM, a tile starts after the one before is done (both stamped by the same thread).
// Unsplit (M = 1024: 4 x 32 tiles of 256 rows, one wave) and split-K (M = 16: 32 tiles in 4 slices,
// each slice arriving after its partial sum).
TEST(DecodeGemm, TraceRecordsEveryTile) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_SM90();
  int dev = 0, sms = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  for (auto [m, n, k] : {std::tuple<int, int, int>{1024, 4096, 1024}, {16, 4096, 14336}}) {
    GemmData d(m, n, k);
    DecodeGemmOptions opt;
    opt.order = "row_major";
    opt.spin_limit = 2'000'000;
    opt.trace = true;
    DecodeGemm g(m, n, k, opt);
    EXPECT_THROW(DecodeGemm(m, n, k).plan().read_trace(), InvalidArgument);  // no trace option, no timeline
    for (int launch = 0; launch < 2; ++launch) EXPECT_LT(d.check(g, false), 1e-2) << "M=" << m << " launch " << launch;
    const auto times = g.plan().read_trace();
    ASSERT_EQ(int64_t(times.size()), g.graph().num_tiles()) << "M=" << m;
    std::vector<int> position(times.size());  // by tile id: its ticket
    for (size_t i = 0; i < g.schedule().order.size(); ++i) position[size_t(g.schedule().order[i])] = int(i);
    std::map<int, std::vector<runtime::DevicePlan::TileTimes>> by_sm;
    double first = 1e30;
    for (const auto& t : times) {
      SCOPED_TRACE("M=" + std::to_string(m) + " tile " + std::to_string(t.tile));
      EXPECT_GE(t.sm, 0);
      EXPECT_LT(t.sm, sms);
      EXPECT_GE(t.taken, 0);
      EXPECT_GE(t.ready, t.taken);  // both by the producer's lane 0
      EXPECT_GE(t.started, 0);
      EXPECT_GE(t.computed, t.started);
      EXPECT_GE(t.done, t.computed);
      if (g.graph().op(0).tiling.split_k > 1) EXPECT_GE(t.mark1, t.computed);  // arrived after its partial sum
      first = std::min(first, t.taken);
      by_sm[t.sm].push_back(t);
    }
    EXPECT_EQ(first, 0);  // times count from the launch's first ticket
    for (auto& [sm, ts] : by_sm) {
      std::sort(ts.begin(), ts.end(), [](const auto& a, const auto& b) { return a.started < b.started; });
      for (size_t i = 1; i < ts.size(); ++i) {
        EXPECT_GE(ts[i].started, ts[i - 1].done) << "M=" << m << " SM " << sm << ": tiles overlap";
        EXPECT_GT(position[size_t(ts[i].tile)], position[size_t(ts[i - 1].tile)]) << "M=" << m << " SM " << sm;
      }
    }
  }
}

TEST(DecodeGemm, BadInputIsRefusedBeforeLaunch) {
  TW_REQUIRE_GPU();
  TW_REQUIRE_SM90();
  EXPECT_THROW(DecodeGemm(0, 128, 128), InvalidArgument);
  EXPECT_THROW(DecodeGemm(1, 0, 128), InvalidArgument);
  EXPECT_THROW(DecodeGemm(1, 128, 100), InvalidArgument);  // K % 8
  DecodeGemmOptions bad;
  bad.k_slices = "tail:7";
  EXPECT_THROW(DecodeGemm(1, 128, 128, bad), InvalidArgument);
  bad = {};
  bad.order = "zigzag";
  EXPECT_THROW(DecodeGemm(1, 128, 128, bad), InvalidArgument);
  GemmData d(4, 256, 256);
  DecodeGemm g(4, 256, 256);
  EXPECT_THROW(g.run(nullptr, d.x.ptr, d.w.ptr, 0), InvalidArgument);
  EXPECT_THROW(g.run(d.y.ptr, d.x.ptr + 1, d.w.ptr, 0), InvalidArgument);
  EXPECT_THROW(g.pack(d.w.ptr, d.w.ptr, 0), InvalidArgument);  // built without packed_weights
}

}  // namespace
