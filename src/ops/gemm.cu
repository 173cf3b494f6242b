// Standalone decode GEMM: Y = X W^T on the sm90 weight-streaming mainloop, persistent grid with
// stream-K balancing. The work is (weight tile of 128 rows) x (K stage) units, tile-major; CTA b of
// G takes the contiguous unit range [b*U/G, (b+1)*U/G), so every CTA streams the same number of
// weight bytes (+-1 stage) and the last wave does not idle. A tile cut by a CTA boundary is summed
// in an fp32 workspace slot with vector atomics; the last of its contributors (counted on an
// arrival counter) converts it to bf16, writes Y and re-zeroes the slot and counter for the next
// launch, so launches need no memset and no second kernel.
#include "tileweave/ops/gemm.hpp"

#include <cuda.h>

#include <mutex>
#include <string>
#include <vector>

#include "tileweave/kernels/sm90/mainloop.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw {
namespace {

struct GemmParams {
  __nv_bfloat16* y;
  float* ws;          // [G][kBW * kMPad] fp32, zero between launches
  unsigned* cnt;      // [G] arrival counters, zero between launches
  int m, n;           // rows of this M slice (<= 256), weight rows
  int kst;            // K stages per tile
  long long units;    // tiles * kst
};

#if TW_SM90_ENABLED
// First unit of CTA i: CTAs own [bnd(i), bnd(i+1)).
__device__ __forceinline__ long long bnd(long long i, long long units, int g) { return i * units / g; }
__device__ __forceinline__ int owner(long long u, long long units, int g) {
  int i = int(u * g / units);
  while (i + 1 < g && bnd(i + 1, units, g) <= u) ++i;
  while (bnd(i, units, g) > u) --i;
  return i;
}
#endif

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap, GemmParams p) {
#if TW_SM90_ENABLED
  using namespace sm90;
  extern __shared__ __align__(1024) uint8_t smem[];
  const Ring<Cfg> ring = Ring<Cfg>::carve(smem);
  if (threadIdx.x == 0) {
    ring.init();
    tma_prefetch_desc(&wmap);
    tma_prefetch_desc(&xmap);
  }
  __syncthreads();

  const int g = gridDim.x;
  const long long u_begin = bnd(blockIdx.x, p.units, g), u_end = bnd(blockIdx.x + 1, p.units, g);
  const int warp = threadIdx.x / 32;

  if (warp < 4) {
    // Producer warpgroup: one thread issues every copy; the registers go to the consumers.
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      const StreamSrc src{&wmap, &xmap, l2_evict_first(), l2_evict_last()};
      PipeState<Cfg> ps;
      for (long long u = u_begin; u < u_end;) {
        const int t = int(u / p.kst), k0 = int(u - (long long)t * p.kst);
        const int n = int(min(u_end - (long long)t * p.kst, (long long)p.kst)) - k0;
        produce_tile(ring, ps, src, t * Cfg::kBW, 0, k0, n);
        u += n;
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int wg = warp / 4 - 1, tid = threadIdx.x % 128;
    PipeState<Cfg> ps;
    float acc[Cfg::kAcc];
    for (long long u = u_begin; u < u_end;) {
      const int t = int(u / p.kst), k0 = int(u - (long long)t * p.kst);
      const int n = int(min(u_end - (long long)t * p.kst, (long long)p.kst)) - k0;
      u += n;
      consume_tile(ring, ps, wg, n, acc);
      const int w0 = t * Cfg::kBW;
      if (n == p.kst) {  // whole K range here: store bf16 directly
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) {
          const AccCoord c = acc_coord(wg, tid, i);
          if (w0 + c.w_row < p.n && c.act_row < p.m)
            p.y[(long long)c.act_row * p.n + w0 + c.w_row] = __float2bfloat16_rn(acc[i]);
        }
        continue;
      }
      // Split tile: add the partial into the tile's slot, then the last contributor finishes it.
      const long long tb = (long long)t * p.kst;
      const int first = owner(tb, p.units, g);
      const int contributors = owner(tb + p.kst - 1, p.units, g) - first + 1;
      const int slot = first + 1;  // the CTA boundary inside this tile: unique per split tile
      float* ws = p.ws + (long long)slot * (Cfg::kBW * Cfg::kMPad);
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; i += 2) {
        const AccCoord c = acc_coord(wg, tid, i);  // i, i+1: act rows c, c+1 (adjacent in ws)
        if (c.act_row < p.m) atomicAdd(reinterpret_cast<float2*>(ws + c.w_row * Cfg::kMPad + c.act_row),
                                       make_float2(acc[i], acc[i + 1]));
      }
      // Release: the partials are visible GPU-wide before the arrival below (fence.acq_rel.gpu,
      // not __threadfence's fence.sc).
      asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
      named_bar_sync(1, 128 * Cfg::kConsumerWGs);
      if (threadIdx.x == 128) {
        *ring.flag = atomicAdd(p.cnt + slot, 1u) == unsigned(contributors - 1);
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // acquire: the others' partials
      }
      named_bar_sync(1, 128 * Cfg::kConsumerWGs);
      if (*reinterpret_cast<volatile uint32_t*>(ring.flag)) {
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // acquire side of the arrival counter
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; i += 2) {
          const AccCoord c = acc_coord(wg, tid, i);
          if (c.act_row >= p.m) continue;
          float2* a = reinterpret_cast<float2*>(ws + c.w_row * Cfg::kMPad + c.act_row);
          const float2 v = __ldcg(a);  // L2: other SMs' atomics are not in this SM's L1
          __stcg(a, make_float2(0.f, 0.f));
          if (w0 + c.w_row < p.n) {
            p.y[(long long)c.act_row * p.n + w0 + c.w_row] = __float2bfloat16_rn(v.x);
            if (c.act_row + 1 < p.m) p.y[(long long)(c.act_row + 1) * p.n + w0 + c.w_row] = __float2bfloat16_rn(v.y);
          }
        }
        if (threadIdx.x == 128) p.cnt[slot] = 0;
      }
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without wgmma: the host never dispatches here
#endif
}

// ---- host ----

struct DeviceState {
  int sms = 0;
  bool sm90 = false;
  float* ws = nullptr;
  unsigned* cnt = nullptr;
};

DeviceState& device_state() {
  static std::mutex mu;
  static std::vector<DeviceState> states;
  int dev = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (states.size() <= size_t(dev)) states.resize(dev + 1);
  DeviceState& s = states[dev];
  if (s.sms == 0) {
    cudaDeviceProp prop{};
    TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    s.sms = prop.multiProcessorCount;
    s.sm90 = prop.major == 9;
  }
  return s;
}

constexpr int kMaxMPad = 256, kBW = 128;

// Workspace for the largest slice (kMPad = 256) and up to `grid` slots; allocated once per device.
void ensure_workspace(DeviceState& s, int grid) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (s.ws) return;
  const int slots = std::max(grid, s.sms * 4);  // run_gemm clamps its grid to this
  TW_CUDA_CHECK(cudaMalloc(&s.ws, size_t(slots) * kBW * kMaxMPad * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&s.cnt, size_t(slots) * sizeof(unsigned)));
  TW_CUDA_CHECK(cudaMemset(s.ws, 0, size_t(slots) * kBW * kMaxMPad * sizeof(float)));
  TW_CUDA_CHECK(cudaMemset(s.cnt, 0, size_t(slots) * sizeof(unsigned)));
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

template <class Cfg>
void launch(const CUtensorMap& wmap, const CUtensorMap& xmap, const GemmParams& p, int grid, cudaStream_t st) {
  static bool attr_set = [] {
    TW_CUDA_CHECK(cudaFuncSetAttribute(gemm_sm90_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg::kSmemBytes));
    return true;
  }();
  (void)attr_set;
  gemm_sm90_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, st>>>(wmap, xmap, p);
  TW_CUDA_CHECK_LAUNCH();
}

template <int kMPad>
struct Dispatch {
  template <int kKAtoms>
  using Cfg = sm90::MainloopConfig<kMPad, kKAtoms>;
};

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("run_gemm: " + what); }

}  // namespace

bool gemm_sm90_supported() { return device_state().sm90; }

void run_gemm(__nv_bfloat16* Y, const __nv_bfloat16* X, const __nv_bfloat16* W, int M, int N, int K,
              cudaStream_t stream, const GemmOptions& opt) {
  if (M <= 0) bad("M must be >= 1, got " + std::to_string(M));
  if (N <= 0) bad("N must be >= 1, got " + std::to_string(N));
  if (K < 8 || K % 8 != 0) bad("K must be a positive multiple of 8 (TMA row stride), got " + std::to_string(K));
  if (!Y || !X || !W) bad("null pointer (Y, X and W are required)");
  if (reinterpret_cast<uintptr_t>(X) % 16 || reinterpret_cast<uintptr_t>(W) % 16)
    bad("X and W must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(Y) % 2) bad("Y must be 2-byte aligned");
  if (opt.k_atoms < 0 || opt.k_atoms > 2) bad("k_atoms must be 0, 1 or 2");
  if (opt.grid < 0) bad("grid must be >= 0");
  DeviceState& s = device_state();
  if (!s.sm90) bad("needs an sm_90 GPU (H100/H200)");

  const int tiles = (N + kBW - 1) / kBW;
  // The workspace has 4 slots per SM; more CTAs than that buys nothing (one CTA fits per SM).
  const int grid_max = opt.grid > 0 ? std::min(opt.grid, 4 * s.sms) : s.sms;
  ensure_workspace(s, grid_max);
  const CUtensorMap wmap = sm90::make_tensor_map_bf16(W, uint64_t(N), uint64_t(K), kBW);

  for (int m0 = 0; m0 < M; m0 += kMaxMPad) {
    const int m = std::min(M - m0, kMaxMPad);
    const int mpad = m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : m <= 64 ? 64 : m <= 128 ? 128 : 256;
    // Measured default (bench_gemm sweeps k_atoms): see docs/sm90_mainloop.md.
    const int katoms = mpad > 64 ? 1 : (opt.k_atoms ? opt.k_atoms : 1);
    const int bk = 64 * katoms;
    GemmParams p{Y + size_t(m0) * N, s.ws, s.cnt, m, N, (K + bk - 1) / bk, 0};
    p.units = (long long)tiles * p.kst;
    const int grid = int(std::min<long long>(grid_max, p.units));
    const CUtensorMap xmap = sm90::make_tensor_map_bf16(X + size_t(m0) * K, uint64_t(m), uint64_t(K), mpad);
    auto go = [&](auto cfg) { launch<decltype(cfg)>(wmap, xmap, p, grid, stream); };
    switch (mpad * 4 + katoms) {
      case 8 * 4 + 1: go(sm90::MainloopConfig<8, 1>{}); break;
      case 8 * 4 + 2: go(sm90::MainloopConfig<8, 2>{}); break;
      case 16 * 4 + 1: go(sm90::MainloopConfig<16, 1>{}); break;
      case 16 * 4 + 2: go(sm90::MainloopConfig<16, 2>{}); break;
      case 32 * 4 + 1: go(sm90::MainloopConfig<32, 1>{}); break;
      case 32 * 4 + 2: go(sm90::MainloopConfig<32, 2>{}); break;
      case 64 * 4 + 1: go(sm90::MainloopConfig<64, 1>{}); break;
      case 64 * 4 + 2: go(sm90::MainloopConfig<64, 2>{}); break;
      case 128 * 4 + 1: go(sm90::MainloopConfig<128, 1>{}); break;
      default: go(sm90::MainloopConfig<256, 1>{}); break;
    }
  }
}

}  // namespace tw
