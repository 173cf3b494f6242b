// Decode GEMM on the sm90 mainloop (ops/gemm.hpp) against a double reference: fresh random inputs,
// poisoned outputs, odd M / N / K, repeated launches (the split-K workspace must come back clean),
// and the executor's dependency protocol (weights first, activations TMA-read after an acquire of
// data that other CTAs of the same launch wrote with ordinary stores).
#include <cuda/atomic>
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gpu_util.cuh"
#include "tileweave/kernels/sm90/mainloop.cuh"
#include "tileweave/ops/gemm.hpp"

namespace {

using tw::test::DeviceBuffer;
using tw::test::HostBf16;

// Y[m][n] = sum_k X[m][k] W[n][k], in double, over all host threads.
std::vector<double> reference(const HostBf16& x, const HostBf16& w, int M, int N, int K) {
  std::vector<double> y(size_t(M) * N);
  const int nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (int t = 0; t < nt; ++t)
    th.emplace_back([&, t] {
      for (int n = t; n < N; n += nt) {
        const float* wr = w.val.data() + size_t(n) * K;
        for (int m = 0; m < M; ++m) {
          const float* xr = x.val.data() + size_t(m) * K;
          double s = 0;
          for (int k = 0; k < K; ++k) s += double(xr[k]) * wr[k];
          y[size_t(m) * N + n] = s;
        }
      }
    });
  for (auto& t : th) t.join();
  return y;
}

#define TW_REQUIRE_SM90()                                                              \
  do {                                                                                 \
    TW_REQUIRE_GPU();                                                                  \
    if (!tw::gemm_sm90_supported()) GTEST_SKIP() << "not an sm_90 GPU: test skipped"; \
  } while (0)

struct Case {
  int M, N, K;
};

void check(const Case& c, const tw::GemmOptions& opt = {}, int launches = 2) {
  std::mt19937_64 rng(tw::test::fresh_seed());
  const HostBf16 x = tw::test::random_bf16(size_t(c.M) * c.K, rng);
  const HostBf16 w = tw::test::random_bf16(size_t(c.N) * c.K, rng, 0.05f);
  DeviceBuffer<__nv_bfloat16> dx(x.bits.size()), dw(w.bits.size()), dy(size_t(c.M) * c.N);
  dx.upload(x.bits);
  dw.upload(w.bits);
  const std::vector<double> ref = reference(x, w, c.M, c.N, c.K);
  // Launch twice, poisoning before each: the second launch proves the workspace and arrival
  // counters were left clean by the first.
  for (int l = 0; l < launches; ++l) {
    dy.poison();
    tw::run_gemm(dy.ptr, dx.ptr, dw.ptr, c.M, c.N, c.K, nullptr, opt);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    const double err = tw::test::rel_error(dy.download(), ref);
    EXPECT_LT(err, 1e-2) << "M=" << c.M << " N=" << c.N << " K=" << c.K << " k_atoms=" << opt.k_atoms
                         << " tile_rows=" << opt.tile_rows << " grid=" << opt.grid << " stages=" << opt.stages
                         << " launch " << l;
  }
}

}  // namespace

TEST(GemmSm90, DecodeShapesAllM) {
  TW_REQUIRE_SM90();
  for (int M : {1, 2, 3, 16, 37, 64, 128, 255, 256}) {
    check({M, 4096 + 64, 1024});  // N: 32.5 weight tiles; stream-K splits tiles across CTAs
    check({M, 1000, 1032});       // N and K not multiples of the tile (zero-filled edges)
  }
}

TEST(GemmSm90, LlamaShapes) {
  TW_REQUIRE_SM90();
  // Llama-3-8B gate_up: tiles split between two CTAs, whose last segments take the partial of the
  // next CTA without counting (the poll in gemm.cu); two launches: the counters stay clean.
  check({1, 28672, 4096});
  check({37, 28672, 4096});
  check({3, 4096, 14336}, {}, 1);  // Llama-3-8B down: 32 tiles, every tile split ~4 ways
  check({16, 6144, 4096}, {}, 1);  // QKV
  check({64, 4096, 14336}, {}, 1);
}

static tw::GemmOptions knobs(int k_atoms, int tile_rows, int grid = 0, int stages = 0) {
  tw::GemmOptions o;
  o.k_atoms = k_atoms;
  o.tile_rows = tile_rows;
  o.grid = grid;
  o.stages = stages;
  return o;
}

TEST(GemmSm90, TuningKnobs) {
  TW_REQUIRE_SM90();
  for (int M : {1, 16, 37, 64}) {
    for (int ka : {1, 2}) check({M, 2048 + 128, 2048 + 64}, knobs(ka, 128));
    check({M, 2048 + 128, 2048 + 64}, knobs(0, 256));
  }
  check({128, 1000, 1032}, knobs(0, 256));
  check({100, 4096 + 64, 1024}, knobs(0, 256));
  check({37, 3000, 520}, knobs(2, 128, 5));   // few CTAs: many tiles per CTA, ring wraps across tiles
  check({37, 3000, 520}, knobs(0, 256, 7, 3));  // shallowest ring
  check({256, 1024, 512}, knobs(0, 0, 1));    // one CTA does everything
  check({5, 640, 4096}, knobs(0, 0, 500));    // more CTAs than tiles (grid capped at 2/SM): all split
  check({64, 256, 8192}, knobs(0, 128, 200)); // 2 tiles, ~100 contributors each
  for (int rows : {128, 256}) {
    tw::GemmOptions pf = knobs(0, rows, 11);
    pf.partials_first = true;
    check({45, 5000, 1000}, pf);  // ~2-4 tiles per CTA: split segments first, whole tiles after
    pf.grid = 0;
    check({3, 28672, 512}, pf);
  }
  tw::GemmOptions o;
  o.weights_evict_first = false;
  o.weights_promote_256 = true;
  check({16, 2048, 2048}, o);
}

// Launches that overlap the one before (overlap_previous), each layer's input the previous
// layer's output (poisoned until written): the first weights stream early; X, Y, the split-K
// workspace and the counters are touched only after the wait. M = 260 runs two slices, whose
// launches overlap each other too. On a stream and in a CUDA graph.
TEST(GemmSm90, OverlappedLaunchesChainLayers) {
  TW_REQUIRE_SM90();
  constexpr int kLayers = 4;
  const int n = 4096, k = 4096;
  for (int m : {1, 37, 260})
    for (bool graph : {false, true}) {
      std::mt19937_64 rng(tw::test::fresh_seed());
      std::vector<std::unique_ptr<DeviceBuffer<__nv_bfloat16>>> w, y;
      DeviceBuffer<__nv_bfloat16> x0(size_t(m) * k);
      x0.upload(tw::test::random_bf16(x0.n, rng).bits);
      for (int i = 0; i < kLayers; ++i) {
        w.push_back(std::make_unique<DeviceBuffer<__nv_bfloat16>>(size_t(n) * k));
        w[i]->upload(tw::test::random_bf16(w[i]->n, rng, 1.0f / std::sqrt(float(k))).bits);
        y.push_back(std::make_unique<DeviceBuffer<__nv_bfloat16>>(size_t(m) * n));
        y[i]->poison();
      }
      tw::GemmOptions opt;
      opt.overlap_previous = true;
      tw::run_gemm(y[0]->ptr, x0.ptr, w[0]->ptr, m, n, k, nullptr);  // the workspace exists before a capture
      y[0]->poison();
      TW_CUDA_CHECK(cudaDeviceSynchronize());  // the weights are written before any overlapped launch
      cudaStream_t st;
      TW_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      auto enqueue = [&](cudaStream_t s) {
        for (int i = 0; i < kLayers; ++i) tw::run_gemm(y[i]->ptr, i ? y[i - 1]->ptr : x0.ptr, w[i]->ptr, m, n, k, s, opt);
      };
      if (graph) {
        tw::test::run_in_graph(st, enqueue);
      } else {
        enqueue(st);
        TW_CUDA_CHECK(cudaStreamSynchronize(st));
      }
      TW_CUDA_CHECK(cudaStreamDestroy(st));
      for (int i = 0; i < kLayers; ++i) {
        DeviceBuffer<double> ref(size_t(m) * n);
        tw::test::ref_linear_bf16w<__nv_bfloat16><<<(m * n + 255) / 256, 256>>>(i ? y[i - 1]->ptr : x0.ptr, w[i]->ptr,
                                                                                ref.ptr, m, n, k);
        TW_CUDA_CHECK_LAUNCH();
        EXPECT_LT(tw::test::rel_error(y[i]->download(), ref.download()), 1e-2)
            << "M=" << m << " graph=" << graph << " layer " << i;
      }
    }
}

TEST(GemmSm90, EdgeShapes) {
  TW_REQUIRE_SM90();
  check({1, 1, 8});
  check({7, 129, 8});
  check({300, 520, 264});  // M > 256: slices of 256 rows
  check({513, 130, 72});
}

TEST(GemmSm90, BadInputThrowsBeforeLaunch) {
  TW_REQUIRE_GPU();
  DeviceBuffer<__nv_bfloat16> a(64 * 64), b(64 * 64), y(64 * 64);
  auto bad = [&](auto f) { EXPECT_THROW(f(), tw::InvalidArgument); };
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, 0, 64, 64, nullptr); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, -3, 64, 64, nullptr); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, 4, 0, 64, nullptr); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, 4, 64, 60, nullptr); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, 4, 64, 0, nullptr); });
  bad([&] { tw::run_gemm(nullptr, a.ptr, b.ptr, 4, 64, 64, nullptr); });
  bad([&] { tw::run_gemm(y.ptr, nullptr, b.ptr, 4, 64, 64, nullptr); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr, nullptr, 4, 64, 64, nullptr); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr + 1, b.ptr, 4, 64, 64, nullptr); });  // 2-byte aligned X
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr + 4, 4, 64, 64, nullptr); });  // 8-byte aligned W
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, 4, 64, 64, nullptr, knobs(3, 0)); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, 4, 64, 64, nullptr, knobs(0, 64)); });
  bad([&] { tw::run_gemm(y.ptr, a.ptr, b.ptr, 4, 64, 64, nullptr, knobs(0, 0, 0, 2)); });
}

namespace {

// ---- the executor's protocol, on the mainloop pieces directly ----
// CTA 0's consumer warps write the activations (after a delay) with ordinary stores, then
// fence.proxy.async + release a flag; every CTA's producer has already issued the weight copies of
// its first stages and waits for the flag (acquire) before its TMA reads of the activations. A
// missing acquire/proxy fence or an early activation copy reads poison (NaN) and fails the check.
using DepCfg = tw::sm90::MainloopConfig<32, 1, 2>;  // 256-row tiles

__global__ void __launch_bounds__(DepCfg::kThreads, 1)
    dep_gemm_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap,
                    const __nv_bfloat16* x_src, __nv_bfloat16* x_dst, int x_elems, unsigned* flag, __nv_bfloat16* y,
                    int M, int N, int kst, int tiles) {
#if TW_SM90_ENABLED
  using namespace tw::sm90;
  using Cfg = DepCfg;
  extern __shared__ __align__(1024) uint8_t smem[];
  const Ring<Cfg> ring = Ring<Cfg>::carve(smem);
  if (threadIdx.x == 0) ring.init();
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp < 4) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      const StreamSrc src{&wmap, &xmap, l2_evict_first(), l2_evict_last()};
      PipeState<Cfg> ps;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x)
        produce_tile(ring, ps, src, t * Cfg::kBW, 0, 0, kst, [&] {
          cuda::atomic_ref<unsigned, cuda::thread_scope_device> f(*flag);
          while (f.load(cuda::memory_order_acquire) == 0) __nanosleep(200);
        });
    }
  } else {
    setmaxnreg_inc<232>();
    const int wg = warp / 4 - 1, tid = threadIdx.x % 128;
    if (blockIdx.x == 0) {
      const long long t0 = clock64();
      while (clock64() - t0 < 200000) {  // ~100 us: the other CTAs are already waiting
      }
      for (int i = threadIdx.x - 128; i < x_elems; i += 256) x_dst[i] = x_src[i];
      cuda::ptx::fence_proxy_async(cuda::ptx::space_global);  // writer side of the proxy pairing
      named_bar_sync(1, 256);
      if (threadIdx.x == 128) {
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> f(*flag);
        f.store(1, cuda::memory_order_release);
      }
    }
    PipeState<Cfg> ps;
    float acc[Cfg::kAcc];
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      consume_tile(ring, ps, wg, kst, acc);
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) {
        const AccCoord c = acc_coord<Cfg>(wg, tid, i);
        const int n = t * Cfg::kBW + c.w_row;
        if (n < N && c.act_row < M) y[size_t(c.act_row) * N + n] = __float2bfloat16_rn(acc[i]);
      }
    }
  }
#endif
}

}  // namespace

TEST(GemmSm90, WeightsBeforeDependencyProtocol) {
  TW_REQUIRE_SM90();
  const int M = 29, N = 256 * 40 + 17, K = 1536;
  std::mt19937_64 rng(tw::test::fresh_seed());
  const HostBf16 x = tw::test::random_bf16(size_t(M) * K, rng);
  const HostBf16 w = tw::test::random_bf16(size_t(N) * K, rng, 0.05f);
  DeviceBuffer<__nv_bfloat16> dsrc(x.bits.size()), dx(x.bits.size()), dw(w.bits.size()), dy(size_t(M) * N);
  DeviceBuffer<unsigned> flag(1);
  dsrc.upload(x.bits);
  dw.upload(w.bits);
  const std::vector<double> ref = reference(x, w, M, N, K);
  const CUtensorMap wmap = tw::sm90::make_tensor_map_bf16(dw.ptr, N, K, DepCfg::kBW);
  const CUtensorMap xmap = tw::sm90::make_tensor_map_bf16(dx.ptr, M, K, DepCfg::kMPad);
  TW_CUDA_CHECK(cudaFuncSetAttribute(dep_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, DepCfg::kSmemBytes));
  int sms = 0;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles = (N + DepCfg::kBW - 1) / DepCfg::kBW, grid = std::min(tiles, sms);  // all CTAs resident: no deadlock
  for (int rep = 0; rep < 3; ++rep) {
    dx.poison();
    dy.poison();
    TW_CUDA_CHECK(cudaMemset(flag.ptr, 0, sizeof(unsigned)));
    dep_gemm_kernel<<<grid, DepCfg::kThreads, DepCfg::kSmemBytes>>>(wmap, xmap, dsrc.ptr, dx.ptr, M * K, flag.ptr,
                                                                    dy.ptr, M, N, K / 64, tiles);
    TW_CUDA_CHECK_LAUNCH();
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_LT(tw::test::rel_error(dy.download(), ref), 1e-2) << "rep " << rep;
  }
}
