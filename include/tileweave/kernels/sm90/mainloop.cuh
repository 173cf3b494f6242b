// The Hopper weight-streaming mainloop ("swap A/B"): for one output tile of kBW = 128 or 256 weight
// rows x all M <= 256 activation rows, over a range of K, wgmma computes D[w_row][act_row] with the
// WEIGHT tile as the 64-row A operand (each consumer warpgroup owns 1 or 2 blocks of 64 rows) and the activation
// slice as B with N = kMPad (M rounded up; the extra rows are zero-filled by TMA). So decode
// batches of 1..256 use the tensor cores without padding M to 64, and the weight stream -- the
// only large byte stream -- is read exactly once.
//
// Roles (one CTA = 1 producer warpgroup + 2 consumer warpgroups, __launch_bounds__(384, 1)):
//   producer: one thread issues TMA copies into a ring of kStages shared-memory stages; each stage
//     holds kKAtoms 64-column slices of the weight tile (kBW x 64 bf16, 16 or 32 KiB) and of the
//     activation slice (kMPad x 64). full[s] completes when all bytes of stage s landed (one
//     arrive.expect_tx of the whole stage + TMA complete_tx); empty[s] completes when every
//     consumer warp has finished the wgmmas that read stage s.
//   consumers: wait full[s], issue kKAtoms*4 wgmma k16 steps, keep one stage's wgmmas in flight
//     (wait_group 1) and release the stage before it.
// The ring runs on across tiles: the producer walks its tile sequence without waiting for the
// consumers' epilogues, so the next tile's weights stream while the current tile is stored
// (cross-tile prefetch).
//
// Dependency protocol for the executor (produce_tile's wait_deps):
//   1. the weight copies of the first min(kStages, n) stages of the tile are issued first (they
//      depend on nothing); each of those stages was armed with the FULL stage byte count, so it
//      cannot complete before its activation copy lands too;
//   2. wait_deps() runs in the producer thread: it spins with ld.acquire.gpu on the producers'
//      counters;
//   3. fence.proxy.async.global: the activations were written by other CTAs with ordinary
//      (generic-proxy) stores and are about to be read by TMA (async proxy); the acquire orders
//      them for this thread's generic view only, the proxy fence extends that to its TMA reads.
//      (The writer should likewise run fence.proxy.async.global after its stores and before its
//      release, which is cheap and makes the pairing explicit.)
//   4. the activation copies of those stages are issued, then the rest of the tile streams both.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "tileweave/kernels/sm90/arch.cuh"
#include "tileweave/kernels/sm90/tma.cuh"
#include "tileweave/kernels/sm90/wgmma.cuh"

namespace tw::sm90 {

constexpr int kMaxDynSmem = 232448;  // 227 KiB: the sm_90 per-block opt-in limit

template <int kMPad_, int kKAtoms_, int kMBlocks_ = 1, int kStagesMax_ = 16>
struct MainloopConfig {
  static_assert(kMPad_ % 8 == 0 && kMPad_ >= 8 && kMPad_ <= 256, "wgmma N is 8..256 in steps of 8");
  static_assert(kMBlocks_ == 1 || kMBlocks_ == 2, "64-row blocks per consumer warpgroup: 1 or 2");
  static constexpr int kMPad = kMPad_;    // wgmma N = activation rows per tile
  static constexpr int kKAtoms = kKAtoms_;  // 64-column swizzle atoms per stage
  static constexpr int kMBlocks = kMBlocks_;  // 64-row weight blocks per consumer warpgroup
  static constexpr int kConsumerWGs = 2;
  // Weight rows per tile. 256 (kMBlocks = 2) halves the activation bytes read from L2 per weight
  // byte -- each activation stage feeds twice the weight rows -- at the cost of 2x accumulators.
  static constexpr int kBW = 64 * kConsumerWGs * kMBlocks;
  static constexpr int kThreads = 128 * (1 + kConsumerWGs);
  static constexpr int kConsumerWarps = 4 * kConsumerWGs;
  static constexpr int kBK = 64 * kKAtoms;  // K per stage
  static constexpr int kWAtomBytes = kBW * 128;
  static constexpr int kXAtomBytes = kMPad * 128;
  static constexpr int kStageBytes = kKAtoms * (kWAtomBytes + kXAtomBytes);
  // As many stages as fit: bytes in flight per SM are what reach the DRAM floor
  // (DESIGN.md: 4 x 16 KiB bulk copies in flight per SM already read at 4.68 TB/s).
  static constexpr int kStagesFit = (kMaxDynSmem - 1024 - 512) / kStageBytes;
  static constexpr int kStages = kStagesFit < kStagesMax_ ? kStagesFit : kStagesMax_;
  static_assert(kStages >= 3, "ring needs >= 3 stages");
  static constexpr int kAccBlock = kMPad / 2;       // fp32 accumulators per thread per 64-row block
  static constexpr int kAcc = kMBlocks * kAccBlock;  // per consumer thread
  static_assert(kAcc <= 128, "accumulators must fit the consumers' 232 registers");
  // Dynamic shared memory to request: stages, barriers, slack to align the base to 1024 B.
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + 2 * kStages * 8 + 16;
};

#if TW_SM90_ENABLED

// The shared-memory ring, carved from dynamic shared memory.
template <class Cfg>
struct Ring {
  uint8_t* base;   // kStages * kStageBytes, 1024-B aligned (SW128 tiles need it)
  uint64_t* full;  // [kStages]
  uint64_t* empty; // [kStages]
  uint32_t* flag;  // one word of scratch for the caller's epilogue (e.g. a split-K "last" flag)

  __device__ static Ring carve(uint8_t* dyn_smem) {
    Ring r;
    // Pointer arithmetic, not a round trip through an integer: the compiler then still sees the slots
    // as shared memory, and reads through them compile to LDS, not generic LD.E.
    // (The pad from the shared-window address: from the generic one, the compiler re-derived the
    // window's base in the producer's loops, and the GEMM producer's 40 registers spilled.)
    r.base = dyn_smem + ((1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(dyn_smem)) & 1023u)) & 1023u);
    r.full = reinterpret_cast<uint64_t*>(r.base + Cfg::kStages * Cfg::kStageBytes);
    r.empty = r.full + Cfg::kStages;
    r.flag = reinterpret_cast<uint32_t*>(r.empty + Cfg::kStages);
    return r;
  }
  // One thread, then a CTA-wide barrier before any use.
  __device__ void init() const {
    for (int s = 0; s < Cfg::kStages; ++s) {
      mbar_init(&full[s], 1);                     // the producer's arrive.expect_tx
      mbar_init(&empty[s], Cfg::kConsumerWarps);  // one arrive per consumer warp
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // visible to the async proxy
  }
  __device__ uint8_t* w_atom(int s, int a) const { return base + s * Cfg::kStageBytes + a * Cfg::kWAtomBytes; }
  __device__ uint8_t* x_atom(int s, int a) const {
    return base + s * Cfg::kStageBytes + Cfg::kKAtoms * Cfg::kWAtomBytes + a * Cfg::kXAtomBytes;
  }
};

// Position in the ring; producer and consumers each keep one and advance it identically.
// `count` (<= kStages, the same on both sides) lets a caller run a shallower ring than fits.
template <class Cfg>
struct PipeState {
  int stage = 0;
  uint32_t phase = 0;
  int count = Cfg::kStages;
  __device__ void advance() {
    if (++stage == count) {
      stage = 0;
      phase ^= 1;
    }
  }
  // The position n >= 0 stages on (advance n times).
  __device__ PipeState ahead(int n) const {
    PipeState r = *this;
    r.stage = (stage + n) % count;
    r.phase = phase ^ uint32_t(((stage + n) / count) & 1);
    return r;
  }
};

// What the producer streams: tensor maps (kernel parameters, __grid_constant__) and L2 policies.
struct StreamSrc {
  const CUtensorMap* w;  // weights [N_out][K], box 128 x 64
  const CUtensorMap* x;  // activations [M][K], box kMPad x 64
  uint64_t w_policy, x_policy;
};

// ---- producer (one thread) ----

// Claims the next free stage and arms its full barrier with the whole stage's bytes.
template <class Cfg>
__device__ __forceinline__ int producer_acquire(const Ring<Cfg>& ring, PipeState<Cfg>& ps) {
  const int s = ps.stage;
  // A fresh barrier counts as having completed the phase before phase 0: the first pass is free.
  mbar_wait(&ring.empty[s], ps.phase ^ 1, "empty");
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &ring.full[s],
                                 uint32_t(Cfg::kStageBytes));
  ps.advance();
  return s;
}
template <class Cfg>
__device__ __forceinline__ void issue_w(const Ring<Cfg>& ring, int s, const StreamSrc& src, int w_row0, int kst) {
#pragma unroll
  for (int a = 0; a < Cfg::kKAtoms; ++a)
    tma_load_2d(ring.w_atom(s, a), src.w, kst * Cfg::kBK + 64 * a, w_row0, &ring.full[s], src.w_policy);
}
template <class Cfg>
__device__ __forceinline__ void issue_x(const Ring<Cfg>& ring, int s, const StreamSrc& src, int x_row0, int kst) {
#pragma unroll
  for (int a = 0; a < Cfg::kKAtoms; ++a)
    tma_load_2d(ring.x_atom(s, a), src.x, kst * Cfg::kBK + 64 * a, x_row0, &ring.full[s], src.x_policy);
}

struct NoDeps {
  __device__ void operator()() const {}
};

// Streams one tile: weight rows [w_row0, w_row0 + 128), activation rows [x_row0, x_row0 + kMPad),
// K stages [kst0, kst0 + n) of kBK columns (n >= 1). Weights of the first min(n, kStages) stages go
// out before wait_deps() (see the protocol at the top); call it again for the next tile at once.
template <class Cfg, class WaitDeps = NoDeps>
__device__ void produce_tile(const Ring<Cfg>& ring, PipeState<Cfg>& ps, const StreamSrc& src, int w_row0, int x_row0,
                             int kst0, int n, WaitDeps&& wait_deps = {}) {
  const int pre = n < ps.count ? n : ps.count;
  const int s0 = ps.stage;
  for (int j = 0; j < pre; ++j) issue_w(ring, producer_acquire(ring, ps), src, w_row0, kst0 + j);
  if constexpr (!std::is_same_v<std::decay_t<WaitDeps>, NoDeps>) {
    wait_deps();
    ptx::fence_proxy_async(ptx::space_global);
  }
  for (int j = 0, s = s0; j < pre; ++j, s = (s + 1 == ps.count ? 0 : s + 1)) issue_x(ring, s, src, x_row0, kst0 + j);
  for (int j = pre; j < n; ++j) {
    const int s = producer_acquire(ring, ps);
    issue_w(ring, s, src, w_row0, kst0 + j);
    issue_x(ring, s, src, x_row0, kst0 + j);
  }
}

// ---- consumers (each consumer warpgroup, all 128 threads) ----

// One stage's wgmmas, committed and not waited for: acc (+)= W[this warpgroup's kMBlocks x 64 rows] *
// X^T of stage s (overwritten unless `accumulate`). wg = consumer warpgroup index (0 or 1).
template <class Cfg>
__device__ __forceinline__ void mma_stage(const Ring<Cfg>& ring, int s, int wg, float (&acc)[Cfg::kAcc], bool accumulate) {
  fence_operands(acc);
  wgmma_fence();
#pragma unroll
  for (int a = 0; a < Cfg::kKAtoms; ++a) {
    const uint64_t db = make_desc_sw128(ring.x_atom(s, a));
#pragma unroll
    for (int k = 0; k < 4; ++k)  // 4 x k16 = one 128-B swizzle row; +32 B per step
#pragma unroll
      for (int mb = 0; mb < Cfg::kMBlocks; ++mb) {
        const uint64_t da = make_desc_sw128(ring.w_atom(s, a) + (wg * Cfg::kMBlocks + mb) * 64 * 128);
        Wgmma<Cfg::kMPad>::mma(*reinterpret_cast<float(*)[Cfg::kAccBlock]>(acc + mb * Cfg::kAccBlock),
                               desc_add(da, 32 * k), desc_add(db, 32 * k), accumulate || (a | k) != 0);
      }
  }
  wgmma_commit();
  fence_operands(acc);
}

// acc = sum over n stages of W[this warpgroup's kMBlocks x 64 rows] * X^T (overwritten; added to
// with `accumulate`: the next K slice of the same output tile).
template <class Cfg>
__device__ __forceinline__ void consume_tile(const Ring<Cfg>& ring, PipeState<Cfg>& ps, int wg, int n,
                                             float (&acc)[Cfg::kAcc], bool accumulate = false) {
  const bool release_lane = (threadIdx.x % 32) == 0;
  int prev = -1;
  for (int j = 0; j < n; ++j) {
    const int s = ps.stage;
    mbar_wait(&ring.full[s], ps.phase, "full");
    mma_stage(ring, s, wg, acc, accumulate || j != 0);
    // Keep this stage's wgmmas in flight; the previous stage's are done once at most 1 is pending.
    wgmma_wait<1>();
    fence_operands(acc);
    if (prev >= 0 && release_lane) mbar_arrive(&ring.empty[prev]);
    prev = s;
    ps.advance();
  }
  wgmma_wait<0>();
  fence_operands(acc);
  if (release_lane) mbar_arrive(&ring.empty[prev]);
}

// Where accumulator i of consumer thread t (0..127 within its warpgroup) lives in the tile.
// acc[mb * kAccBlock + j] is 64-row block mb of the warpgroup; within a block, wgmma's m64nN fp32
// fragment: warp w owns rows 16w..16w+15; per 8-column chunk q, registers 4q..4q+3 hold (r, c),
// (r, c+1), (r+8, c), (r+8, c+1) with r = lane/4, c = 8q + 2*(lane%4). Registers i and i+1
// (i even) are adjacent activation rows of the same weight row.
struct AccCoord {
  int w_row;    // 0..kBW-1 within the tile
  int act_row;  // 0..kMPad-1
};
template <class Cfg>
__device__ __forceinline__ AccCoord acc_coord(int wg, int t, int i) {
  const int lane = t % 32, warp = t / 32, mb = i / Cfg::kAccBlock, j = i % Cfg::kAccBlock;
  return {(wg * Cfg::kMBlocks + mb) * 64 + warp * 16 + lane / 4 + 8 * ((j >> 1) & 1),
          8 * (j >> 2) + 2 * (lane % 4) + (j & 1)};
}

// ---- split-K partial sums in the consumers' fragment order ----
// A tile split over K slices keeps one fp32 block per output tile, laid out so that a consumer thread's
// accumulators q = 0, 1, ... are float4 q * kConsumerThreads + ct: a warp's vector reductions cover 512
// contiguous bytes. Every slice adds into it (fire-and-forget vector reductions); the slice that arrives
// last takes the sums and leaves the block zero for the next launch.
template <class Cfg>
__device__ __forceinline__ void add_split_partials(float4* block, const float (&acc)[Cfg::kAcc], int ct) {
  constexpr int kThreads = 128 * Cfg::kConsumerWGs;
#pragma unroll
  for (int q = 0; q < Cfg::kAcc / 4; ++q)
    asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"l"(block + q * kThreads + ct), "f"(acc[4 * q]),
                 "f"(acc[4 * q + 1]), "f"(acc[4 * q + 2]), "f"(acc[4 * q + 3])
                 : "memory");
}
// The last slice, after its acquire: the sums into acc, the block re-zeroed. All loads before any store:
// a store between two loads would serialise one L2 round trip per load (the compiler cannot move loads
// past stores it cannot disambiguate; measured 15% on the FFN at M = 64).
// kAdd: acc holds this slice's own part, which it did not add to the block (the split's finisher,
// FfnOptions::split_finisher): the sums are added to it.
template <class Cfg, bool kAdd = false>
__device__ __forceinline__ void take_split_sums(float4* block, float (&acc)[Cfg::kAcc], int ct) {
  constexpr int kThreads = 128 * Cfg::kConsumerWGs;
  // No fence here: the arrival's acquire (one thread) and the barrier after it order these loads after
  // every other slice's release (the barrier synchronises, and causality order is transitive), as a
  // split-K semaphore's single-thread acquire does. The per-thread fence.acq_rel.gpu it replaces sat on
  // the tile's critical path (decode step, qkv: arrival to sums 0.5 -> 0.3 us in the timelines).
#pragma unroll
  for (int q = 0; q < Cfg::kAcc / 4; ++q) {
    const float4 v = __ldcg(block + q * kThreads + ct);
    if constexpr (kAdd) acc[4 * q] += v.x, acc[4 * q + 1] += v.y, acc[4 * q + 2] += v.z, acc[4 * q + 3] += v.w;
    else acc[4 * q] = v.x, acc[4 * q + 1] = v.y, acc[4 * q + 2] = v.z, acc[4 * q + 3] = v.w;
  }
#pragma unroll
  for (int q = 0; q < Cfg::kAcc / 4; ++q) __stcg(block + q * kThreads + ct, make_float4(0.f, 0.f, 0.f, 0.f));
}

#endif  // TW_SM90_ENABLED

}  // namespace tw::sm90
