// The fused FFN's Hopper tile body: the executor's tickets driven by a TMA producer warp, wgmma
// consumers (kernels/sm90/mainloop.cuh), one CTA per SM.
//
// Roles. Warp 0 is the executor: it takes tickets, hands each tile's descriptor to the consumers
// through a small shared-memory queue, and streams the tile's weights and activations into the
// ring. Weights depend on nothing, so the first stages of a tile go out before the warp waits on
// the tile's producer counters; the ring is shared by consecutive tiles, so the next tile's
// weights stream while the consumers still run this tile's epilogue (no drain at tile ends, which
// a block-synchronous tile body cannot avoid). The two consumer warpgroups run the wgmmas and the
// epilogue, then publish the tile on its counter. Warp 1 draws the tickets (runtime/ticket_warp.cuh);
// warp 2 makes the arrivals of split slices that do not sum their tile (Chain::split_finisher).
//
// No deadlock inside a CTA: the producer pushes a tile and issues all of its stages before it
// touches the next one, so a tile the consumers have popped never waits on the producer; the
// producer's own waits (queue slot, ring slot, counters, the ticket warp's draw) are released by
// the consumers finishing earlier tiles, by the ticket warp (which waits only for the producer's
// request) or by other CTAs. Across CTAs the executor's argument holds unchanged
// (runtime/executor.cuh): the block's next ticket is drawn while its current tile's last stages
// are issued, so it holds its tickets in increasing order, and a ticket's producers have smaller
// tickets.
//
// Coherence: h is written by other CTAs with ordinary stores and read here by TMA (the async
// proxy). The writer fences the proxies before it releases its counter; the reader's acquire is
// followed by fence.proxy.async.global before its activation copies are issued.
#include "ffn_sm90.hpp"

#include <algorithm>
#include <string>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/kernels/activation.cuh"
#include "tileweave/kernels/sm90/mainloop.cuh"
#include "tileweave/runtime/executor.cuh"
#include "tileweave/runtime/ticket_warp.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw::ffn_sm90 {
namespace {

using bf16 = __nv_bfloat16;

struct Chain {
  OpArgs ops[2];
  int32_t overlap;      // launched to overlap the previous kernel (launch() says more)
  int32_t ticket_lead;  // stages before a tile's last one at which its block's next ticket is drawn
  int32_t split_finisher;  // each split group's last slice in the schedule sums it (finish_tile)
};

// In an overlapped launch, the stages of the block's first tile after its first that are pulled
// into L2 before the grid wait (packed weights, whose stages are contiguous). Copying 2, 3 or all 6
// stages into the ring instead was up to 0.5 us slower (H200, 8B FFN, M = 1-64): the activation
// copies that follow queue behind them. Pulling 8 or 16 into L2 was no better.
constexpr int kOverlapL2Stages = 4;

constexpr int kQueue = 8;  // tiles the producer may run ahead of the consumers

#if TW_SM90_ENABLED
using namespace sm90;

struct TileQueue {
  DeviceTile tile[kQueue];
  int32_t id[kQueue];
  uint64_t full[kQueue], empty[kQueue];
};

// A split slice's arrival, handed by the consumers to warp 2 (Chain::split_finisher). Named
// barriers (1 is the consumers' own): the consumers arrive on kBarArrival once the entry is
// written, warp 2 syncs there, copies it and arrives on kBarArrivalFree, where the consumers sync
// before they write the next entry. No deadlock: warp 2 waits only for entries and its arrival
// waits on nothing; the consumers wait only for warp 2's copy of the entry before. An entry with
// arrive -1 ends warp 2.
struct SplitArrival {
  int32_t arrive, id;  // arrive -1: the last entry
  uint32_t slices;
};
constexpr uint32_t kBarArrival = 2, kBarArrivalFree = 3, kArrivalThreads = 256 + 32;  // consumers + warp 2
// At namespace scope: an address the kernel knows, not a pointer held across the mainloop (a register
// the 256-row tiles do not have: 8 bytes spilled).
__shared__ SplitArrival g_arrival;

// Weight boxes of stage s for K stage kst. A gated tile's 16-row groups are 8 gate rows then the
// same columns' 8 up rows (one 4-D box, tma.cuh), so each consumer thread holds a gate value and
// its up partner in one fragment (registers 4q+e and 4q+2+e) and the epilogue needs no exchange.
template <class Cfg>
__device__ __forceinline__ void issue_weights(const Ring<Cfg>& ring, int s, const Maps& maps, const OpArgs& o, int op,
                                              int tn, int kst, uint64_t policy) {
  if (o.w_packed) {  // the stage's blocks are contiguous (pack_weights)
    const __nv_bfloat16* src = o.w_packed + (int64_t(tn) * o.packed_atoms + kst * Cfg::kKAtoms) * (kTileRows * 64);
    bulk_load(ring.w_atom(s, 0), src, Cfg::kKAtoms * Cfg::kWAtomBytes, &ring.full[s], policy);
    return;
  }
  const bool silu = o.silu;
#pragma unroll
  for (int a = 0; a < Cfg::kKAtoms; ++a) {
    const int col = kst * Cfg::kBK + 64 * a;
    uint8_t* dst = ring.w_atom(s, a);
    if (silu) {
      tma_load_4d(dst, &maps.w0, col, 0, 0, tn * 8, &ring.full[s], policy);
    } else {
      tma_load_2d(dst, op == 0 ? &maps.w0 : &maps.w1, col, tn * kTileRows, &ring.full[s], policy);
    }
  }
}
template <class Cfg>
__device__ __forceinline__ void issue_acts(const Ring<Cfg>& ring, int s, const Maps& maps, int op, int tm, int kst,
                                           uint64_t policy) {
#pragma unroll
  for (int a = 0; a < Cfg::kKAtoms; ++a)
    tma_load_2d(ring.x_atom(s, a), op == 0 ? &maps.x : &maps.h, kst * Cfg::kBK + 64 * a, tm * Cfg::kMPad,
                &ring.full[s], policy);
}

// The K slices a ticket covers: all of a split op's where it runs them as one (run_whole_units: no
// arrival counter), else its own one.
__device__ __forceinline__ int slices_of(const OpArgs& o, const DeviceTile& t) {
  return o.split > 1 && t.arrive < 0 ? o.split : 1;
}
__device__ __forceinline__ int stages_of(const OpArgs& o, const DeviceTile& t) {
  return o.slice_start[t.ks + slices_of(o, t)] - o.slice_start[t.ks];
}

// Warp 0, all lanes (lane 0 issues; the warp polls the counters together).
template <class Cfg>
__device__ void run_producer(const Ring<Cfg>& ring, TileQueue& q, const Maps& maps, const runtime::ExecParams& ep,
                             const Chain& cp, runtime::BlockSlots& slots, runtime::TicketHandoff& handoff) {
  const int lane = threadIdx.x;
  const uint64_t w_policy = l2_evict_first(), x_policy = l2_evict_last();
  PipeState<Cfg> ps;
  int qs = 0;
  uint32_t qphase = 0, tphase = 0;
  for (bool first = true;; first = false) {
    if (lane == 0) runtime::take_handed_ticket(handoff, tphase);
    __syncwarp();  // the ticket warp's draw (slots.next*) is visible to the warp
    int32_t id = slots.next_id;
    const DeviceTile t = slots.next;
    if (id >= 0 && !first && ep.spin_limit && *reinterpret_cast<volatile uint32_t*>(&ep.state->error)) id = -1;
    if (id < 0 && lane == 0) runtime::want_next_ticket(handoff);  // an aborted launch: lets the ticket warp stop
    const OpArgs& o = cp.ops[id >= 0 ? t.op : 0];
    const int kst0 = id >= 0 ? o.slice_start[t.ks] : 0, n = id >= 0 ? stages_of(o, t) : 0;
    const int s0 = ps.stage;
    // Weights depend on nothing: each tile's first stage goes out before the tile touches the
    // queue or polls its producers. The block's first tile is static (runtime/executor.cuh), so in
    // an overlapped launch this happens on an SM the previous kernel has left, before the wait
    // for that kernel, and the next stages are pulled into L2 meanwhile. (Only one stage goes
    // into the ring early: each tile's activations queue behind whatever copies precede them.
    // With the whole ring's weights first, the first tiles started so late that the 8B FFN took
    // 3 us longer on the H200.)
    if (lane == 0 && n > 0) {
      issue_weights(ring, producer_acquire(ring, ps), maps, o, t.op, t.tn, kst0, w_policy);
      if (first && cp.overlap && o.w_packed && n > 1)
        bulk_prefetch_l2(o.w_packed + (int64_t(t.tn) * o.packed_atoms + (kst0 + 1) * Cfg::kKAtoms) * (kTileRows * 64),
                         uint32_t(min(n - 1, kOverlapL2Stages) * Cfg::kKAtoms * Cfg::kWAtomBytes));
    }
    if (first) {
      runtime::grid_dependency_wait();  // from here on the previous kernel has finished
      if (lane == 0) runtime::enter_launch(ep, slots);
      __syncwarp();
    }
    if (lane == 0) {
      // The epoch (written above) reaches the consumers through this queue entry's release.
      mbar_wait(&q.empty[qs], qphase ^ 1, "queue empty");
      q.tile[qs] = id >= 0 ? t : DeviceTile{-1, 0, 0, 0, 0, 0, 0, -1};
      q.id[qs] = id;
      mbar_arrive(&q.full[qs]);
      if (id >= 0) runtime::trace_mark(ep, id, runtime::kTraceSm), runtime::trace_mark(ep, id, runtime::kTraceTaken);
    }
    if (++qs == kQueue) qs = 0, qphase ^= 1;
    if (id < 0) break;

    // Usually a tile's producers finished long ago (always for the first op): one poll, made
    // while the first stage's weights are on their way, says so, and each stage then gets its
    // weights and activations together. Otherwise the weights of a ring's worth of stages go out
    // before the wait, and their activations after it. (Holding back the activations of every
    // tile's first ring's worth of stages cost ~0.7 us per tile on the H200: the ring sat full
    // of weights, idle, for a round trip to L2.)
    const bool ready = runtime::counters_ready_warp(ep, slots.epoch, t);
    const int pre = ready ? 1 : min(n, ps.count);
    if (lane == 0)
      for (int j = 1; j < pre; ++j)
        issue_weights(ring, producer_acquire(ring, ps), maps, o, t.op, t.tn, kst0 + j, w_policy);
    // A wait that expires (tests' bounded waits) has flagged the launch failed; the copies below
    // still go out, since their stages are armed for them, and no further ticket is taken.
    if (!ready) runtime::wait_counters_warp(ep, slots.epoch, t);
    if (lane == 0) {
      runtime::trace_mark(ep, id, runtime::kTraceReady);
      ptx::fence_proxy_async(ptx::space_global);
      for (int j = 0, s = s0; j < pre; ++j, s = (s + 1 == ps.count ? 0 : s + 1))
        issue_acts(ring, s, maps, t.op, t.tm, kst0 + j, x_policy);
      // The next ticket is drawn by the ticket warp while this tile's last `ticket_lead` stages go
      // out (runtime/ticket_warp.cuh): not before, since a drawn ticket is committed to this block
      // (late in the launch another block may be free sooner), and not after, since the draw's
      // round trips would then leave the ring empty when this tile's stages are all consumed.
      const int want_at = max(pre, n - cp.ticket_lead);
      for (int j = pre; j < n; ++j) {
        if (j == want_at) runtime::want_next_ticket(handoff);
        const int s = producer_acquire(ring, ps);
        issue_weights(ring, s, maps, o, t.op, t.tn, kst0 + j, w_policy);
        issue_acts(ring, s, maps, t.op, t.tm, kst0 + j, x_policy);
      }
      if (want_at >= n) runtime::want_next_ticket(handoff);
    }
  }
}

// Stores the tile from the accumulators, bf16. Register 4q+e of consumer thread ct (fragment layout
// of sm90::acc_coord, one 64-row block per warpgroup) is weight row r + 8*(e>>1) of the tile and
// activation row 8q + 2*(ct%4) + (e&1). A gated tile's row r is gate column r%8 of group r/16 and
// row r+8 its up partner, so e = 0,1 are gate values and e = 2,3 their up partners. kAct: plain
// columns take o.act's activation. Launches with none run kAct = false: the activations' code
// (GeLU's tanh, inlined for every accumulator) in the one kernel had slowed every op from M = 100 up
// by 3-60% (H200, bench_sweep seed 16: a plain MLP with d = 2688, F = 5888 at M = 4096 473 -> 757 us,
// a gated FFN with d = 7424, F = 11392 3393 -> 3592), though no such op ran it.
// The address is a row pointer stepped by 8 rows per q and the bounds are 32-bit compares: the
// code is unrolled over up to 256 values a thread, and computing m * n + col in 64 bits with the
// operands reloaded per value made a 256-row tile's stores ~15 instructions a value (a split tile's
// last slice stored for 18-23 us; docs/executor.md, "The epilogue's stores").
//
// Values leave in pairs of adjacent columns. A thread holds (col, row) and (col, row + 1); lane ^ 4
// holds the neighbouring column (its weight row r ^ 1) at the same rows, so one shuffle gives the
// thread of even r both columns of `row` and its partner both of `row + 1`: one 4-byte store where
// there were two 2-byte ones. (An odd n, which DecodeGemm allows, stores the pair's halves apart.)
__device__ __forceinline__ void store_pair(bf16* p, int64_t n, float a, float b, int odd, int col, int row,
                                           int rows_left, int ncols) {
  const float recv = __shfl_xor_sync(0xffffffffu, odd ? a : b, 4);  // every lane: no predicate before it
  if (row + odd >= rows_left) return;
  const int c0 = col - odd;
  bf16* q = p + odd * (n - 1);  // odd: (row + 1, col - 1)
  const __nv_bfloat162 v = odd ? __floats2bfloat162_rn(recv, b) : __floats2bfloat162_rn(a, recv);
  if ((ncols & 1) == 0) {
    if (c0 < ncols) *reinterpret_cast<__nv_bfloat162*>(q) = v;
  } else {
    if (c0 < ncols) q[0] = v.x;
    if (c0 + 1 < ncols) q[1] = v.y;
  }
}

template <class Cfg, bool kAct>
__device__ __forceinline__ void store_tile(const OpArgs& o, const DeviceTile& t, const float (&acc)[Cfg::kAcc], int ct) {
  const int lane = ct % 32, warp = ct / 32;  // warp 0..7 over both consumer warpgroups
  const int64_t n = o.n;
  const int ncols = o.n, odd = (lane >> 2) & 1;
  const int row0 = t.tm * Cfg::kMPad + 2 * (lane % 4), rows_left = o.m - row0;
  bf16* const out = o.out;
  const int act = o.act;
  auto f = [&](float v) { return kAct ? kernels::ffn_activate(act, v) : v; };
  if (o.silu) {
    const int col = t.tn * (kTileRows / 2) + warp * 8 + lane / 4;
    bf16* p = out + int64_t(row0) * n + col;
#pragma unroll
    for (int q = 0; q < Cfg::kAcc / 4; ++q, p += 8 * n)
      store_pair(p, n, kernels::silu(acc[4 * q]) * acc[4 * q + 2], kernels::silu(acc[4 * q + 1]) * acc[4 * q + 3], odd, col,
                 8 * q, rows_left, ncols);
  } else {
    const int col = t.tn * kTileRows + warp * 16 + lane / 4;
    bf16* p = out + int64_t(row0) * n + col;
#pragma unroll
    for (int q = 0; q < Cfg::kAcc / 4; ++q, p += 8 * n)
#pragma unroll
      for (int h = 0; h < 2; ++h)  // columns col and col + 8
        store_pair(p + 8 * h, n, f(acc[4 * q + 2 * h]), f(acc[4 * q + 2 * h + 1]), odd, col + 8 * h, 8 * q, rows_left,
                   ncols);
  }
}

// Plain columns from 160 activation rows up, where the ring leaves room for it (kStagedStores): a
// warp's values leave through 512 bytes of shared memory. stmatrix .trans turns four 8 x 8 fragments
// (a thread's value pairs run down the output's rows) into rows of 8 output columns, and each lane
// stores 16 bytes of one row: a warp stores 16 rows x 32 bytes per instruction, every 32-byte sector
// whole (the pairs above write half a sector per row per instruction, 4 bytes a lane). Needs
// n % 8 == 0 (16-byte rows), as the FFN's shapes are. Measured (H200, tile timelines): a 256 x 128
// tile's stores 3.8-4.6 -> 2.3-2.6 us, a split tile's last slice 3.3-3.8 -> 2.1-2.6. A gated tile
// (8 columns a warp: 32 rows x 16 bytes an instruction, half sectors still) gained nothing (3.8 ->
// 4.1 us) and keeps the pairs.
template <class Cfg>
constexpr bool kStagedStores = Cfg::kMPad >= 160 && Cfg::kMBlocks == 1;
constexpr int kStageWarpBytes = 512;

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <class Cfg, bool kAct>
__device__ __forceinline__ void store_tile_staged(const OpArgs& o, const DeviceTile& t, const float (&acc)[Cfg::kAcc],
                                                  int ct, uint8_t* scratch) {
  const int lane = ct % 32, warp = ct / 32;
  const int64_t n = o.n;
  const int row_base = t.tm * Cfg::kMPad, rows_left = o.m - row_base;
  uint8_t* const mine = scratch + warp * kStageWarpBytes;
  const int act = o.act;
  auto f = [&](float v) { return kAct ? kernels::ffn_activate(act, v) : v; };
  // Matrices: (rows of q, columns 0-7), (q, 8-15), (q + 1, 0-7), (q + 1, 8-15); stored row j of
  // matrix i at 32 (j + 8 (i / 2)) + 16 (i % 2): a 16 x 32-byte block; lane L reads row L / 2, half L % 2.
  const int col = t.tn * kTileRows + warp * 16 + 8 * (lane % 2);
  const int i = lane / 8;
  uint8_t* const dst = mine + 32 * (lane % 8 + 8 * (i / 2)) + 16 * (i % 2);
  bf16* const p = o.out + int64_t(row_base + lane / 2) * n + col;
  const bool col_in = col < o.n;
#pragma unroll
  for (int q = 0; q < Cfg::kAcc / 4; q += 2) {
    stmatrix_x4_trans(dst, pack_bf16(f(acc[4 * q]), f(acc[4 * q + 1])), pack_bf16(f(acc[4 * q + 2]), f(acc[4 * q + 3])),
                      pack_bf16(f(acc[4 * q + 4]), f(acc[4 * q + 5])), pack_bf16(f(acc[4 * q + 6]), f(acc[4 * q + 7])));
    __syncwarp();
    const uint4 v = *reinterpret_cast<const uint4*>(mine + 16 * lane);
    if (col_in && 8 * q + lane / 2 < rows_left) *reinterpret_cast<uint4*>(p + int64_t(8 * q) * n) = v;
    __syncwarp();
  }
}

// Consumer warpgroups (256 threads): the tile's epilogue, then its signal. (Handing the split-K
// arrival, the last slice's reduction and the release to the producer warpgroup's idle warps was
// measured slower on the H200 at every M: 3-10% at M <= 16, 30% at M = 64: one warp read the sums.
// With `arrivals`, only the arrivals of the slices that do not sum go to warp 2.) `slices`: the K slices
// of this output tile that acc holds (t and the ones fused before it, run_consumer); all of the
// op's slices: no partial sums at all, the tile stores acc.
template <class Cfg, bool kAct>
__device__ __forceinline__ void finish_tile(const runtime::ExecParams& ep, uint32_t epoch, const OpArgs& o,
                                            const DeviceTile& t, int32_t id, float (&acc)[Cfg::kAcc], int ct,
                                            volatile uint32_t* flag, int slices, uint8_t* scratch,
                                            bool arrivals, int& handoffs) {
  constexpr int kConsumers = 128 * Cfg::kConsumerWGs;
  // A whole ticket of a split op (run_whole_units: no arrival counter) stores like an unsplit tile.
  const bool split = o.split > 1 && t.arrive >= 0;
  uint32_t signal = uint32_t(slices);  // the increments of t's counter this epilogue publishes
  bool stores = !split;
  if (split) {
    // Split-K: every slice adds its partial into the tile's fp32 block with vector reductions
    // (fire-and-forget, 16 B each, in fragment order so a warp's reductions cover 512 contiguous
    // bytes), and one slice reads the sums, re-zeroes the block for the next launch and stores the
    // tile. The schedule should keep a tile's slices apart in time (kslices/ orders): slices running
    // together would serialise on the same addresses in L2. (A slot per slice, the last slice adding
    // the others', read back slower: docs/executor.md, "The epilogue's stores".)
    // A stream-K unit's run of every slice adds nothing, but still arrives: the group's counter counts
    // o.split per launch.
    const bool whole = slices == o.split;
    float4* block = reinterpret_cast<float4*>(o.ws) + (int64_t(t.tm) * o.grid_n + t.tn) * (kConsumers * Cfg::kAcc / 4);
    if (arrivals) {
      // The finisher: the group's slice of the last K range, which the schedule puts after the
      // others (the host checks it: split_finisher_last), so it never waits for a later ticket. It
      // adds nothing to the block: it waits for the others' arrivals, adds their sums to its own and
      // publishes the tile for all of them. The others add their partial and hand their arrival to warp 2: its release
      // waits for every copy this SM has in flight (2.6 us behind one 64 KiB copy, sync_latency.json),
      // the next tile's weights among them, while the consumers go on to that tile.
      if (t.ks + 1 == o.split) {
        // (A bounded wait that expires flags the launch failed; the tile is stored all the same.)
        if (ct == 0) runtime::wait_other_slices(ep, epoch, t, uint32_t(o.split), uint32_t(slices));
        named_bar_sync(1, kConsumers);
        if (ct == 0) runtime::trace_mark(ep, id, runtime::kTraceMark1);  // the others arrived
        if (!whole) take_split_sums<Cfg, true>(block, acc, ct);
        if (ct == 0) {
          runtime::trace_mark(ep, id, runtime::kTraceMark2);  // thread 0 holds the sums
          cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(ep.arrivals[t.arrive]).fetch_add(
              uint32_t(slices), cuda::memory_order_relaxed);  // the group's count for this launch
        }
        signal = uint32_t(o.split);
        stores = true;
      } else {
        add_split_partials<Cfg>(block, acc, ct);
        if (handoffs++) named_bar_sync(kBarArrivalFree, kArrivalThreads);
        if (ct == 0) g_arrival = SplitArrival{t.arrive, id, uint32_t(slices)};
        named_bar_arrive(kBarArrival, kArrivalThreads);
        return;
      }
    } else {
      if (!whole) add_split_partials<Cfg>(block, acc, ct);
      named_bar_sync(1, kConsumers);
      if (ct == 0) *flag = runtime::arrive_last(ep, epoch, t, o.split, uint32_t(slices));
      named_bar_sync(1, kConsumers);
      if (ct == 0) runtime::trace_mark(ep, id, runtime::kTraceMark1);  // arrived
      if (*flag && !whole) take_split_sums<Cfg>(block, acc, ct);
      if (*flag && ct == 0) runtime::trace_mark(ep, id, runtime::kTraceMark2);  // thread 0 holds the sums
      stores = *flag != 0;
    }
  }
  if (stores) {  // one call site each: one copy of the unrolled stores
    if constexpr (kStagedStores<Cfg>) {
      if (!o.silu && o.n % 8 == 0) store_tile_staged<Cfg, kAct>(o, t, acc, ct, scratch);
      else store_tile<Cfg, kAct>(o, t, acc, ct);
    } else {
      store_tile<Cfg, kAct>(o, t, acc, ct);
    }
  }
  if (o.publish) ptx::fence_proxy_async(ptx::space_global);  // our stores, before a TMA elsewhere reads them
  named_bar_sync(1, kConsumers);
  if (ct == 0 && !split) runtime::trace_mark(ep, id, runtime::kTraceMark2);  // stored (a split tile's: summed)
  if (ct == 0) {
    // (else no tile of the launch reads this output)
    if (o.publish) runtime::release_signal(ep, t, cuda::memory_order_release, signal);
    runtime::trace_mark(ep, id, runtime::kTraceDone);
  }
}

template <class Cfg, bool kAct>
__device__ void run_consumer(const Ring<Cfg>& ring, TileQueue& q, const runtime::ExecParams& ep, const Chain& cp,
                             const runtime::BlockSlots& slots, volatile uint32_t* flag, uint8_t* scratch,
                             bool arrivals) {
  const int wg = threadIdx.x / 128 - 1, ct = threadIdx.x - 128;
  int handoffs = 0;
  PipeState<Cfg> ps;
  int qs = 0;
  uint32_t qphase = 0;
  float acc[Cfg::kAcc];
  int slices = 0;  // K slices of the current output tile summed in acc so far
  for (;;) {
    mbar_wait(&q.full[qs], qphase, "queue full");
    const DeviceTile t = q.tile[qs];
    const int32_t id = q.id[qs];
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive(&q.empty[qs]);
    if (++qs == kQueue) qs = 0, qphase ^= 1;
    if (t.op < 0) {
      if (arrivals) {  // warp 2's last entry
        if (handoffs) named_bar_sync(kBarArrivalFree, kArrivalThreads);
        if (ct == 0) g_arrival.arrive = -1;
        named_bar_arrive(kBarArrival, kArrivalThreads);
      }
      break;
    }
    const uint32_t epoch = slots.epoch;  // written before the producer's first queue entry
    if (ct == 0) runtime::trace_mark(ep, id, runtime::kTraceStarted);
    const OpArgs& o = cp.ops[t.op];
    consume_tile(ring, ps, wg, stages_of(o, t), acc, slices > 0);
    slices += slices_of(o, t);
    if (ct == 0) runtime::trace_mark(ep, id, runtime::kTraceComputed);
    // Tickets of several tiles (stream-K, Schedule::units): when this block's next tile is the next
    // K slice of the same output tile, acc keeps summing and this slice has no epilogue. The entry
    // is there soon: the producer queues a tile before anything it waits for (its ring slots are
    // free: this tile's stages are all consumed), and queues -1 after the last. (Schedules of one
    // tile a ticket do not look: their epilogue then starts without waiting for the next ticket.)
    if (ep.units && o.split > 1) {
      mbar_wait(&q.full[qs], qphase, "queue next");
      const DeviceTile& n = q.tile[qs];
      if (n.op == t.op && n.tm == t.tm && n.tn == t.tn && n.ks == t.ks + 1) {
        if (ct == 0) runtime::trace_mark(ep, id, runtime::kTraceDone);  // folded into the next slice
        continue;
      }
    }
    finish_tile<Cfg, kAct>(ep, epoch, o, t, id, acc, ct, flag, slices, scratch, arrivals, handoffs);
    slices = 0;
  }
}
// Warp 2 with Chain::split_finisher: the arrivals the consumers hand it (SplitArrival), in order.
// The consumers' reductions reach it through the barrier; its release makes them visible at GPU
// scope before the count (cumulativity), as thread 0's after the consumers' barrier does otherwise.
__device__ void run_split_arrivals(const runtime::ExecParams& ep) {
  for (;;) {
    named_bar_sync(kBarArrival, kArrivalThreads);
    const SplitArrival a = g_arrival;
    if (a.arrive < 0) break;
    named_bar_arrive(kBarArrivalFree, kArrivalThreads);
    if (threadIdx.x % 32 == 0) {
      // Tests: a finisher that skips its wait reads missing sums (the delay's hash takes the counter).
      runtime::stress_delay(ep, DeviceTile{0, 0, a.arrive, 0, 0, 0, 0, a.arrive}, true);
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(ep.arrivals[a.arrive]).fetch_add(a.slices,
                                                                                             cuda::memory_order_release);
      runtime::trace_mark(ep, a.id, runtime::kTraceMark1);  // arrived
      runtime::trace_mark(ep, a.id, runtime::kTraceDone);
    }
  }
}
#endif  // TW_SM90_ENABLED

template <class Cfg, bool kAct>
__global__ void __launch_bounds__(kThreads, 1)
    ffn_sm90_kernel(const __grid_constant__ Maps maps, const runtime::ExecParams ep, const __grid_constant__ Chain cp) {
#if TW_SM90_ENABLED
  static_assert(Cfg::kThreads == kThreads && Cfg::kBW == kTileRows, "one producer + two consumer warpgroups");
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ runtime::BlockSlots slots;
  __shared__ TileQueue q;
  __shared__ runtime::TicketHandoff handoff;
  __shared__ uint32_t flag;
  __shared__ __align__(16) uint8_t scratch[kStagedStores<Cfg> ? Cfg::kConsumerWarps * kStageWarpBytes : 16];
  const Ring<Cfg> ring = Ring<Cfg>::carve(smem);
  if (threadIdx.x == 0) {
    ring.init();
    for (int i = 0; i < kQueue; ++i) {
      mbar_init(&q.full[i], 1);
      mbar_init(&q.empty[i], Cfg::kConsumerWarps);
    }
    runtime::init_ticket_handoff(handoff);
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    if (!cp.ops[0].w_packed) {  // packed weights are read by plain bulk copies: no weight maps
      tma_prefetch_desc(&maps.w0);
      tma_prefetch_desc(&maps.w1);
    }
    tma_prefetch_desc(&maps.x);
    tma_prefetch_desc(&maps.h);
    runtime::first_ticket<true>(ep, slots);  // the epoch is read by the producer, after the grid wait
    // The next kernel in the stream may start as soon as SMs free up (if launched to overlap):
    // its blocks only take SMs that this launch's blocks have left.
    runtime::allow_next_launch();
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp < 4) {
    // The producer's registers go to the consumers (setmaxnreg is per warpgroup).
    setmaxnreg_dec<56>();
    if (warp == 0) run_producer(ring, q, maps, ep, cp, slots, handoff);
    else if (warp == 1) runtime::run_ticket_warp<true>(ep, slots, handoff);
    else if (warp == 2 && cp.split_finisher) run_split_arrivals(ep);
  } else {
    setmaxnreg_inc<224>();
    runtime::grid_dependency_wait();  // the consumers' stores come after the previous kernel
    run_consumer<Cfg, kAct>(ring, q, ep, cp, slots, &flag, scratch, cp.split_finisher != 0);
  }
  runtime::end_launch(ep, slots);
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without wgmma: the host never dispatches here
#endif
}

template <int kMPad>
using CfgFor = sm90::MainloopConfig<kMPad, sm90::stage_cols_for(kMPad) / 64>;

template <class F>
void with_config(int act_rows, F&& f) {
  switch (act_rows) {
    case 8: f(CfgFor<8>{}); break;
    case 16: f(CfgFor<16>{}); break;
    case 32: f(CfgFor<32>{}); break;
    case 64: f(CfgFor<64>{}); break;
    case 96: f(CfgFor<96>{}); break;
    case 128: f(CfgFor<128>{}); break;
    case 160: f(CfgFor<160>{}); break;
    case 192: f(CfgFor<192>{}); break;
    case 224: f(CfgFor<224>{}); break;
    case 256: f(CfgFor<256>{}); break;
    default: throw InvalidArgument("FFN sm90: no tile for " + std::to_string(act_rows) + " activation rows");
  }
}

}  // namespace

// One thread per 16-byte chunk of the packed layout (ffn_sm90.hpp); grid-stride.
__global__ void pack_weights_kernel(const int4* w, int4* out, int64_t rows, int64_t cols, int64_t atoms, int64_t chunks,
                                    bool pairs) {
  const int64_t row_chunks = cols / 8;
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    const int phys = int(c % 8), r = int(c / 8 % kTileRows);
    const int64_t a = c / (8 * kTileRows) % atoms, tile = c / (8 * kTileRows * atoms);
    const int64_t col_chunk = a * 8 + (phys ^ (r % 8));  // the 128-B swizzle: chunk j of row r sits at j ^ (r % 8)
    int64_t src = -1;
    if (pairs) {  // group g = r / 16: 8 gate rows, then the same columns' 8 up rows
      const int64_t col = tile * (kTileRows / 2) + (r / 16) * 8 + r % 8;
      if (col < rows) src = (r % 16 < 8 ? 0 : rows) + col;
    } else if (tile * kTileRows + r < rows) {
      src = tile * kTileRows + r;
    }
    out[c] = src >= 0 && col_chunk < row_chunks ? w[src * row_chunks + col_chunk] : make_int4(0, 0, 0, 0);
  }
}

int64_t packed_atoms(int64_t cols) { return ((cols + 63) / 64 + 1) / 2 * 2; }
int64_t packed_tiles(int64_t rows, bool pairs) {
  const int64_t per = pairs ? kTileRows / 2 : kTileRows;
  return (rows + per - 1) / per;
}

void pack_weights(const bf16* w, bf16* out, int64_t rows, int64_t cols, bool pairs, cudaStream_t stream) {
  const int64_t chunks = packed_tiles(rows, pairs) * packed_atoms(cols) * kTileRows * 8;
  const int blocks = int(std::min<int64_t>((chunks + 255) / 256, 132 * 16));
  pack_weights_kernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const int4*>(w), reinterpret_cast<int4*>(out), rows,
                                                  cols, packed_atoms(cols), chunks, pairs);
  TW_CUDA_CHECK_LAUNCH();
}

int prepare_kernel(int act_rows) {
  int bytes = 0;
  with_config(act_rows, [&](auto cfg) {
    using Cfg = decltype(cfg);
    static const bool once = [] {
      TW_CUDA_CHECK(cudaFuncSetAttribute(ffn_sm90_kernel<Cfg, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
      TW_CUDA_CHECK(cudaFuncSetAttribute(ffn_sm90_kernel<Cfg, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
      return true;
    }();
    (void)once;
    bytes = Cfg::kSmemBytes;
  });
  return bytes;
}

CUtensorMap weight_map(const bf16* w, int64_t rows, int64_t cols) {
  return sm90::make_tensor_map_bf16(w, uint64_t(rows), uint64_t(cols), kTileRows, false);
}
CUtensorMap gate_up_map(const bf16* w_gate_up, int64_t f, int64_t cols) {
  return sm90::make_paired_rows_map_bf16(w_gate_up, uint64_t(f), uint64_t(cols), kTileRows / 16);
}
CUtensorMap act_map(const bf16* a, int64_t rows, int64_t cols, int act_rows) {
  return sm90::make_tensor_map_bf16(a, uint64_t(rows), uint64_t(cols), uint32_t(act_rows), false);
}

void launch(const runtime::ExecParams& ep, const Maps& maps, const OpArgs (&ops)[2], int act_rows, int grid,
            bool overlap, int ticket_lead, bool split_finisher, cudaStream_t stream) {
  const Chain cp{{ops[0], ops[1]}, overlap ? 1 : 0, ticket_lead, split_finisher ? 1 : 0};
  with_config(act_rows, [&](auto cfg) {
    using Cfg = decltype(cfg);
    const bool act = ops[0].act || ops[1].act;
    runtime::launch_kernel(act ? ffn_sm90_kernel<Cfg, true> : ffn_sm90_kernel<Cfg, false>, dim3(grid), dim3(kThreads),
                           Cfg::kSmemBytes, stream, overlap, maps, ep, cp);
  });
}

}  // namespace tw::ffn_sm90
