// Standalone decode GEMM: Y = X W^T on the sm90 weight-streaming mainloop, persistent grid with
// stream-K balancing. The work is (weight tile of 128 rows) x (K stage) units, tile-major; CTA b of
// G takes the contiguous unit range [b*U/G, (b+1)*U/G), so every CTA streams the same number of
// weight bytes (+-1 stage) and the last wave does not idle. A tile cut by a CTA boundary is summed
// in fp32: each contributor stores its partial to its own workspace slot and is counted on the
// tile's arrival counter; the tile's first CTA (whose part is its last segment) waits for the
// others' count, adds their partials, writes Y and re-zeroes the counter for the next launch, so
// launches need no memset and no second kernel. The wait needs every CTA resident at once (the
// default grid); with more CTAs than fit, the last contributor to arrive sums instead.
//
// No deadlock: a CTA waits only in its last segment, and only for CTAs of higher index, which
// never wait for it (their parts of the tile are their first segments or their whole range).
#include "tileweave/ops/gemm.hpp"

#include <cuda.h>

#include <mutex>
#include <string>

#include "tileweave/kernels/sm90/mainloop.cuh"
#include "tileweave/runtime/grid_dependency.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw {
namespace {

struct GemmParams {
  __nv_bfloat16* y;
  float* ws;          // [2 * G][kSlotFloats] fp32 split-K partials
  unsigned* cnt;      // [G] arrival counters, zero between launches
  int m, n;           // rows of this M slice (<= 256), weight rows
  int kst;            // K stages per tile
  long long units;    // tiles * kst
  int stages;         // ring depth in use (<= Cfg::kStages)
  bool w_evict_first; // L2 policy of the weight copies
  bool skip_mma;      // diagnostic: consumers release stages without computing or storing
  bool skip_epilogue; // diagnostic: consumers compute but store nothing
  bool partials_first; // split segments before whole tiles (see Segments)
  bool head_reduces;   // every CTA is resident at once: a split tile's first CTA sums it (below)
};

// Split-K partial slot: the largest fragment set, 128 fp32 per consumer thread x 256 threads.
constexpr long long kSlotFloats = 128 * 256;

#if TW_SM90_ENABLED
// A split tile's arrival count, read with acquire (the partials counted are visible after it).
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// First unit of CTA i: CTAs own [bnd(i), bnd(i+1)).
__device__ __forceinline__ long long bnd(long long i, long long units, int g) { return i * units / g; }
__device__ __forceinline__ int owner(long long u, long long units, int g) {
  int i = int(u * g / units);
  while (i + 1 < g && bnd(i + 1, units, g) <= u) ++i;
  while (bnd(i, units, g) > u) --i;
  return i;
}

// The tiles a CTA touches, [u_begin, u_end) cut at tile boundaries. With partials_first, the (at
// most two) split segments go first and the whole tiles after them, so a CTA's last piece of work
// is a plain store rather than a split-K reduction chain (the launch's tail).
struct Segment {
  int t, k0, n;
};
struct Segments {
  long long u0, u1;
  int kst, t0, t1, count;
  bool part0, part1;
  __device__ Segments(long long ub, long long ue, int k, bool partials_first) : u0(ub), u1(ue), kst(k) {
    t0 = int(ub / k);
    t1 = int((ue - 1) / k);
    count = t1 - t0 + 1;
    part0 = partials_first && (ub > (long long)t0 * k || ue < (long long)(t0 + 1) * k);
    part1 = partials_first && t1 != t0 && ue < (long long)(t1 + 1) * k;
  }
  __device__ Segment operator[](int i) const {
    const int np = int(part0) + int(part1);
    const int t = i < np ? (i == 0 && part0 ? t0 : t1) : t0 + int(part0) + (i - np);
    const long long lo = max(u0, (long long)t * kst), hi = min(u1, (long long)(t + 1) * kst);
    return {t, int(lo - (long long)t * kst), int(hi - lo)};
  }
};
#endif

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap xmap, GemmParams p) {
#if TW_SM90_ENABLED
  using namespace sm90;
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint32_t polled;  // the split-K poll's verdict (below)
  const Ring<Cfg> ring = Ring<Cfg>::carve(smem);
  if (threadIdx.x == 0) {
    ring.init();
    tma_prefetch_desc(&wmap);
    tma_prefetch_desc(&xmap);
    runtime::allow_next_launch();  // a launch made to overlap this one takes only SMs we leave
  }
  __syncthreads();

  const int g = gridDim.x;
  const long long u_begin = bnd(blockIdx.x, p.units, g), u_end = bnd(blockIdx.x + 1, p.units, g);
  const int warp = threadIdx.x / 32;

  if (warp < 4) {
    // Producer warpgroup: one thread issues every copy; the registers go to the consumers.
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      const StreamSrc src{&wmap, &xmap, p.w_evict_first ? l2_evict_first() : l2_evict_normal(), l2_evict_last()};
      PipeState<Cfg> ps;
      ps.count = p.stages;
      const Segments sg(u_begin, u_end, p.kst, p.partials_first);
      // In a launch that overlaps the kernel before (GemmOptions::overlap_previous), the first
      // ring's worth of weights goes out before the wait for that kernel, X after it. (The wait
      // returns at once for later segments; one instantiation of produce_tile keeps the producer
      // within its 40 registers -- two spilled.)
      for (int i = 0; i < sg.count; ++i) {
        const Segment s = sg[i];
        produce_tile(ring, ps, src, s.t * Cfg::kBW, 0, s.k0, s.n, [] { runtime::grid_dependency_wait(); });
      }
    } else if (warp == 1 && p.head_reduces && !p.skip_mma && !p.skip_epilogue) {
      runtime::grid_dependency_wait();  // the counters, after the kernel before
      // Counts the partials this CTA leaves for other CTAs to sum (at most one: a CTA's first
      // segment), so the consumers never wait on a fence or an atomic for them.
      const Segments sg(u_begin, u_end, p.kst, p.partials_first);
      for (int i = 0; i < sg.count; ++i) {
        const Segment s = sg[i];
        const int first = owner((long long)s.t * p.kst, p.units, g);
        if (s.n == p.kst || first == int(blockIdx.x)) continue;
        named_bar_sync(2, 128 * Cfg::kConsumerWGs + 32);  // the consumers' partial is written
        if (threadIdx.x == 32) {
          asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // cumulative: the whole partial
          atomicAdd(p.cnt + first + 1, 1u);
        }
      }
    }
  } else {
    setmaxnreg_inc<232>();
    runtime::grid_dependency_wait();  // Y, the workspace and the counters, after the kernel before
    const int wg = warp / 4 - 1, tid = threadIdx.x % 128;
    PipeState<Cfg> ps;
    ps.count = p.stages;
    if (p.skip_mma) {  // diagnostic: the load stream alone, at the same ring protocol
      for (long long j = u_begin; j < u_end; ++j) {
        mbar_wait(&ring.full[ps.stage], ps.phase, "full");
        if (threadIdx.x % 32 == 0) mbar_arrive(&ring.empty[ps.stage]);
        ps.advance();
      }
      return;
    }
    float acc[Cfg::kAcc];
    const Segments sg(u_begin, u_end, p.kst, p.partials_first);
    for (int si = 0; si < sg.count; ++si) {
      const Segment seg = sg[si];
      const int t = seg.t, n = seg.n;
      // A split tile's contributors and counter (the CTA boundary inside it: unique per tile).
      const long long tb = (long long)t * p.kst;
      const int first = owner(tb, p.units, g), last = owner(tb + p.kst - 1, p.units, g);
      const int counter = first + 1;
      // The head of a split tile (this CTA's last segment, whose other parts the next CTAs run)
      // sums it. One thread reads, before the math, how many of the others have arrived
      // (acquire): the CTA after this one runs its part first, so it has usually arrived, and the
      // load's round trip hides under the segment's stream.
      // - head_reduces (all CTAs resident): the head always sums the tile, waiting for the others
      //   if it must; the others store their partial and go on (warp 1 counts it for them).
      // - Otherwise the head of a tile with exactly two contributors sums it if the other has
      //   arrived (no store, fence or count of its own); else every contributor stores and
      //   counts, and the last to arrive sums. (Polling every split segment cost 3% on the 70B
      //   down GEMM at M = 128, whose tiles span 3-4 CTAs that all end together.)
      const bool head = n != p.kst && first == int(blockIdx.x) && !p.skip_epilogue;
      const bool poll = head && (p.head_reduces || last == first + 1);
      unsigned arrived = 0;
      if (poll && threadIdx.x == 128) arrived = load_acquire(p.cnt + counter);
      consume_tile(ring, ps, wg, n, acc);
      if (p.skip_epilogue) continue;  // diagnostic
      const int w0 = t * Cfg::kBW;
      if (n == p.kst) {  // whole K range here: store bf16 directly
#pragma unroll
        for (int i = 0; i < Cfg::kAcc; ++i) {
          const AccCoord c = acc_coord<Cfg>(wg, tid, i);
          if (w0 + c.w_row < p.n && c.act_row < p.m)
            p.y[(long long)c.act_row * p.n + w0 + c.w_row] = __float2bfloat16_rn(acc[i]);
        }
        continue;
      }
      // Split tile. Each contributor stores its fp32 partial with plain coalesced stores into its
      // own slot, in fragment order (register pair q of consumer thread ct at q*256 + ct: a warp
      // writes 256 contiguous bytes), then arrives on the tile's counter; the last to arrive adds
      // the others' slots to its registers and writes Y. (fp32 atomics into one shared slot were
      // measured 15-75 us per split tile at M = 64..256: L2 atomic throughput.) A CTA has at most
      // two split segments, its first and its last tile: slot 2*cta + (first ? 0 : 1).
      const int ct = threadIdx.x - 128;
      auto slot_of = [&](int cta) {
        return p.ws + (2ll * cta + (bnd(cta, p.units, g) / p.kst == t ? 0 : 1)) * kSlotFloats;
      };
      auto store_partial = [&] {
        float2* mine = reinterpret_cast<float2*>(slot_of(blockIdx.x));
#pragma unroll
        for (int q = 0; q < Cfg::kAcc / 2; ++q) __stcg(mine + q * 256 + ct, make_float2(acc[2 * q], acc[2 * q + 1]));
      };
      if (p.head_reduces && !head) {
        store_partial();
        named_bar_arrive(2, 128 * Cfg::kConsumerWGs + 32);  // warp 1 fences and counts it
        continue;
      }
      if (p.head_reduces && threadIdx.x == 128) {
        // Every CTA is resident and the others never wait: they arrive. Bounded like the ring's
        // waits (a protocol bug traps instead of hanging).
        const long long t0 = clock64();
        while (arrived != unsigned(last - first)) {
          arrived = load_acquire(p.cnt + counter);
          if (clock64() - t0 > TW_SM90_SPIN_LIMIT_CYCLES) __trap();
        }
      }
      bool others_done = p.head_reduces;
      if (poll && !p.head_reduces) {  // at most one per CTA and launch: `polled` is written once
        if (threadIdx.x == 128) polled = arrived == 1u;
        named_bar_sync(1, 128 * Cfg::kConsumerWGs);
        others_done = polled;
      }
      if (p.head_reduces) named_bar_sync(1, 128 * Cfg::kConsumerWGs);  // thread 128 saw them arrive
      if (!others_done) {
        store_partial();
        // Release: the partial is visible GPU-wide before the arrival (fence.acq_rel, not fence.sc).
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
        named_bar_sync(1, 128 * Cfg::kConsumerWGs);
        if (threadIdx.x == 128) {
          *ring.flag = atomicAdd(p.cnt + counter, 1u) == unsigned(last - first);
          asm volatile("fence.acq_rel.gpu;\n" ::: "memory");  // acquire: the others' partials
        }
        named_bar_sync(1, 128 * Cfg::kConsumerWGs);
        if (!*reinterpret_cast<volatile uint32_t*>(ring.flag)) continue;
      }
      asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
      for (int c = first; c <= last; ++c) {
        if (c == int(blockIdx.x)) continue;
        const float2* other = reinterpret_cast<const float2*>(slot_of(c));
#pragma unroll
        for (int q = 0; q < Cfg::kAcc / 2; ++q) {
          const float2 v = __ldcg(other + q * 256 + ct);  // L2: not this SM's stale L1
          acc[2 * q] += v.x;
          acc[2 * q + 1] += v.y;
        }
      }
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) {
        const AccCoord c = acc_coord<Cfg>(wg, tid, i);
        if (w0 + c.w_row < p.n && c.act_row < p.m)
          p.y[(long long)c.act_row * p.n + w0 + c.w_row] = __float2bfloat16_rn(acc[i]);
      }
      if (threadIdx.x == 128) p.cnt[counter] = 0;  // ready for the next launch
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
  static DeviceState states[64];  // fixed: references stay valid
  int dev = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64) throw CudaError("run_gemm: device index out of range");
  std::lock_guard<std::mutex> lock(mu);
  DeviceState& s = states[dev];
  if (s.sms == 0) {
    cudaDeviceProp prop{};
    TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    s.sms = prop.multiProcessorCount;
    s.sm90 = prop.major == 9;
  }
  return s;
}

constexpr int kMaxMPad = 256;
constexpr int kMaxCtasPerSm = 2;  // grid cap: one CTA fits per SM, so more only helps tests

// Workspace: 2 partial slots per CTA and one counter per CTA, for kMaxCtasPerSm CTAs per SM;
// allocated once per device, counters zeroed (the kernel leaves them zero).
void ensure_workspace(DeviceState& s) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (s.ws) return;
  const size_t ctas = size_t(s.sms) * kMaxCtasPerSm;
  TW_CUDA_CHECK(cudaMalloc(&s.ws, 2 * ctas * kSlotFloats * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&s.cnt, ctas * sizeof(unsigned)));
  TW_CUDA_CHECK(cudaMemset(s.cnt, 0, ctas * sizeof(unsigned)));
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

struct Slice {
  __nv_bfloat16* y;
  const __nv_bfloat16* x;
  const __nv_bfloat16* w;
  int m, n, k;
};

template <class Cfg>
void run_cfg(const Slice& sl, const DeviceState& s, int grid_max, const GemmOptions& opt, cudaStream_t st) {
  static_assert(Cfg::kAcc * 128 * Cfg::kConsumerWGs <= kSlotFloats, "workspace slot too small");
  static bool attr_set = [] {
    TW_CUDA_CHECK(cudaFuncSetAttribute(gemm_sm90_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg::kSmemBytes));
    return true;
  }();
  (void)attr_set;
  const CUtensorMap wmap = sm90::make_tensor_map_bf16(sl.w, uint64_t(sl.n), uint64_t(sl.k), Cfg::kBW,
                                                       opt.weights_promote_256);
  const CUtensorMap xmap = sm90::make_tensor_map_bf16(sl.x, uint64_t(sl.m), uint64_t(sl.k), Cfg::kMPad);
  GemmParams p{};
  p.y = sl.y;
  p.ws = s.ws;
  p.cnt = s.cnt;
  p.m = sl.m;
  p.n = sl.n;
  p.kst = (sl.k + Cfg::kBK - 1) / Cfg::kBK;
  p.units = (long long)((sl.n + Cfg::kBW - 1) / Cfg::kBW) * p.kst;
  p.stages = opt.stages > 0 ? std::min(opt.stages, Cfg::kStages) : Cfg::kStages;
  p.w_evict_first = opt.weights_evict_first;
  p.skip_mma = opt.skip_mma;
  p.skip_epilogue = opt.skip_epilogue;
  p.partials_first = opt.partials_first;
  const int grid = int(std::min<long long>(grid_max, p.units));
  // A split tile's head waits for its other CTAs only when all CTAs are resident at once (and it
  // runs its head last: with partials first it would wait out the launch).
  static const int resident_per_sm = [] {
    int n = 0;
    TW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gemm_sm90_kernel<Cfg>, Cfg::kThreads, Cfg::kSmemBytes));
    return n;
  }();
  p.head_reduces = !opt.partials_first && grid <= resident_per_sm * s.sms;
  runtime::launch_kernel(gemm_sm90_kernel<Cfg>, dim3(grid), dim3(Cfg::kThreads), Cfg::kSmemBytes, st,
                         opt.overlap_previous, wmap, xmap, p);
}

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
  if (opt.tile_rows != 0 && opt.tile_rows != 128 && opt.tile_rows != 256) bad("tile_rows must be 0, 128 or 256");
  if (opt.stages != 0 && opt.stages < 3) bad("stages must be 0 or >= 3");
  if (opt.grid < 0) bad("grid must be >= 0");
  DeviceState& s = device_state();
  if (!s.sm90) bad("needs an sm_90 GPU (H100/H200)");
  ensure_workspace(s);
  const int grid_max = opt.grid > 0 ? std::min(opt.grid, kMaxCtasPerSm * s.sms) : s.sms;

  for (int m0 = 0; m0 < M; m0 += kMaxMPad) {
    const Slice sl{Y + size_t(m0) * N, X + size_t(m0) * K, W, std::min(M - m0, kMaxMPad), N, K};
    const int mpad = sl.m <= 8 ? 8 : sl.m <= 16 ? 16 : sl.m <= 32 ? 32 : sl.m <= 64 ? 64 : sl.m <= 128 ? 128 : 256;
    // Defaults measured on the H200 (bench_gemm sweeps the knobs; bench/results/h200/gemm.json):
    // 128-row tiles everywhere (256 was slower at every M once split-K stopped using atomics),
    // two 64-column atoms per stage at M <= 64 (best in all 16 cases, 1-10% over one atom).
    int rows = opt.tile_rows ? opt.tile_rows : 128;
    if (mpad > 128) rows = 128;  // 256 rows x 256 activation rows would need 256 accumulators
    int katoms = opt.k_atoms ? opt.k_atoms : (mpad <= 64 ? 2 : 1);
    if (mpad > 64 || rows == 256) katoms = 1;  // two atoms would leave < 4 stages
    auto go = [&](auto cfg) { run_cfg<decltype(cfg)>(sl, s, grid_max, opt, stream); };
    using namespace sm90;
    if (rows == 256) {
      switch (mpad) {
        case 8: go(MainloopConfig<8, 1, 2>{}); break;
        case 16: go(MainloopConfig<16, 1, 2>{}); break;
        case 32: go(MainloopConfig<32, 1, 2>{}); break;
        case 64: go(MainloopConfig<64, 1, 2>{}); break;
        default: go(MainloopConfig<128, 1, 2>{}); break;
      }
      continue;
    }
    switch (mpad * 4 + katoms) {
      case 8 * 4 + 1: go(MainloopConfig<8, 1>{}); break;
      case 8 * 4 + 2: go(MainloopConfig<8, 2>{}); break;
      case 16 * 4 + 1: go(MainloopConfig<16, 1>{}); break;
      case 16 * 4 + 2: go(MainloopConfig<16, 2>{}); break;
      case 32 * 4 + 1: go(MainloopConfig<32, 1>{}); break;
      case 32 * 4 + 2: go(MainloopConfig<32, 2>{}); break;
      case 64 * 4 + 1: go(MainloopConfig<64, 1>{}); break;
      case 64 * 4 + 2: go(MainloopConfig<64, 2>{}); break;
      case 128 * 4 + 1: go(MainloopConfig<128, 1>{}); break;
      default: go(MainloopConfig<256, 1>{}); break;
    }
  }
}

}  // namespace tw
