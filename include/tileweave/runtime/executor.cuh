// The tile executor, device side: persistent blocks take tickets from one atomic counter; ticket i
// runs tile order[i]. Before a tile reads another tile's output it waits on that producer's
// counter (acquire); after it writes, it increments its own counter (release).
//
// No deadlock, by construction. A block takes a ticket only while it is running, so every tile
// that holds a ticket belongs to a running block, and a block that waits holds no resources
// another tile needs. Tickets follow the schedule, a topological order, so a tile's producers have
// smaller tickets. Take the smallest ticket whose tile has not finished: its producers all have
// smaller tickets and so have finished; it is either running (and finishes) or is the prefetched
// next ticket of a block whose current tile has a smaller ticket and is unfinished — impossible by
// minimality. Hence some tile always makes progress. (This holds however many blocks are in the
// grid; the host still refuses grids beyond residency, since blocks that never run are waste.)
//
// Repeated launches need no memset: counters only grow. Launch e waits for `count * (e + 1)`
// signals, with e read from ExecState at block start. The last block to finish bumps the epoch
// and resets the ticket; every block has read the epoch before it finishes, and the next launch
// in the stream reads it only after this one ends, so each launch sees one consistent epoch. This
// also makes launches capturable in CUDA graphs (no per-launch host arguments).
//
// A ticket may hold several tiles (Schedule::units, stream-K): the block runs them one after another,
// and its next tile is then known without the counter. The argument holds over positions: take the
// smallest unfinished position; its producers precede it and are finished; the block holding its
// ticket is running it, or has it next behind a smaller unfinished position of the same ticket, or
// has it prefetched behind its current tile -- both impossible by minimality -- or no block has
// drawn its ticket yet, and then every drawn ticket's tiles before it are finished, so a block draws.
//
// The first wave is static: block b's first ticket is b, and the counter deals tickets from
// gridDim.x on. The argument above is unchanged (every block runs, so tickets 0..grid-1 are held
// by running blocks), and a block knows its first tile without touching the launch state -- which
// lets a launch that overlaps the previous kernel's tail (programmatic dependent launch, below)
// stream its first tile's weights before that kernel has finished.
#pragma once

#include <cuda/atomic>
#include <cstdint>

#include "tileweave/runtime/exec_params.hpp"
#include "tileweave/runtime/grid_dependency.cuh"

namespace tw::runtime {

// Shared-memory slots of the block-level runtime (kept in static shared memory).
struct BlockSlots {
  DeviceTile cur, next;    // descriptors of the current and the prefetched tile
  int32_t cur_id, next_id; // tile ids, -1 when the schedule is exhausted
  uint32_t epoch;
  int32_t flag;
  int32_t next_pos, ticket_end;  // kTickets kernels: the prefetched tile's position, its ticket's end
};

namespace detail {
__device__ __forceinline__ bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;  // wrap-safe
}
// Polls done() with a growing back-off (32 to 256 ns); false once a bounded wait (tests'
// p.spin_limit) has polled that many times in vain.
template <class F>
__device__ __forceinline__ bool poll_until(const ExecParams& p, F&& done) {
  uint32_t polls = 0, backoff = 32;
  while (!done()) {
    __nanosleep(backoff);
    backoff = min(backoff * 2, 256u);
    if (p.spin_limit && ++polls > p.spin_limit) return false;
  }
  return true;
}
// One thread: position pos's tile (or none, pos < 0) into the slots. Both loads are made before
// either store, so they go out together: one round trip.
__device__ __forceinline__ void take_position(const ExecParams& p, BlockSlots& s, int32_t pos) {
  if (pos < 0) {
    s.next_id = -1;
    return;
  }
  const int32_t id = p.order[pos];
  const DeviceTile t = p.ordered[pos];
  s.next_id = id;
  s.next = t;
}
// One thread: ticket u's first tile (or none past the last ticket) into the slots.
template <bool kTickets>
__device__ __forceinline__ void take_ticket(const ExecParams& p, BlockSlots& s, uint32_t u) {
  int32_t pos = u < static_cast<uint32_t>(p.num_tiles) ? static_cast<int32_t>(u) : -1;
  if constexpr (kTickets) {
    if (p.units) {
      pos = u < static_cast<uint32_t>(p.num_units) ? p.units[u] : -1;
      if (pos >= 0) s.ticket_end = p.units[u + 1];
    } else {
      s.ticket_end = pos + 1;
    }
    s.next_pos = pos;
  }
  take_position(p, s, pos);
}
}  // namespace detail

// kTickets: the kernel takes tickets of several tiles (ExecParams::units). A kernel built without
// (the decode step, the sm80 bodies, attention -> o_proj) runs such a schedule one tile a ticket:
// still every tile in order, as the no-deadlock argument needs, only not grouped.

// One thread: the tile after the prefetched one (which the caller has taken as its current tile)
// into the slots: the next of the same ticket, else the first of a ticket drawn from the counter.
template <bool kTickets = false>
__device__ __forceinline__ void prefetch_next(const ExecParams& p, BlockSlots& s) {
  if (kTickets && s.next_pos >= 0 && s.next_pos + 1 < s.ticket_end) {
    detail::take_position(p, s, ++s.next_pos);
    return;
  }
  // Tickets below the grid are static.
  detail::take_ticket<kTickets>(p, s, atomicAdd(&p.state->ticket, 1u) + gridDim.x);
}

// One thread: the block's first tile (ticket blockIdx.x) into the slots. Reads the plan only.
template <bool kTickets = false>
__device__ __forceinline__ void first_ticket(const ExecParams& p, BlockSlots& s) {
  detail::take_ticket<kTickets>(p, s, blockIdx.x);
}

// One thread, after grid_dependency_wait(): reads the launch's epoch and counts the block started.
__device__ __forceinline__ void enter_launch(const ExecParams& p, BlockSlots& s) {
  s.epoch = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(p.state->epoch).load(cuda::memory_order_relaxed);
  atomicAdd(&p.state->started, 1u);
}

// Called once by all threads at kernel start (kernels launched without overlap): the first tile
// and the epoch.
__device__ __forceinline__ void begin_launch(const ExecParams& p, BlockSlots& s) {
  if (threadIdx.x == 0) {
    first_ticket(p, s);
    enter_launch(p, s);
  }
}

// All threads: moves to the prefetched tile (its descriptor is in s.cur afterwards). Returns -1
// when the schedule is exhausted (or the launch aborted). The ticket after it is drawn later, in
// wait_dependencies, while the tile's first weight loads are in flight: the atomic's and the
// descriptor's round trips then hide under the pipeline fill instead of stalling the block.
__device__ __forceinline__ int32_t next_tile(const ExecParams& p, BlockSlots& s) {
  __syncthreads();  // everyone is done with the previous tile's shared memory and slots
  if (threadIdx.x == 0) {
    int32_t t = s.next_id;
    if (t >= 0 && p.spin_limit && *(volatile uint32_t*)&p.state->error) t = -1;
    s.cur_id = t;
    s.cur = s.next;
  }
  __syncthreads();
  return s.cur_id;
}

// One whole warp: one poll of tile t's producer counters, true on every lane if all are reached.
// Lane l reads counters l, l + 32, ... with relaxed loads, kBatch of them in flight at once: an
// o_proj tile after the decode-attention tiles of its heads has hundreds of producers, and acquire
// loads, being ordered one after another, would pay one L2 round trip per 32 counters per poll.
// The default kBatch = 1 keeps the FFN bodies spill-free (4 or 8 spilled in the sm90 producer warp,
// 56 registers after setmaxnreg, and in two sm80 kernels); their tiles have a few dozen producers.
// The attention -> o_proj kernel polls with 8.
// A tile of at most 32 counters (kBatch = 1) is polled with acquire loads, one a lane, and needs no
// fence after; otherwise the loads are relaxed and callers that see true issue the acquire fence
// (acquire_after_poll). The fence is not free: on the H200 a gpu-scope fence waits for every bulk copy
// the SM has in flight (2.6 us behind one 64 KiB copy, 6.5 behind three, with all SMs copying; an
// acquire load costs what a relaxed one does: bench_sync_latency, sync_latency.json), and a producer
// polls right after issuing its tile's weights. Acquire loads of one lane are ordered one after
// another, so a lane with several counters would pay a round trip for each at every poll.
template <int kBatch>
__device__ __forceinline__ bool acquire_loads(const DeviceTile& t) {
  return kBatch == 1 && t.wait_end - t.wait_begin <= 32;
}
template <int kBatch>
__device__ __forceinline__ bool counters_reached_warp(const ExecParams& p, uint32_t epoch, const DeviceTile& t) {
  const cuda::memory_order order = acquire_loads<kBatch>(t) ? cuda::memory_order_acquire : cuda::memory_order_relaxed;
  bool mine = true;
  for (int32_t base = t.wait_begin + int32_t(threadIdx.x % 32); base < t.wait_end; base += 32 * kBatch) {
    uint32_t value[kBatch], target[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int32_t i = base + 32 * j;
      const WaitEntry w = i < t.wait_end ? p.waits[i] : WaitEntry{0, 0};
      target[j] = w.count * (epoch + 1);
      value[j] = cuda::atomic_ref<const uint32_t, cuda::thread_scope_device>(p.signals[w.counter])
                     .load(order);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) mine &= detail::reached(value[j], target[j]);
  }
  return __all_sync(0xffffffffu, mine);
}

// After a poll that saw every counter reached: a relaxed read of a release write followed by an
// acquire fence synchronises with that write, as an acquire load would (acquire loads need no fence).
// The __syncwarp orders every lane's acquire before what any lane does next (e.g. lane 0's copies).
template <int kBatch>
__device__ __forceinline__ void acquire_after_poll(const DeviceTile& t) {
  if (!acquire_loads<kBatch>(t)) cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
  __syncwarp();
}

// One whole warp: waits until tile t's producer counters are reached, then acquires. Returns false
// on every lane if a bounded wait expired (and flags the launch as failed).
template <int kBatch = 1>
__device__ __forceinline__ bool wait_counters_warp(const ExecParams& p, uint32_t epoch, const DeviceTile& t) {
  if (!detail::poll_until(p, [&] { return counters_reached_warp<kBatch>(p, epoch, t); })) {
    if (threadIdx.x % 32 == 0) atomicExch(&p.state->error, 1u);
    __syncwarp();
    return false;
  }
  acquire_after_poll<kBatch>(t);
  return true;
}

// One whole warp: a single poll of tile t's producer counters, true (on every lane) if all have
// been reached -- with the acquire done, as after wait_counters_warp.
template <int kBatch = 1>
__device__ __forceinline__ bool counters_ready_warp(const ExecParams& p, uint32_t epoch, const DeviceTile& t) {
  const bool ready = counters_reached_warp<kBatch>(p, epoch, t);
  if (ready) acquire_after_poll<kBatch>(t);
  return ready;
}

// Called exactly once per tile by all threads, after the tile's weight prologue is issued.
// Warp 0 polls the producer counters; meanwhile thread 32 prefetches the next ticket and its
// descriptor. The barrier then orders every thread's later reads after the acquire. Readers must
// still bypass L1 for produced data (ld.cg / cp.async.cg): L1 is not coherent with other SMs'
// writes. Returns false if a bounded wait expired.
template <int kBatch = 1>
__device__ __forceinline__ bool wait_dependencies(const ExecParams& p, BlockSlots& s, const DeviceTile& t) {
  if (threadIdx.x == 32) prefetch_next(p, s);
  if (threadIdx.x < 32) {
    const bool ok = wait_counters_warp<kBatch>(p, s.epoch, t);
    if (threadIdx.x == 0) s.flag = ok;
  }
  __syncthreads();
  return s.flag != 0;
}

// One thread: stamps word w of tile id's timeline (no-op unless the plan traces).
__device__ __forceinline__ void trace_mark(const ExecParams& p, int32_t id, TraceWord w) {
  if (!p.trace) return;
  unsigned long long v;
  if (w == kTraceSm) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm));
    v = sm;
  } else {
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(v));
  }
  p.trace[int64_t(id) * kTraceWords + w] = v;
}

// Tests (ExecParams::delay_ns): a random sleep before a release. `me`: the calling thread is the
// one that releases (thread 0 unless said).
__device__ __forceinline__ void stress_delay(const ExecParams& p, const DeviceTile& t, bool me = false) {
  if (p.delay_ns && (me || threadIdx.x == 0)) {
    uint32_t h = static_cast<uint32_t>(t.tm * 73856093) ^ static_cast<uint32_t>(t.tn * 19349663) ^
                 static_cast<uint32_t>(t.ks * 83492791) ^ static_cast<uint32_t>(clock64());
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    for (uint32_t ns = h % p.delay_ns; ns > 0; ns -= min(ns, 1000000u)) __nanosleep(min(ns, 1000000u));
  }
}

// One thread, once the tile's writes (by any of the block's threads) are ordered before it by a
// barrier: publishes them on the tile's counter. The release is cumulative, so the writes the
// barrier made visible to this thread become visible at GPU scope before the increment. A tile whose
// writes no reader of the counter needs may count with memory_order_relaxed (no fence).
// `tiles`: how many of the counter's tiles this publishes (a fused run of K slices counts all of them).
__device__ __forceinline__ void release_signal(const ExecParams& p, const DeviceTile& t,
                                               cuda::memory_order order = cuda::memory_order_release,
                                               uint32_t tiles = 1) {
  stress_delay(p, t);
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(p.signals[t.signal]).fetch_add(tiles, order);
}

// All threads, after the tile's global writes: publish them on the tile's counter.
__device__ __forceinline__ void signal_done(const ExecParams& p, const DeviceTile& t) {
  __syncthreads();
  if (threadIdx.x == 0) release_signal(p, t);
}

// One thread, after a barrier that orders the split's partial sums before it: true in the one
// split of the group that arrives last (acquire: it then sees the other splits' sums). `slices`: the
// group's slices this arrival stands for (a fused run of consecutive slices arrives once for all).
__device__ __forceinline__ bool arrive_last(const ExecParams& p, uint32_t epoch, const DeviceTile& t, uint32_t splits,
                                            uint32_t slices = 1) {
  const uint32_t old = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(p.arrivals[t.arrive])
                           .fetch_add(slices, cuda::memory_order_acq_rel);
  return old == splits * (epoch + 1) - slices;
}

// One thread: waits until every other slice of t's split group has arrived in this launch (the group's
// counter at splits * (epoch + 1) - slices), then acquires their sums. For the slice that the schedule
// puts last in its group (FfnOptions::split_finisher), which then counts its own arrival (relaxed).
// False if a bounded wait expired (the launch is flagged failed).
__device__ __forceinline__ bool wait_other_slices(const ExecParams& p, uint32_t epoch, const DeviceTile& t,
                                                  uint32_t splits, uint32_t slices) {
  const uint32_t target = splits * (epoch + 1) - slices;
  cuda::atomic_ref<const uint32_t, cuda::thread_scope_device> count(p.arrivals[t.arrive]);
  if (detail::poll_until(p, [&] { return detail::reached(count.load(cuda::memory_order_acquire), target); })) return true;
  atomicExch(&p.state->error, 1u);
  return false;
}

// All threads, after writing this split's partial sums: true in the one split of the group that
// arrives last, which then reduces the partials.
__device__ __forceinline__ bool arrive_split(const ExecParams& p, BlockSlots& s, const DeviceTile& t, uint32_t splits) {
  __syncthreads();
  if (threadIdx.x == 0) s.flag = arrive_last(p, s.epoch, t, splits);
  __syncthreads();
  return s.flag != 0;
}

// All threads, at kernel end: the last block to finish resets the ticket and bumps the epoch.
__device__ __forceinline__ void end_launch(const ExecParams& p, BlockSlots& s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t old = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(p.state->done_blocks)
                             .fetch_add(1u, cuda::memory_order_acq_rel);
    if (old == gridDim.x - 1) {
      p.state->ticket = 0;
      p.state->done_blocks = 0;
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(p.state->epoch).store(s.epoch + 1, cuda::memory_order_release);
    }
  }
}

}  // namespace tw::runtime
