// Fused FFN on the tile executor vs a double-precision reference computed on the GPU by a naive
// kernel (independent of the code under test). Fresh random inputs every run, outputs poisoned.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <tuple>

#include "gpu_util.cuh"
#include "tileweave/model/ffn_splits.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/model/validation.hpp"
#include "tileweave/ops/ffn.hpp"
#include "tileweave/order/orders.hpp"

namespace {

using namespace tw;
using namespace tw::test;
using bf16 = __nv_bfloat16;

__global__ void ref_silu_mul(const double* gu, double* h, int64_t m, int64_t f) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= m * f) return;
  const int64_t r = i / f, c = i % f;
  const double g = gu[r * 2 * f + c], u = gu[r * 2 * f + f + c];
  h[i] = g / (1.0 + exp(-g)) * u;
}

// The plain chain's activation, in double (relu, or GeLU with PyTorch's tanh approximation).
__global__ void ref_activate(double* h, int64_t n, int act) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const double v = h[i];
  if (act == 1) h[i] = v > 0 ? v : 0.0;
  if (act == 2) h[i] = 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
}

struct FfnData {
  FfnShape s;
  DeviceBuffer<bf16> x, wgu, wd, y;
  std::vector<double> ref;
  std::mt19937_64 rng;
  explicit FfnData(const FfnShape& sh)
      : s(sh), x(sh.m * sh.d), wgu((sh.gated ? 2 : 1) * sh.f * sh.d), wd(sh.d * sh.f), y(sh.m * sh.d), rng(fresh_seed()) {
    // Weights scaled like a trained layer (~1/sqrt(fan_in)) so activations stay O(1).
    wgu.upload(random_bf16(wgu.n, rng, 1.0f / std::sqrt(float(sh.d))).bits);
    wd.upload(random_bf16(wd.n, rng, 1.0f / std::sqrt(float(sh.f))).bits);
    new_input();
  }
  void new_input() {
    x.upload(random_bf16(x.n, rng).bits);
    compute_ref();
  }
  // x := src (e.g. the previous layer's output), and the reference for it.
  void take_input(const DeviceBuffer<bf16>& src) {
    TW_CUDA_CHECK(cudaMemcpy(x.ptr, src.ptr, x.n * sizeof(bf16), cudaMemcpyDeviceToDevice));
    compute_ref();
  }
  void compute_ref() {
    DeviceBuffer<double> gu((s.gated ? 2 : 1) * s.m * s.f), h(s.m * s.f), out(s.m * s.d);
    const int64_t n1 = (s.gated ? 2 : 1) * s.f;
    ref_linear_bf16w<bf16><<<(s.m * n1 + 255) / 256, 256>>>(x.ptr, wgu.ptr, gu.ptr, s.m, n1, s.d);
    if (s.gated) ref_silu_mul<<<(s.m * s.f + 255) / 256, 256>>>(gu.ptr, h.ptr, s.m, s.f);
    else if (s.act != FfnActivation::None) ref_activate<<<(s.m * s.f + 255) / 256, 256>>>(gu.ptr, s.m * s.f, int(s.act));
    ref_linear_bf16w<double><<<(s.m * s.d + 255) / 256, 256>>>(s.gated ? h.ptr : gu.ptr, wd.ptr, out.ptr, s.m, s.d, s.f);
    TW_CUDA_CHECK_LAUNCH();
    ref = out.download();
  }
  double check(const FusedFfn& f, bool two_kernels = false) {
    y.poison();
    // Packed weights: repacked for every check (the weights may have changed), into poisoned
    // buffers, so padding the packer fails to write shows up as NaN.
    const bf16 *wgu_run = wgu.ptr, *wd_run = wd.ptr;
    std::unique_ptr<DeviceBuffer<bf16>> pgu, pd;
    if (f.uses_packed_weights()) {
      const FfnPackedSize n = f.packed_size();
      pgu = std::make_unique<DeviceBuffer<bf16>>(n.gate_up);
      pd = std::make_unique<DeviceBuffer<bf16>>(n.down);
      pgu->poison();
      pd->poison();
      f.pack(wgu.ptr, wd.ptr, pgu->ptr, pd->ptr, 0);
      wgu_run = pgu->ptr, wd_run = pd->ptr;
    }
    if (two_kernels) {
      cudaStream_t s2;
      TW_CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
      f.run_two_kernels(x.ptr, wgu_run, wd_run, y.ptr, 0, s2);
      TW_CUDA_CHECK(cudaStreamSynchronize(0));
      TW_CUDA_CHECK(cudaStreamDestroy(s2));
    } else {
      f.run(x.ptr, wgu_run, wd_run, y.ptr, 0);
    }
    EXPECT_EQ(f.plan().error(), 0u) << "a dependency wait timed out";
    return rel_error(y.download(), ref);
  }
};

constexpr double kTol = 1e-2;
constexpr uint32_t kSpinLimit = 2'000'000;  // ~0.5 s of polling: a missing edge fails fast

// Both tile bodies: sm80 (cp.async + mma.sync) and sm90 (TMA + wgmma, needs an sm_90 GPU), the
// latter also with packed weights ("sm90p": FusedFfn::pack, FfnOptions::packed_weights).
const std::vector<std::string> kMainloops = {"sm80", "sm90", "sm90p"};
void set_mainloop(FfnOptions& opt, const std::string& ml) {
  opt.mainloop = ml == "sm90p" ? "sm90" : ml;
  opt.packed_weights = ml == "sm90p";
}
bool have_sm90() {
  int dev = 0, major = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  return major == 9;
}
#define TW_REQUIRE_MAINLOOP(ml) \
  if (std::string(ml) != "sm80" && !have_sm90()) GTEST_SKIP() << "mainloop sm90 needs an sm_90 GPU"

// (mainloop, M, d, F, gated, order, sync)
using Case = std::tuple<std::string, int, int, int, bool, std::string, std::string>;
class FusedFfnTest : public ::testing::TestWithParam<Case> {};

TEST_P(FusedFfnTest, MatchesReference) {
  TW_REQUIRE_GPU();
  const auto [mainloop, m, d, f, gated, order, sync] = GetParam();
  TW_REQUIRE_MAINLOOP(mainloop);
  FfnData data({m, d, f, gated});
  FfnOptions opt;
  set_mainloop(opt, mainloop);
  opt.order = order;
  opt.sync.policy = parse_sync_policy(sync);
  opt.sync.stride = 3;
  opt.spin_limit = kSpinLimit;
  FusedFfn ffn(data.s, opt);
  const double err = data.check(ffn);
  EXPECT_LT(err, kTol) << mainloop << " M=" << m << " d=" << d << " F=" << f << " order=" << order << " sync=" << sync;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  for (const std::string& ml : kMainloops) {
    for (int m : {1, 2, 3, 16, 37, 64, 128, 255}) c.emplace_back(ml, m, 1024, 2816, true, "dataflow", "tile");
    for (int m : {1, 37, 255})
      for (const char* o : {"op_by_op", "op_by_op_column", "kslices/col_major"})
        for (const char* s : {"tile", "row", "strided"}) c.emplace_back(ml, m, 520, 1000, true, o, s);
    for (int m : {1, 37, 255}) c.emplace_back(ml, m, 520, 1000, true, "dataflow", "tile");
    for (int m : {3, 16, 64}) c.emplace_back(ml, m, 512, 1544, false, "dataflow", "tile");
    for (int m : {300, 513}) c.emplace_back(ml, m, 520, 1000, true, "op_by_op_column", "row");  // several row blocks
    c.emplace_back(ml, 16, 4096, 14336, true, "dataflow", "tile");  // Llama-3-8B
    c.emplace_back(ml, 1, 4096, 14336, true, "op_by_op_column", "row");
    c.emplace_back(ml, 16, 4096, 14336, true, "kslices/col_major", "row");
    // Prefill-sized: the down GEMM's 4 x 32 output tiles fill the SMs, so sm90 runs it unsplit
    // (ffn_down_split); M = 1000 leaves the last row block short.
    c.emplace_back(ml, 1000, 4096, 1032, true, "kslices/col_major", "tile");
    // A plain MLP whose two GEMMs have 9 and 12 output tiles: on sm90 both split to fill the SMs
    // (fill_split: 11 and 9 slices).
    c.emplace_back(ml, 256, 1536, 1152, false, "kslices/col_major", "tile");
    // Stream-K: one ticket of equal K work per block of the grid, a ticket's consecutive K slices
    // of an output tile summed in registers (sm90), runs of every slice stored without partials.
    // One and several row blocks (300, 513, 1000: short last ones), gated and plain, tile and row sync.
    for (int m : {1, 37, 255, 300, 1000}) c.emplace_back(ml, m, 1024, 2816, true, "streamk", "tile");
    for (int m : {16, 513}) c.emplace_back(ml, m, 520, 1000, true, "streamk", "row");
    for (int m : {3, 200}) c.emplace_back(ml, m, 512, 1544, false, "streamk", "tile");
    c.emplace_back(ml, 16, 4096, 14336, true, "streamk", "tile");
    c.emplace_back(ml, 7, 1024, 2816, true, "streamk:5/col_major", "tile");  // few tickets: long runs
  }
  return c;
}
INSTANTIATE_TEST_SUITE_P(Shapes, FusedFfnTest, ::testing::ValuesIn(cases()));

TEST(FusedFfn, RepeatedLaunchesReuseCountersWithoutMemset) {
  TW_REQUIRE_GPU();
  for (const std::string& ml : kMainloops) {
    TW_REQUIRE_MAINLOOP(ml);
    // Stream-K's runs arrive and publish for all their slices at once: the counts must still add
    // up to each launch's targets.
    for (const char* order : {"kslices/col_major", "streamk"}) {
      FfnData data({16, 1024, 2816, true});
      FfnOptions opt;
      set_mainloop(opt, ml);
      opt.order = order;
      opt.spin_limit = kSpinLimit;
      FusedFfn ffn(data.s, opt);
      for (int i = 0; i < 6; ++i) {
        data.new_input();
        EXPECT_LT(data.check(ffn), kTol) << ml << " " << order << " launch " << i;
      }
    }
  }
}

// Consecutive launches with different weight buffers (as a model's layers would run), packed and
// not, with the previous buffers freed in between: each launch must read its own weights (a stale
// tensor-map descriptor would read the previous layer's, or freed memory).
TEST(FusedFfn, WeightsChangeBetweenLaunches) {
  TW_REQUIRE_GPU();
  for (const std::string& ml : kMainloops) {
    TW_REQUIRE_MAINLOOP(ml);
    FfnOptions opt;
    set_mainloop(opt, ml);
    opt.spin_limit = kSpinLimit;
    const FfnShape s{16, 1024, 2816, true};
    FusedFfn ffn(s, opt);
    for (int layer = 0; layer < 3; ++layer) {
      FfnData data(s);  // fresh weights in fresh buffers; the last layer's are freed
      EXPECT_LT(data.check(ffn), kTol) << ml << " layer " << layer;
    }
  }
}

// Launches that overlap the one before (overlap_previous), back to back, each layer's input the
// previous layer's output (poisoned until written): a launch streams its first weights before the
// previous one has finished, and must read x and h, and write h, y, the counters and the split-K
// accumulators (shared by the layers, which run on one object), only after it. On a stream and
// captured in a CUDA graph; packed and PyTorch-layout weights; one row and an odd 37.
TEST(FusedFfn, OverlappedLaunchesChainLayers) {
  TW_REQUIRE_GPU();
  if (!have_sm90()) GTEST_SKIP() << "overlap_previous needs the sm90 tile body (an sm_90 GPU)";
  constexpr int kLayers = 5;
  for (const std::string ml : {"sm90", "sm90p"})
    for (int m : {1, 37})
      for (bool graph : {false, true}) {
        const FfnShape s{m, 1024, 2816, true};
        FfnOptions opt;
        set_mainloop(opt, ml);
        opt.overlap_previous = true;
        opt.spin_limit = kSpinLimit;
        FusedFfn ffn(s, opt);
        std::vector<std::unique_ptr<FfnData>> layer;
        std::vector<std::unique_ptr<DeviceBuffer<bf16>>> packed;
        for (int i = 0; i < kLayers; ++i) {
          layer.push_back(std::make_unique<FfnData>(s));
          layer[i]->y.poison();
          if (ffn.uses_packed_weights()) {
            packed.push_back(std::make_unique<DeviceBuffer<bf16>>(ffn.packed_size().gate_up));
            packed.push_back(std::make_unique<DeviceBuffer<bf16>>(ffn.packed_size().down));
            ffn.pack(layer[i]->wgu.ptr, layer[i]->wd.ptr, packed[2 * i]->ptr, packed[2 * i + 1]->ptr, 0);
          }
        }
        TW_CUDA_CHECK(cudaDeviceSynchronize());  // the weights are written before any overlapped launch
        cudaStream_t st;
        TW_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        auto enqueue = [&](cudaStream_t st) {
          for (int i = 0; i < kLayers; ++i) {
            const bf16* x = i ? layer[i - 1]->y.ptr : layer[0]->x.ptr;
            const bf16* wgu = packed.empty() ? layer[i]->wgu.ptr : packed[2 * i]->ptr;
            const bf16* wd = packed.empty() ? layer[i]->wd.ptr : packed[2 * i + 1]->ptr;
            ffn.run(x, wgu, wd, layer[i]->y.ptr, st);
          }
        };
        if (graph) {
          run_in_graph(st, enqueue);
        } else {
          enqueue(st);
        }
        TW_CUDA_CHECK(cudaStreamSynchronize(st));
        TW_CUDA_CHECK(cudaStreamDestroy(st));
        EXPECT_EQ(ffn.plan().error(), 0u) << "a dependency wait timed out";
        for (int i = 0; i < kLayers; ++i) {
          if (i) layer[i]->take_input(layer[i - 1]->y);
          EXPECT_LT(rel_error(layer[i]->y.download(), layer[i]->ref), kTol)
              << ml << " M=" << m << (graph ? " graph" : " stream") << " layer " << i;
        }
      }
}

TEST(FusedFfn, ExplicitSplitsAndBlocksPerSm) {
  TW_REQUIRE_GPU();
  FfnData data({37, 1024, 2816, true});
  for (const std::string& ml : kMainloops) {
    TW_REQUIRE_MAINLOOP(ml);
    for (auto [sg, sd, b] : std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {3, 7, 2}, {16, 44, 0}}) {
      FfnOptions opt;
      set_mainloop(opt, ml);
      opt.split_gate_up = sg;
      opt.split_down = sd;
      opt.blocks_per_sm = ml != "sm80" ? b % 2 : b;  // sm90: one CTA per SM
      opt.spin_limit = kSpinLimit;
      FusedFfn ffn(data.s, opt);
      EXPECT_LT(data.check(ffn), kTol) << ml << " splits " << sg << "/" << sd << " blocks/SM " << b;
    }
  }
}

// The sm90 split finisher (tiles of more than 64 activation rows): each split tile's slice of the
// last K range waits for the others' arrivals (made by warp 2 of their blocks) and sums; against the
// last-arriver protocol on the same shapes. Split orders and stream-K tickets (runs of slices summed
// in registers), explicit and planned splits, random delays before the arrivals, two launches each
// (the arrival counters carry over).
TEST(FusedFfn, SplitFinisherMatchesReference) {
  TW_REQUIRE_GPU();
  if (!have_sm90()) GTEST_SKIP() << "the split finisher is the sm90 body's";
  struct C {
    FfnShape s;
    const char* order;
    int sg, sd;
    uint32_t delay_ns;
  };
  for (const C& c : std::vector<C>{{{100, 1024, 2816, true}, "kslices/col_major", 3, 5, 0},
                                   {{150, 1024, 2816, true}, "op_by_op_column", 2, 7, 20'000},
                                   {{300, 520, 1000, true}, "kslices/col_major", 0, 0, 0},
                                   {{200, 1536, 1152, false}, "streamk", 0, 0, 0},
                                   {{513, 1024, 2816, true}, "streamk", 0, 0, 20'000},
                                   {{256, 1536, 1152, false}, "kslices/col_major", 0, 0, 20'000}})
    for (const std::string ml : {"sm90", "sm90p"})
      for (const bool finisher : {true, false}) {
        FfnData data(c.s);
        FfnOptions opt;
        set_mainloop(opt, ml);
        opt.order = c.order;
        opt.split_gate_up = c.sg;
        opt.split_down = c.sd;
        opt.split_finisher = finisher;
        opt.spin_limit = 20'000'000;
        opt.delay_ns = c.delay_ns;
        FusedFfn ffn(data.s, opt);
        const std::string what = ml + " M=" + std::to_string(c.s.m) + " " + c.order + " finisher " + std::to_string(finisher);
        EXPECT_EQ(ffn.uses_split_finisher(), finisher) << what;  // every case has split tiles of > 64 rows
        for (int i = 0; i < 2; ++i) {
          data.new_input();
          EXPECT_LT(data.check(ffn), kTol) << what << " launch " << i;
        }
      }
  // At 64 rows and fewer the option stays off (the last to arrive sums: split_finisher_pays).
  FfnData small({37, 1024, 2816, true});
  FfnOptions opt;
  opt.mainloop = "sm90";
  opt.split_gate_up = 3;
  EXPECT_FALSE(FusedFfn(small.s, opt).uses_split_finisher());
}

// Producers sleep a random while before publishing: a consumer that skips a wait reads a
// poisoned or stale h and fails.
TEST(FusedFfn, StressDelayedProducers) {
  TW_REQUIRE_GPU();
  for (const std::string& ml : kMainloops)
  for (const char* order : {"dataflow", "op_by_op_column", "kslices/col_major", "streamk"})
    for (const char* sync : {"tile", "row"}) {
      TW_REQUIRE_MAINLOOP(ml);
      if (std::string(order) == "dataflow" && std::string(sync) == "row") continue;  // refused (see below)
      FfnData data({16, 1024, 2816, true});
      FfnOptions opt;
      set_mainloop(opt, ml);
      opt.order = order;
      opt.sync.policy = parse_sync_policy(sync);
      opt.spin_limit = 20'000'000;
      opt.delay_ns = 20'000;
      FusedFfn ffn(data.s, opt);
      for (int i = 0; i < 3; ++i) {
        data.new_input();
        EXPECT_LT(data.check(ffn), kTol) << ml << " " << order << "/" << sync << " launch " << i;
      }
    }
}

TEST(FusedFfn, TwoKernelBaselineMatches) {
  TW_REQUIRE_GPU();
  for (const std::string& ml : kMainloops)
  for (int m : {1, 37}) {
    TW_REQUIRE_MAINLOOP(ml);
    FfnData data({m, 1024, 2816, true});
    FfnOptions opt;
    set_mainloop(opt, ml);
    opt.order = "op_by_op_column";
    opt.spin_limit = kSpinLimit;
    FusedFfn ffn(data.s, opt);
    for (int i = 0; i < 3; ++i) EXPECT_LT(data.check(ffn, true), kTol) << ml << " M=" << m << " launch " << i;
    EXPECT_THROW(data.check(ffn, false), InvalidArgument);  // one mode per object
  }
}

TEST(FusedFfn, BadInputIsRefusedBeforeLaunch) {
  TW_REQUIRE_GPU();
  EXPECT_THROW(FusedFfn({0, 1024, 2816, true}), InvalidArgument);
  EXPECT_THROW(FusedFfn({16, 1020, 2816, true}), InvalidArgument);  // d % 8
  FfnOptions bad_order;
  bad_order.order = "zigzag";
  EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, bad_order), InvalidArgument);
  FfnOptions too_many;
  too_many.blocks_per_sm = 1000;
  EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, too_many), InvalidArgument);
  for (int lead : {-1, 65}) {
    FfnOptions bad_lead;
    bad_lead.ticket_lead = lead;
    EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, bad_lead), InvalidArgument) << "ticket_lead " << lead;
  }
  FfnOptions bad_mainloop;
  bad_mainloop.mainloop = "sm70";
  EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, bad_mainloop), InvalidArgument);
  if (have_sm90()) {
    FfnOptions sm80_knob_on_sm90;
    sm80_knob_on_sm90.mainloop = "sm90";
    sm80_knob_on_sm90.bk = 128;
    EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, sm80_knob_on_sm90), InvalidArgument);
    FfnOptions two_ctas;
    two_ctas.mainloop = "sm90";
    two_ctas.blocks_per_sm = 2;
    EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, two_ctas), InvalidArgument);
    FfnOptions bad_slices;
    bad_slices.down_slices = "tail:9";
    EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, bad_slices), InvalidArgument);
    FusedFfn unpacked({16, 1024, 2816, true});  // pack() needs an object built for packed weights
    FfnData d({16, 1024, 2816, true});
    EXPECT_THROW(unpacked.pack(d.wgu.ptr, d.wd.ptr, d.wgu.ptr, d.wd.ptr, 0), InvalidArgument);
  }
  FfnOptions packed_sm80;
  packed_sm80.mainloop = "sm80";
  packed_sm80.packed_weights = true;
  EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, packed_sm80), InvalidArgument);
  // A schedule with a consumer before its producers is refused, naming the tile.
  FfnShape s{16, 1024, 2816, true};
  FfnGraph g = build_ffn_graph(s, FusedFfn::tiling_for(s, {}));
  Schedule rev = op_by_op_order(g.graph);
  std::reverse(rev.order.begin(), rev.order.end());
  try {
    FusedFfn f(s, {}, rev);
    FAIL() << "reversed schedule accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("before its dependency"), std::string::npos) << e.what();
  }
  // Row sync waits for whole rows of gate/up tiles; the dataflow order puts down tiles before the
  // end of that row (when there are more gate/up tiles than blocks in flight), which could
  // deadlock: refused before launch.
  FfnOptions row_dataflow;
  row_dataflow.order = "dataflow";
  row_dataflow.sync.policy = SyncPolicy::Row;
  try {
    FusedFfn f({16, 4096, 14336, true}, row_dataflow);
    FAIL() << "row sync with the dataflow order accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("later position"), std::string::npos) << e.what();
  }
  FfnData data(s);
  FusedFfn ffn(s);
  EXPECT_THROW(ffn.run(nullptr, data.wgu.ptr, data.wd.ptr, data.y.ptr, 0), InvalidArgument);
  EXPECT_THROW(ffn.run(data.x.ptr + 1, data.wgu.ptr, data.wd.ptr, data.y.ptr, 0), InvalidArgument);
  // The dataflow order interleaves the ops at this size (more gate/up tiles than blocks in flight).
  FfnData big({16, 4096, 14336, true});
  FfnOptions interleaved;
  interleaved.order = "dataflow";
  interleaved.sync.policy = SyncPolicy::Tile;
  EXPECT_THROW(FusedFfn(big.s, interleaved).run_two_kernels(big.x.ptr, big.wgu.ptr, big.wd.ptr, big.y.ptr, 0, 0),
               InvalidArgument);
  // The two kernels each take a range of tickets; stream-K tickets hold several tiles.
  FfnOptions stream_k;
  stream_k.order = "streamk";
  EXPECT_THROW(FusedFfn(big.s, stream_k).run_two_kernels(big.x.ptr, big.wgu.ptr, big.wd.ptr, big.y.ptr, 0, 0),
               InvalidArgument);
  FfnOptions bad_stream_k;
  bad_stream_k.order = "streamk:0/row_major";
  EXPECT_THROW(FusedFfn(big.s, bad_stream_k), InvalidArgument);
}

}  // namespace

namespace {
TEST(FusedFfn, TileShapesMatchReference) {
  TW_REQUIRE_GPU();
  // 16- and 32-row tiles with K split across warps (the M <= 16 defaults) and 64-row tiles.
  for (int ks : {1, 2, 4})
    for (auto [m, d, f, gated] : std::vector<std::tuple<int, int, int, bool>>{
             {1, 520, 1000, true}, {3, 1024, 2816, true}, {9, 520, 1000, true}, {16, 512, 1544, false}}) {
      FfnData data({m, d, f, gated});
      FfnOptions opt;
      opt.mainloop = "sm80";
      opt.k_split_warps = ks;
      opt.spin_limit = kSpinLimit;
      FusedFfn ffn(data.s, opt);
      EXPECT_LT(data.check(ffn), kTol) << "k_split_warps=" << ks << " M=" << m << " d=" << d << " F=" << f;
    }
  FfnOptions bad;
  bad.mainloop = "sm80";
  bad.k_split_warps = 4;
  EXPECT_THROW(FusedFfn({17, 1024, 2816, true}, bad), InvalidArgument);
  bad.k_split_warps = 3;
  EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, bad), InvalidArgument);
}

// The sm90 body's tile heights (FfnOptions::tile_rows): every multiple of 32 from 96 to 256, "pow2"
// (M = 300 -> two of 256) and "fit", the default (M = 80 -> 96, 150 -> 160, 200 -> 224, 300 -> two of 160, 513 -> three of 192), with the
// default order and stream-K, packed and not; the last tile row short of its height (zero-filled
// rows that must not be stored). Heights the body does not run are refused by name.
TEST(FusedFfn, TileHeightsMatchReference) {
  TW_REQUIRE_GPU();
  if (!have_sm90()) GTEST_SKIP() << "tile_rows is an option of the sm90 tile body (an sm_90 GPU)";
  struct Case {
    int m;
    const char* rows;
    bool gated;
  };
  for (const Case& c : std::vector<Case>{{80, "fit", true},    {150, "fit", false}, {200, "fit", true},  {300, "fit", true},
                                         {513, "fit", false},  {37, "96", true},    {129, "160", true},  {250, "192", false},
                                         {255, "224", true},   {100, "256", true},  {300, "pow2", false}})
    for (const std::string ml : {"sm90", "sm90p"})
      for (const char* order : {"kslices/col_major", "streamk"}) {
        FfnData data({c.m, 1024, 2816, c.gated});
        FfnOptions opt;
        set_mainloop(opt, ml);
        opt.tile_rows = c.rows;
        opt.order = order;
        opt.spin_limit = kSpinLimit;
        FusedFfn ffn(data.s, opt);
        EXPECT_LT(data.check(ffn), kTol) << ml << " M=" << c.m << " rows=" << c.rows << " (" << ffn.act_rows_per_tile()
                                         << ") " << order;
      }
  // Output columns short of a tile (d = 1032, F = 1000) at the heights whose stores go through shared
  // memory (160-256 rows: 16-byte row pieces at the edge), packed and not.
  for (int m : {150, 250, 300})
    for (bool gated : {true, false})
      for (const std::string ml : {"sm90", "sm90p"}) {
        FfnData data({m, 1032, 1000, gated});
        FfnOptions opt;
        set_mainloop(opt, ml);
        opt.spin_limit = kSpinLimit;
        FusedFfn ffn(data.s, opt);
        EXPECT_LT(data.check(ffn), kTol) << ml << " M=" << m << (gated ? " gated" : " plain") << " d=1032 F=1000";
      }
  for (const char* bad : {"100", "48", "288", "0", "fitted", ""}) {
    FfnOptions opt;
    opt.mainloop = "sm90";
    opt.tile_rows = bad;
    EXPECT_THROW(FusedFfn({200, 1024, 2816, true}, opt), InvalidArgument) << "tile_rows '" << bad << "'";
  }
  FfnOptions sm80;
  sm80.mainloop = "sm80";
  sm80.tile_rows = "pow2";
  EXPECT_THROW(FusedFfn({200, 1024, 2816, true}, sm80), InvalidArgument);
}

// Any order the model can produce runs on the executor, here through the JSON the explorer and
// `tileweave sim --order-file` use; a JSON order that breaks a dependency is refused.
TEST(FusedFfn, OrdersFromTheModelAndJson) {
  TW_REQUIRE_GPU();
  FfnData data({16, 1024, 2816, true});
  FfnOptions opt;
  opt.sync.policy = SyncPolicy::Tile;
  opt.spin_limit = kSpinLimit;
  for (const std::string& ml : kMainloops) {
    TW_REQUIRE_MAINLOOP(ml);
    set_mainloop(opt, ml);
    const FfnGraph g = build_ffn_graph(data.s, FusedFfn::tiling_for(data.s, opt));
    for (const char* spec : {"hilbert", "snake", "chain_rows:1", "dataflow/col_major", "dataflow/kslices/col_major"}) {
      const Schedule s = schedule_from_json(g.graph, schedule_to_json(g.graph, make_order(g.graph, spec)));
      FusedFfn ffn(data.s, opt, s);
      EXPECT_LT(data.check(ffn), kTol) << ml << " " << spec;
    }
  }
  opt.mainloop = "sm80";
  const FfnGraph g = build_ffn_graph(data.s, FusedFfn::tiling_for(data.s, opt));
  Schedule bad = op_by_op_order(g.graph);
  std::swap(bad.order.front(), bad.order.back());
  EXPECT_THROW(schedule_from_json(g.graph, schedule_to_json(g.graph, bad)), InvalidArgument);
}

TEST(FusedFfn, Bk128MatchesReference) {
  TW_REQUIRE_GPU();
  for (auto [m, d, f] : std::vector<std::tuple<int, int, int>>{{1, 520, 1000}, {16, 1024, 2816}, {37, 520, 1000}, {255, 1024, 2816}}) {
    FfnData data({m, d, f, true});
    FfnOptions opt;
    opt.mainloop = "sm80";
    opt.bk = 128;
    opt.k_split_warps = 1;
    opt.spin_limit = kSpinLimit;
    FusedFfn ffn(data.s, opt);
    EXPECT_LT(data.check(ffn), kTol) << "bk=128 M=" << m << " d=" << d << " F=" << f;
  }
  FfnOptions bad;
  bad.mainloop = "sm80";
  bad.bk = 96;
  EXPECT_THROW(FusedFfn({16, 1024, 2816, true}, bad), InvalidArgument);
}

// Shapes drawn from a seed, as issue 16's sweep draws them (bench_sweep), at test sizes: d and F
// multiples of 8 in 64 .. 2048, M in 1 .. 300, gated or plain, each on every mainloop with the
// planner's defaults (the splits of fill_split and ffn_down_split included). TW_SHAPE_SEED picks
// the grid: the default is the same every run, any other one a grid no test names.
// data's shape on every mainloop this GPU has, with the planner's defaults, against the reference.
void check_every_mainloop(FfnData& data, const std::string& what) {
  for (const std::string& ml : kMainloops) {
    if (ml != "sm80" && !have_sm90()) continue;
    FfnOptions opt;
    set_mainloop(opt, ml);
    opt.spin_limit = kSpinLimit;
    FusedFfn ffn(data.s, opt);
    EXPECT_LT(data.check(ffn), kTol) << ml << " " << what << " M=" << data.s.m << " d=" << data.s.d << " F=" << data.s.f;
  }
}

// The plain chain's activations on the first GEMM's output (issue 16): ReLU and tanh-GeLU on every
// mainloop, at M = 1 (split-K: the activation must see the whole sum, not a slice's partial), 37 and
// 200, odd sizes; a gated FFN with another activation, or an unknown name, is refused by name.
TEST(FusedFfn, PlainChainActivations) {
  TW_REQUIRE_GPU();
  for (const FfnActivation act : {FfnActivation::Relu, FfnActivation::GeluTanh})
    for (const auto& [m, d, f] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1024, 2816}, {37, 520, 1096}, {200, 1536, 1152}}) {
      FfnShape s{m, d, f, false};
      s.act = act;
      FfnData data(s);
      check_every_mainloop(data, std::string(to_string(act)));
    }
  FfnShape gated{16, 1024, 2816, true};
  gated.act = FfnActivation::Relu;
  EXPECT_THROW(FusedFfn{gated}, InvalidArgument);
  EXPECT_EQ(ffn_activation_from("gelu_tanh"), FfnActivation::GeluTanh);
  EXPECT_THROW(ffn_activation_from("gelu"), InvalidArgument);
}

// At M <= 64 the K slices come from the traffic model on this GPU's preset (choose_ffn_splits) unless
// splits = "rules": a gated FFN with d = 7808, F = 5376 at M = 1 has 84 gate/up tiles, which the rules
// leave unsplit; on the H200's preset the model cuts them in K (measured 82.8 -> 69.3 us there), on
// the H100's (3.35 TB/s, which 84 SMs' streams nearly reach) it keeps them. Both plans match the
// reference, and an unknown value is refused.
TEST(FusedFfn, SplitsFromTheModel) {
  TW_REQUIRE_GPU();
  if (!have_sm90()) GTEST_SKIP() << "the model's splits are the sm90 body's";
  FfnData data({1, 7808, 5376, true});
  FfnOptions model, rules;
  model.spin_limit = rules.spin_limit = kSpinLimit;
  rules.splits = "rules";
  const FusedFfn a(data.s, model), b(data.s, rules);
  int dev = 0;
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
  const GpuPreset preset = gpu_preset_for_device(prop.name, prop.multiProcessorCount, prop.l2CacheSize);
  const FfnSplits want = choose_ffn_splits(data.s, preset);
  const FfnTiling expect = sm90_ffn_tiling(data.s, prop.multiProcessorCount, want.split_gate_up, want.split_down);
  EXPECT_EQ(a.graph().graph.op(a.graph().op_gate_up).tiling.split_k, expect.gate_up.split_k) << preset.name;
  EXPECT_EQ(a.graph().graph.op(a.graph().op_down).tiling.split_k, expect.down.split_k) << preset.name;
  if (preset.name == "h200") EXPECT_GT(a.graph().graph.op(a.graph().op_gate_up).tiling.split_k, 1);
  // "model:<preset>": the model's choice on another preset (a recalibration's plans, to measure);
  // here the H200's with one fixed latency for every tile height (the presets' before 2026-11-27).
  const std::string file = ::testing::TempDir() + "tw_uniform_tiles.json";
  std::ofstream(file) << R"({"base": "h200", "name": "h200-uniform-tiles", "tile_fixed_base_us": -1})";
  FfnOptions other = model;
  other.splits = "model:" + file;
  const FusedFfn c(data.s, other);
  const FfnSplits want_other = choose_ffn_splits(data.s, find_gpu_preset(file));
  const FfnTiling expect_other =
      sm90_ffn_tiling(data.s, prop.multiProcessorCount, want_other.split_gate_up, want_other.split_down);
  EXPECT_EQ(c.graph().graph.op(c.graph().op_gate_up).tiling.split_k, expect_other.gate_up.split_k);
  EXPECT_EQ(c.graph().graph.op(c.graph().op_down).tiling.split_k, expect_other.down.split_k);
  for (const char* bad_preset : {"model:", "model:no-such-gpu", "models"}) {
    FfnOptions o = model;
    o.splits = bad_preset;
    EXPECT_THROW(FusedFfn(data.s, o), InvalidArgument) << bad_preset;
  }
  EXPECT_EQ(b.graph().graph.op(b.graph().op_gate_up).tiling.split_k, 1);
  EXPECT_LT(data.check(a), kTol) << "the model's splits";
  EXPECT_LT(data.check(b), kTol) << "the rules' splits";
  FfnOptions bad;
  bad.splits = "fastest";
  EXPECT_THROW(FusedFfn(data.s, bad), InvalidArgument);
}

// Whole waves (order "waves:<SMs>/..."): the tiles that fill whole waves run every K slice as one
// ticket (no partial sums), the last wave's slice by slice. On 132 SMs: M = 300 (two row blocks of
// 160); gated F = 4288 gives 134 gate/up tiles (132 whole, 2 in slices), F = 4224 132 (all whole);
// a plain MLP with d = 8576 gives 134 down tiles (M = 37, d = 17024: 133); the other op's tiles stay split-K.
// Then the planner's own choice where it takes whole waves (on the H200's preset: a plain MLP with
// d = 10368, F = 5760 at M = 512, down's 162 tiles), against the reference too.
TEST(FusedFfn, WholeWavesMatchReference) {
  TW_REQUIRE_GPU();
  if (!have_sm90()) GTEST_SKIP() << "whole tickets of K slices are the sm90 body's";
  int dev = 0, sms = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const std::string order = "waves:" + std::to_string(sms) + "/kslices/col_major";
  struct Case {
    FfnShape s;
    int sg, sd;
  };
  for (const Case& c : std::vector<Case>{{{300, 1024, 4288, true}, 3, 2}, {{300, 1024, 4224, true}, 3, 2},
                                         {{300, 8576, 1024, false}, 2, 3}, {{37, 17024, 1024, false}, 2, 4}})
    for (const std::string ml : {"sm90", "sm90p"}) {
      FfnData data(c.s);
      FfnOptions opt;
      set_mainloop(opt, ml);
      opt.order = order;
      opt.split_gate_up = c.sg;
      opt.split_down = c.sd;
      opt.down_slices = "even";
      opt.spin_limit = kSpinLimit;
      FusedFfn ffn(data.s, opt);
      EXPECT_FALSE(ffn.schedule().units.empty());
      for (int i = 0; i < 2; ++i) {  // twice: the arrival counters of the split tiles come back clean
        if (i) data.new_input();
        EXPECT_LT(data.check(ffn), kTol) << ml << " M=" << c.s.m << " d=" << c.s.d << " F=" << c.s.f << " launch " << i;
      }
      if (ml == "sm90") {  // the CuSync-style two kernels take the plan's tickets, whole ones included
        FusedFfn two(data.s, opt);
        EXPECT_LT(data.check(two, true), kTol) << "two kernels, M=" << c.s.m << " d=" << c.s.d << " F=" << c.s.f;
      }
    }
  FfnData data({512, 10368, 5760, false});
  FfnOptions opt;
  opt.spin_limit = kSpinLimit;
  const FusedFfn ffn(data.s, opt);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
  const GpuPreset preset = gpu_preset_for_device(prop.name, prop.multiProcessorCount, prop.l2CacheSize);
  EXPECT_EQ(ffn.schedule().name.rfind("waves:", 0) == 0, choose_ffn_splits(data.s, preset).whole_waves) << preset.name;
  if (preset.name == "h200") EXPECT_EQ(ffn.schedule().name, order);
  EXPECT_LT(data.check(ffn), kTol) << "the planner's plan, " << ffn.schedule().name;
}

TEST(FusedFfn, RandomShapeGrid) {
  TW_REQUIRE_GPU();
  const uint64_t seed = tw::test::shape_seed();
  SCOPED_TRACE("TW_SHAPE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 12; ++i) {
    const int64_t m = 1 + int64_t(rng() % 300), d = 8 * (8 + int64_t(rng() % 249)), f = 8 * (8 + int64_t(rng() % 249));
    const bool gated = rng() % 2 == 0;
    FfnData data({m, d, f, gated});
    check_every_mainloop(data, gated ? "gated" : "plain");
  }
}
}  // namespace
