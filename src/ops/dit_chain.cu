// The attention half of a DiT block on the tile executor (ops/dit_attention_chain.hpp): one persistent
// kernel whose tickets are the chain's tiles, each run by its op kind.
//
// Roles (384 threads, one CTA per SM). Warp 0 is the executor: it takes tickets in schedule order,
// hands each tile to the consumers through a small queue, and streams the tile's operands with TMA.
// The two consumer warpgroups run the tile: 64 of its 128 rows each.
//   - GEMM tiles (the QKV projection, the output projection): 128 rows x 256 columns (two heads of
//     q|k|v, graph/dit_graph.hpp), K in 64-column stages through a ring (A: rows of x or of the
//     attention's output, B: rows of the weight; wgmma m64n256k16, both K-major). The QKV epilogue
//     adds the bias, then on q and k heads the head's RMSNorm (a quad of threads holds a row's
//     columns: one shuffle pair sums a head's squares) and RoPE (both elements of every rotation pair
//     sit in one thread, for the rotate-half and the interleaved form alike); the bf16 outputs leave
//     through a staging buffer by TMA stores.
//   - Attention items: the prefill kernel's tile body (prefill_load_item / prefill_attend_item): Q
//     once, K and V tiles of 160 keys through their own rings, the online softmax of one key tile
//     under the PV GEMM of the one before.
// Shared memory: the two bodies' buffers are one 192 KiB region (the GEMM ring's four 48 KiB stages;
// Q and two stages of K and V). Switching bodies, the producer first waits until the consumers have
// released every stage of the other body's last round (`drain`): each slot's last use is a phase of
// its empty barrier, and waiting for a completed phase again returns at once, so a later wait for
// the same release (the slot's next use) is unaffected. No deadlock: the consumers release those
// stages by finishing tiles queued before this one, which wait on nothing the producer holds back.
//
// Dependencies are the executor's tile counters (runtime/executor.cuh), per tile: an attention item
// waits for its Q tile and every K and V tile of its head, an output tile for the attention items of
// its rows. Produced data is read by TMA: writers fence the async proxy before they release, the
// producer fences it after its acquire.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "ffn_sm90.hpp"  // check_operand
#include "tileweave/kernels/attention/prefill_sm90.cuh"
#include "tileweave/ops/dit_attention_chain.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/runtime/device_plan.hpp"
#include "tileweave/runtime/exec_plan.hpp"
#include "tileweave/runtime/executor.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw {
namespace dit_chain {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kHeadDim = 128;
using AttnCfg = kernels::PrefillConfig<kHeadDim, 160, 2, false>;  // prefill_block_n / _m of the chain's shape
using AttnSmem = kernels::PrefillSmem<AttnCfg>;
constexpr int kThreads = 384, kConsumers = 256;
constexpr int kHeadsPerTile = kDitHeadsPerTile;
constexpr int kTileM = 128, kTileN = kHeadsPerTile * kHeadDim, kStageK = 64;  // a GEMM tile; K stages of 64 columns
constexpr int kABytes = kTileM * kStageK * 2, kBBytes = kTileN * kStageK * 2;  // a stage's A (16 KiB) and B (32 KiB)
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kAcc = kTileN / 2;                    // accumulators a consumer thread (m64nN)
constexpr int kRegionBytes = AttnSmem::kDataBytes;  // 192 KiB
constexpr int kStages = kRegionBytes / kStageBytes;  // 4
static_assert(kStages >= 2 && kStageBytes % 1024 == 0, "a GEMM ring in the attention's region, stages 1024-B aligned");
constexpr int kQueue = 4;
constexpr uint32_t kConsumerBar = 3;  // named barriers 1 and 2 are the attention's turns (prefill_sm90.cuh)

// The graph's ops (build_dit_attention_graph adds them in this order).
enum Kind : int32_t { kQkvTile = 0, kAttentionTile = 1, kOutTile = 2 };

struct Maps {
  CUtensorMap x, w_qkv, attn, w_o;  // boxes of 128 (activations) or 256 (weights) rows x 64 columns
  CUtensorMap q, k, v;              // heads of q|k|v: boxes of 128 (q) or 160 (k, v) rows of one head
  CUtensorMap qkv_out, y_out;       // the GEMMs' outputs, stored in boxes of 128 rows x 64 columns
};

struct Params {
  runtime::ExecParams ep;
  kernels::PrefillParams attn;  // the attention's items; out = the attention's output [L, W]
  const bf16 *qkv_bias, *o_bias, *q_norm, *k_norm;
  const float* rope;  // [L, D]
  int32_t tokens, heads, k_stages;
  float eps;
  int32_t rope_interleaved;
};

struct Shared {
  uint64_t full[kStages], empty[kStages];
  uint64_t attn_bars[AttnSmem::kBarrierWords];
  uint64_t queue_full[kQueue], queue_empty[kQueue];
  DeviceTile tile[kQueue];
  int32_t id[kQueue];
  float norm[2][kHeadDim];  // the q and k RMSNorm weights, loaded once (the epilogue reads them every row)
};

// The GEMM epilogue's staging: one head's 128 x 128 bf16 outputs as two 64-column boxes of the output's
// tensor map (128-B swizzle), stored by TMA.
constexpr int kStagingBytes = kTileM * kHeadDim * 2;
// No alignment slack: with the static barriers and queue (3 KiB) this is the SM's 227 KiB exactly; the
// kernel checks that the dynamic base is 1024-B aligned (the swizzle needs it).
constexpr int kSmemBytes = kRegionBytes + kStagingBytes;

#if TW_SM90_ENABLED
using namespace sm90;
namespace ptx = cuda::ptx;

__device__ __forceinline__ kernels::PrefillItem item_of(const Params& p, const DeviceTile& t) {
  return kernels::prefill_item<false>(p.attn, t.tm * p.attn.num_tiles + t.tn);  // tm: the head, tn: the plan's tile
}

// Warp 0, all lanes (lane 0 issues; the warp polls the counters together).
__device__ __forceinline__ void run_producer(uint8_t* region, Shared& sh, const AttnSmem& as, const Maps& maps, const Params& p,
                             runtime::BlockSlots& slots) {
  const int lane = threadIdx.x;
  // L2 policies. The QKV projection re-reads x for every column tile over the whole op, and a column
  // tile's weight rows only while its row tiles run (dit_chain_order takes them together): x
  // evict_last, W_qkv evict_first (H200, A/B in one call, two rounds: L = 4608 1119 -> 1097 us,
  // 8704 2915 -> 2802 against both normal; W evict_first alone: no clear change). K and V are read by
  // every item of the head (evict_last), Q by one (evict_first).
  const uint64_t pol_x = l2_evict_last(), pol_w = l2_evict_first(), pol_gemm = l2_evict_normal();
  const uint64_t pol_q = l2_evict_first(), pol_kv = l2_evict_last();
  uint32_t g_it = 0;                         // GEMM stages issued
  uint32_t k_it = 0, v_it = 0, q_count = 0;  // attention: K / V tiles loaded, items' Q loaded
  int body = -1;                             // the body whose stages the region holds: 0 GEMM, 1 attention
  int qs = 0;
  uint32_t qphase = 0;
  // Use n of a ring of `stages` slots is slot n % stages; its release is phase n / stages of the
  // slot's empty barrier.
  auto released = [](uint64_t* empty, uint32_t n, uint32_t stages) {
    mbar_wait(&empty[n % stages], (n / stages) & 1, "released");
  };
  auto acquire = [&]() -> uint32_t {  // the next GEMM slot, once its last use has been released
    if (g_it >= kStages) released(sh.empty, g_it - kStages, kStages);
    return g_it++ % kStages;
  };
  auto drain = [&](int old) {  // every slot's last use of the old body released
    auto last_uses = [&](uint64_t* empty, uint32_t uses, uint32_t stages) {
      for (uint32_t n = uses > stages ? uses - stages : 0; n < uses; ++n) released(empty, n, stages);
    };
    if (old == 0) {
      last_uses(sh.empty, g_it, kStages);
    } else {
      last_uses(as.q_empty, q_count, 1);
      last_uses(as.k_empty, k_it, AttnCfg::kStages);
      last_uses(as.v_empty, v_it, AttnCfg::kStages);
    }
  };
  for (bool first = true;; first = false) {
    __syncwarp();  // lane 0's prefetch (slots.next*) is visible to the warp
    int32_t id = slots.next_id;
    if (id >= 0 && !first && p.ep.spin_limit && *reinterpret_cast<volatile uint32_t*>(&p.ep.state->error)) id = -1;
    const DeviceTile t = slots.next;
    if (lane == 0) {
      mbar_wait(&sh.queue_empty[qs], qphase ^ 1, "queue empty");
      sh.tile[qs] = id >= 0 ? t : DeviceTile{-1, 0, 0, 0, 0, 0, 0, -1};
      sh.id[qs] = id;
      mbar_arrive(&sh.queue_full[qs]);  // the epoch (read before the first entry) reaches the consumers with it
      if (id >= 0) runtime::trace_mark(p.ep, id, runtime::kTraceSm), runtime::trace_mark(p.ep, id, runtime::kTraceTaken);
    }
    if (++qs == kQueue) qs = 0, qphase ^= 1;
    if (id < 0) break;
    const int kind = t.op, next_body = kind == kAttentionTile ? 1 : 0;
    if (lane == 0 && body >= 0 && body != next_body) drain(body);
    body = next_body;
    const bool ready = runtime::counters_ready_warp(p.ep, slots.epoch, t);
    if (kind != kAttentionTile) {
      const CUtensorMap* a_map = kind == kQkvTile ? &maps.x : &maps.attn;
      const CUtensorMap* b_map = kind == kQkvTile ? &maps.w_qkv : &maps.w_o;
      const int n = p.k_stages, a_row = t.tm * kTileM, b_row = t.tn * kTileN;
      auto issue_b = [&](uint32_t s, int j) {
        tma_load_2d(region + s * kStageBytes + kABytes, b_map, j * kStageK, b_row, &sh.full[s], kind == kQkvTile ? pol_w : pol_gemm);
      };
      auto issue_a = [&](uint32_t s, int j) {
        tma_load_2d(region + s * kStageBytes, a_map, j * kStageK, a_row, &sh.full[s], kind == kQkvTile ? pol_x : pol_gemm);
      };
      // Weights depend on nothing: while the tile's producers are not done, a ring's worth of them
      // goes out before the wait, their activations after it.
      const int pre = ready ? 0 : min(n, kStages);
      const uint32_t s0 = g_it;
      if (lane == 0)
        for (int j = 0; j < pre; ++j) {
          const uint32_t s = acquire();
          ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &sh.full[s], kStageBytes);
          issue_b(s, j);
        }
      if (!ready) runtime::wait_counters_warp(p.ep, slots.epoch, t);
      if (lane == 0) {
        runtime::trace_mark(p.ep, id, runtime::kTraceReady);
        ptx::fence_proxy_async(ptx::space_global);  // produced activations, read by the async proxy
        for (int j = 0; j < pre; ++j) issue_a((s0 + j) % kStages, j);
        for (int j = pre; j < n; ++j) {
          const uint32_t s = acquire();
          ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &sh.full[s], kStageBytes);
          issue_a(s, j);
          issue_b(s, j);
        }
      }
    } else {
      if (!ready) runtime::wait_counters_warp(p.ep, slots.epoch, t);
      if (lane == 0) {
        runtime::trace_mark(p.ep, id, runtime::kTraceReady);
        ptx::fence_proxy_async(ptx::space_global);  // q, k, v were written by other CTAs' stores
        if (q_count > 0) released(as.q_empty, q_count - 1, 1);  // the previous item's Q
        ++q_count;
        const kernels::PrefillItem it = item_of(p, t);
        if (it.n_kv == 0)
          mbar_arrive(as.q_full);  // rows that see no key (none in a non-causal chain): nothing to load
        else
          kernels::prefill_load_item<AttnCfg>(as, p.attn, it, maps.q, maps.k, maps.v, k_it, v_it, pol_q, pol_kv);
      }
    }
    // The next ticket only now: its round trips overlap the consumers working through this tile.
    if (lane == 0) runtime::prefetch_next(p.ep, slots);
  }
}

// One warpgroup's 64 rows of a GEMM tile: acc += A[64 rows][K] B[kTileN rows][K]^T over the op's stages
// (acc zeroed by the caller: a scale-d operand that varies with the stage, beside the attention's
// wgmmas in one kernel, made ptxas serialise every wgmma and spill 336 B).
__device__ __forceinline__ void gemm_mainloop(uint8_t* region, Shared& sh, int cw, int n, uint32_t& g_it,
                                              float (&acc)[kAcc]) {
  const bool release_lane = threadIdx.x % 32 == 0;
  for (int j = 0; j < n; ++j, ++g_it) {
    const uint32_t s = g_it % kStages;
    mbar_wait(&sh.full[s], (g_it / kStages) & 1, "gemm full");
    const uint8_t* st = region + s * kStageBytes;
    const uint64_t a = make_desc_sw128(st + cw * 64 * 128), b = make_desc_sw128(st + kABytes);
    fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) Wgmma<kTileN>::mma(acc, desc_add(a, 32 * k), desc_add(b, 32 * k), 1);
    wgmma_commit();
    fence_operands(acc);
    // This stage's wgmmas stay in flight; the previous stage's are done once at most one group is pending.
    wgmma_wait<1>();
    fence_operands(acc);
    if (j > 0 && release_lane) mbar_arrive(&sh.empty[(g_it - 1) % kStages]);
  }
  wgmma_wait<0>();
  fence_operands(acc);
  if (n > 0 && release_lane) mbar_arrive(&sh.empty[(g_it - 1) % kStages]);
}

// The epilogue of a GEMM tile. Accumulator 4i + 2h + e of a thread is row 16 warp + lane / 4 + 8h of
// its warpgroup's 64, column 8i + 2 (lane % 4) + e: the four threads of a quad hold a row's columns,
// head `half` in i = 16 half .. 16 half + 15; within a head, columns c and c + 64 (i and i + 8) sit in
// one thread, as do 2j and 2j + 1 (e = 0, 1).
// Measured (H200, Qwen-Image's width at L = 4608, tile timelines): with the pairs stored from registers
// (4- or 16-byte stores alike) and the norm weights and RoPE rows read as scalars from global memory, a
// QKV tile's epilogue took 12.8 us of its 51.7 (the output projection's 8.1 of 53.8): the stores and
// the release behind them ~7 us, the norm and RoPE ~5. A head's outputs now go through shared memory
// and leave by TMA; the norm weights come from shared memory, the RoPE rows as float2 from the
// read-only path.
__device__ __forceinline__ void gemm_epilogue(const Params& p, const Maps& maps, const Shared& sh, uint8_t* staging,
                                              const DeviceTile& t, int cw, int ct, float (&acc)[kAcc]) {
  const int lane = ct % 32, warp = (ct / 32) % 4, tq = lane % 4;
  const bool qkv = t.op == kQkvTile;
  const int heads = qkv ? 3 * p.heads : p.heads;  // head columns of the output
  const bf16* bias = qkv ? p.qkv_bias : p.o_bias;
#pragma unroll
  for (int half = 0; half < kHeadsPerTile; ++half) {
    const int hc = t.tn * kHeadsPerTile + half;  // the head column: q 0 .. H - 1, k H .., v 2H ..
    if (hc >= heads) break;                      // the last tile's empty half
    const int which = qkv ? hc / p.heads : 2;    // 0 q, 1 k, 2 v (and the output projection)
    const int col0 = hc * kHeadDim;
    float* a = acc + half * (kAcc / kHeadsPerTile);  // this head's 64 accumulators
    if (bias) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float2 b = __bfloat1622float2(__ldg(reinterpret_cast<const __nv_bfloat162*>(bias + col0 + 8 * i + 2 * tq)));
#pragma unroll
        for (int h = 0; h < 2; ++h) a[4 * i + 2 * h] += b.x, a[4 * i + 2 * h + 1] += b.y;
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = t.tm * kTileM + cw * 64 + warp * 16 + lane / 4 + 8 * h;
      if (which < 2) {
        // The token's RoPE row (rows past L read row L - 1): D/2 cosines, then sines.
        const float* cs = p.rope + int64_t(min(row, p.tokens - 1)) * kHeadDim;
        // RMSNorm over the head's 128 columns (the quad's).
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < 16; ++i) ss += a[4 * i + 2 * h] * a[4 * i + 2 * h] + a[4 * i + 2 * h + 1] * a[4 * i + 2 * h + 1];
        const float rstd = rsqrtf(kernels::prefill_detail::quad_sum(ss) * (1.f / kHeadDim) + p.eps);
        const float* g = sh.norm[which];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float2 w = *reinterpret_cast<const float2*>(g + 8 * i + 2 * tq);
          a[4 * i + 2 * h] *= rstd * w.x;
          a[4 * i + 2 * h + 1] *= rstd * w.y;
        }
        if (p.rope_interleaved) {
#pragma unroll
          for (int i = 0; i < 16; ++i) {  // pair (2j, 2j + 1), j = 4i + tq
            const int j = 4 * i + tq;
            const float c = __ldg(cs + j), s = __ldg(cs + kHeadDim / 2 + j);
            const float x = a[4 * i + 2 * h], y = a[4 * i + 2 * h + 1];
            a[4 * i + 2 * h] = x * c - y * s;
            a[4 * i + 2 * h + 1] = y * c + x * s;
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) {  // pair (c, c + 64), frequency c = 8i + 2tq + e
            const float2 co = __ldg(reinterpret_cast<const float2*>(cs + 8 * i + 2 * tq));
            const float2 si = __ldg(reinterpret_cast<const float2*>(cs + kHeadDim / 2 + 8 * i + 2 * tq));
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float c = e ? co.y : co.x, s = e ? si.y : si.x;
              const float x = a[4 * i + 2 * h + e], y = a[4 * (i + 8) + 2 * h + e];
              a[4 * i + 2 * h + e] = x * c - y * s;
              a[4 * (i + 8) + 2 * h + e] = y * c + x * s;
            }
          }
        }
      }
    }
    // The head's 128 x 128 into the staging (two boxes of 64 columns, 128-B swizzle: 16-byte chunk j of
    // row r at j ^ (r % 8); a warp's stores of one i cover 8 rows' distinct chunks: no bank conflicts),
    // then one thread stores them by TMA. The staging is free once the previous head's store has read it.
    if (half > 0) {
      if (ct == 0) bulk_wait_read<0>();
      named_bar_sync(kConsumerBar, kConsumers);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cw * 64 + warp * 16 + lane / 4 + 8 * h;  // row in the tile
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        uint8_t* dst = staging + (i / 8) * (kStagingBytes / 2) + r * 128 + (((i % 8) ^ (r % 8)) * 16) + tq * 4;
        *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a[4 * i + 2 * h], a[4 * i + 2 * h + 1]);
      }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // our staging writes, before the TMA reads them
    named_bar_sync(kConsumerBar, kConsumers);
    if (ct == 0) {
      const CUtensorMap* map = qkv ? &maps.qkv_out : &maps.y_out;
      tma_store_2d(map, col0, t.tm * kTileM, staging);
      tma_store_2d(map, col0 + 64, t.tm * kTileM, staging + kStagingBytes / 2);
      bulk_commit();
    }
  }
  if (ct == 0) bulk_wait<0>();  // the outputs are written (the release that follows publishes them)
}

__device__ __forceinline__ void run_consumers(uint8_t* region, Shared& sh, const AttnSmem& as, const Maps& maps,
                                              const Params& p, const runtime::BlockSlots& slots) {
  uint8_t* staging = region + kRegionBytes;
  const int cw = threadIdx.x / 128 - 1, ct = threadIdx.x - 128;
  uint32_t g_it = 0, k_it = 0, v_it = 0, q_count = 0;
  int qs = 0;
  uint32_t qphase = 0;
  const uint32_t my_turn = 1 + cw, other_turn = 1 + (cw + 1) % AttnCfg::kWGs;
  for (int i = ct; i < 2 * kHeadDim; i += kConsumers)
    sh.norm[i / kHeadDim][i % kHeadDim] = __bfloat162float((i < kHeadDim ? p.q_norm : p.k_norm)[i % kHeadDim]);
  named_bar_sync(kConsumerBar, kConsumers);
  if (AttnCfg::kTurns && cw == AttnCfg::kWGs - 1) named_bar_arrive(1, kConsumers);  // prefill_sm90.cuh's turns
  for (;;) {
    mbar_wait(&sh.queue_full[qs], qphase, "queue full");
    const DeviceTile t = sh.tile[qs];
    const int32_t id = sh.id[qs];
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(&sh.queue_empty[qs]);
    if (++qs == kQueue) qs = 0, qphase ^= 1;
    if (t.op < 0) break;
    if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceStarted);
    if (t.op == kAttentionTile) {
      mbar_wait(as.q_full, q_count & 1, "q_full");
      ++q_count;
      kernels::prefill_attend_item<AttnCfg>(as, p.attn, item_of(p, t), cw, my_turn, other_turn, k_it, v_it);
      if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceComputed);
    } else {
      float acc[kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
      gemm_mainloop(region, sh, cw, p.k_stages, g_it, acc);
      if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceComputed);
      gemm_epilogue(p, maps, sh, staging, t, cw, ct, acc);
    }
    ptx::fence_proxy_async(ptx::space_global);  // our stores, before a TMA elsewhere reads them
    named_bar_sync(kConsumerBar, kConsumers);
    if (ct == 0) {
      runtime::release_signal(p.ep, t);
      runtime::trace_mark(p.ep, id, runtime::kTraceDone);
    }
  }
  if (AttnCfg::kTurns && cw == 0) named_bar_sync(my_turn, kConsumers);
}
#endif  // TW_SM90_ENABLED

__global__ void __launch_bounds__(kThreads, 1)
    dit_chain_kernel(const __grid_constant__ Maps maps, const __grid_constant__ Params p) {
#if TW_SM90_ENABLED
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  __shared__ Shared sh;
  __shared__ runtime::BlockSlots slots;
  uint8_t* region = smem_raw;
  if (reinterpret_cast<uintptr_t>(region) % 1024) __trap();  // see kSmemBytes
  const AttnSmem as(region, sh.attn_bars);
  if (threadIdx.x == 0) {
    as.init();
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&sh.full[s], 1);
      mbar_init(&sh.empty[s], kConsumers / 32);
    }
    for (int i = 0; i < kQueue; ++i) {
      mbar_init(&sh.queue_full[i], 1);
      mbar_init(&sh.queue_empty[i], kConsumers / 32);
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    for (const CUtensorMap* m : {&maps.x, &maps.w_qkv, &maps.attn, &maps.w_o, &maps.q, &maps.k, &maps.v, &maps.qkv_out, &maps.y_out})
      tma_prefetch_desc(m);
    runtime::begin_launch(p.ep, slots);
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp < 4) {
    setmaxnreg_dec<AttnCfg::kProducerRegs>();
    if (warp == 0) run_producer(region, sh, as, maps, p, slots);
  } else {
    setmaxnreg_inc<AttnCfg::kConsumerRegs>();
    run_consumers(region, sh, as, maps, p, slots);
  }
  runtime::end_launch(p.ep, slots);
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without wgmma: the host never dispatches here
#endif
}

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("dit attention chain: " + what); }


}  // namespace
}  // namespace dit_chain

DitAttentionChain::DitAttentionChain(const DitAttentionShape& shape, const DitChainOptions& opt)
    : shape_(shape), opt_(opt) {
  using namespace dit_chain;
  if (shape_.head_dim != kHeadDim) bad("head_dim " + std::to_string(shape_.head_dim) + ": the chain runs head_dim 128");
  if (shape_.causal) bad("causal: the chain runs the non-causal attention of diffusion transformers");
  if (shape_.fp8) bad("fp8: the chain runs bf16 (PrefillAttention has the e4m3 path)");
  if (!(opt_.eps > 0.f)) bad("eps " + std::to_string(opt_.eps) + " must be > 0");
  int dev = 0, major = 0, minor = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    throw CudaError("dit attention chain runs on sm_90a (Hopper); this device is sm_" + std::to_string(major) +
                    std::to_string(minor));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
  g_ = build_dit_attention_graph(shape_, sms_);  // validates tokens and heads
  if (opt_.order_lag < -1) bad("order_lag " + std::to_string(opt_.order_lag) + " must be >= 0 (or -1: one wave)");
  sched_ = opt_.order.empty() ? dit_chain_order(g_, opt_.order_lag < 0 ? sms_ : opt_.order_lag)
                              : make_order(g_.graph, opt_.order);
  const std::vector<int> cu = {0, int(shape_.tokens)};
  const std::vector<PrefillTile> tiles = plan_prefill_tiles(g_.attention, cu, {}, AttnCfg::kBN, AttnCfg::kBM);
  if (int64_t(tiles.size()) != g_.graph.op(g_.op_attention).grid_n || prefill_block_n(g_.attention) != AttnCfg::kBN)
    bad("the graph's attention items are not the kernel's (" + std::to_string(tiles.size()) + " tiles of " +
        std::to_string(AttnCfg::kBN) + " keys)");
  num_attn_tiles_ = int(tiles.size());
  plan_ = std::make_unique<runtime::DevicePlan>(make_exec_plan(g_.graph, sched_), 2);

  const size_t L = size_t(shape_.tokens), W = size_t(shape_.heads) * kHeadDim;
  TW_CUDA_CHECK(cudaMalloc(&qkv_, L * 3 * W * sizeof(bf16)));
  TW_CUDA_CHECK(cudaMalloc(&attn_, L * W * sizeof(bf16)));
  TW_CUDA_CHECK(cudaMalloc(&d_cu_, 2 * sizeof(int)));
  TW_CUDA_CHECK(cudaMalloc(&d_tiles_, tiles.size() * 3 * sizeof(int)));
  std::vector<int> flat;
  for (const PrefillTile& t : tiles) flat.insert(flat.end(), {t.seq, t.q_tile, t.kv_tiles});
  TW_CUDA_CHECK(cudaMemcpy(d_cu_, cu.data(), 2 * sizeof(int), cudaMemcpyHostToDevice));
  TW_CUDA_CHECK(cudaMemcpy(d_tiles_, flat.data(), flat.size() * sizeof(int), cudaMemcpyHostToDevice));
  static const bool attr_set = [] {
    TW_CUDA_CHECK(cudaFuncSetAttribute(dit_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)attr_set;
}

DitAttentionChain::~DitAttentionChain() {
  cudaFree(qkv_);
  cudaFree(attn_);
  cudaFree(d_cu_);
  cudaFree(d_tiles_);
}

double DitAttentionChain::flops() const {
  const double L = double(shape_.tokens), W = double(shape_.heads) * shape_.head_dim;
  return 2 * L * 3 * W * W + 4 * L * L * W + 2 * L * W * W;
}

uint32_t DitAttentionChain::error() const { return plan_->error(); }
void DitAttentionChain::enable_trace() { plan_->enable_trace(); }

void DitAttentionChain::run(const DitChainTensors& t, cudaStream_t stream) const {
  using namespace dit_chain;
  const char* op = "dit attention chain";
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{t.x, "x"}, {t.w_qkv, "w_qkv"}, {t.w_o, "w_o"}, {t.y, "y"}})
    ffn_sm90::check_operand(op, ptr, name);
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{t.q_norm, "q_norm"}, {t.k_norm, "k_norm"}, {t.rope, "rope"}})
    if (!ptr) bad(std::string(name) + " is null");
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{t.q_norm, "q_norm"}, {t.k_norm, "k_norm"},
                                  {t.qkv_bias, "qkv_bias"}, {t.o_bias, "o_bias"}, {t.rope, "rope"}})
    if (reinterpret_cast<uintptr_t>(ptr) % 4) bad(std::string(name) + " is not 4-byte aligned");
  const int64_t L = shape_.tokens, W = int64_t(shape_.heads) * kHeadDim;
  Maps m;
  m.x = sm90::make_tensor_map_bf16(t.x, uint64_t(L), uint64_t(W), kTileM, true);
  m.w_qkv = sm90::make_tensor_map_bf16(t.w_qkv, uint64_t(3 * W), uint64_t(W), kTileN, true);  // rows past 3W: zeros
  m.attn = sm90::make_tensor_map_bf16(attn_, uint64_t(L), uint64_t(W), kTileM, true);
  m.w_o = sm90::make_tensor_map_bf16(t.w_o, uint64_t(W), uint64_t(W), kTileN, true);
  const uint64_t H = uint64_t(shape_.heads);  // q, k and v: heads of q|k|v [L][3W]
  m.q = sm90::make_head_rows_map_bf16(qkv_, uint64_t(L), H, kHeadDim, AttnCfg::kBM, uint64_t(3 * W));
  m.k = sm90::make_head_rows_map_bf16(qkv_ + W, uint64_t(L), H, kHeadDim, AttnCfg::kBN, uint64_t(3 * W));
  m.v = sm90::make_head_rows_map_bf16(qkv_ + 2 * W, uint64_t(L), H, kHeadDim, AttnCfg::kBN, uint64_t(3 * W));
  m.qkv_out = sm90::make_tensor_map_bf16(qkv_, uint64_t(L), uint64_t(3 * W), kTileM, false);
  m.y_out = sm90::make_tensor_map_bf16(t.y, uint64_t(L), uint64_t(W), kTileM, false);
  Params p{};
  p.ep = plan_->params(opt_.spin_limit);
  p.attn.cu_q = p.attn.cu_k = d_cu_;
  p.attn.tiles = d_tiles_;
  p.attn.num_tiles = num_attn_tiles_;
  p.attn.num_work = num_attn_tiles_ * shape_.heads;
  p.attn.heads_q = shape_.heads;
  p.attn.group = 1;
  p.attn.causal = 0;
  p.attn.total_q = int(L);
  p.attn.scale_log2 = 1.4426950408889634f / std::sqrt(float(kHeadDim));
  p.attn.out = attn_;
  p.qkv_bias = t.qkv_bias;
  p.o_bias = t.o_bias;
  p.q_norm = t.q_norm;
  p.k_norm = t.k_norm;
  p.rope = t.rope;
  p.tokens = int(L);
  p.heads = shape_.heads;
  p.k_stages = int(W / kStageK);
  p.eps = opt_.eps;
  p.rope_interleaved = opt_.rope_interleaved ? 1 : 0;
  runtime::launch_kernel(dit_chain_kernel, dim3(sms_), dim3(kThreads), kSmemBytes, stream, false, m, p);
}

}  // namespace tw
