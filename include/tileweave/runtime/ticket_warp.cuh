// The ticket warp (Hopper bodies): a warp of its own draws each block's next ticket, so that the
// producer warp never waits for the draw's round trips.
//
// Why: a draw is three dependent L2 round trips (the ticket counter's atomic, the order entry, the
// tile descriptor), and on the H200 a round trip from an SM with bulk copies in flight costs 1-3 us
// instead of 0.3 (bench_sync_latency). Drawn by the producer after it had issued a tile's last
// stage, the next tile's first stage went out ~6 us later (FusedFfn, M = 1, tile timelines), by
// when the ring had drained: every tile paid a hole in its SM's stream. Here the producer asks for
// the next ticket `lead` stages before its current tile's last one is issued, and finds it drawn.
//
// Protocol (lane 0 of each warp; two mbarriers of count 1, `want` and `full`): the ticket warp
// puts the block's first ticket (first_ticket, already in the slots) and then each next one into
// BlockSlots::next and arrives on `full`; the producer waits on `full`, copies the slot, and
// arrives on `want` exactly once per valid ticket it took (or once when it gives up on an aborted
// launch), which lets the ticket warp overwrite the slot with the next draw. The ticket warp stops
// after it has put -1 (no tickets left, or the launch flagged failed).
//
// No deadlock: the block still holds its tickets in increasing order and runs them in that order
// (the draw only happens earlier, while the current tile's last stages are issued), which is all
// the executor's argument (runtime/executor.cuh) asks of a block.
#pragma once

#include <cstdint>

#include "tileweave/kernels/sm90/arch.cuh"
#include "tileweave/runtime/executor.cuh"

namespace tw::runtime {

struct TicketHandoff {
  uint64_t want, full;
};

#if TW_SM90_ENABLED
// One thread, before the block's first __syncthreads.
__device__ __forceinline__ void init_ticket_handoff(TicketHandoff& h) {
  sm90::mbar_init(&h.want, 1);
  sm90::mbar_init(&h.full, 1);
}

// The ticket warp's role (lane 0 works; the other lanes return).
template <bool kTickets>
__device__ void run_ticket_warp(const ExecParams& p, BlockSlots& s, TicketHandoff& h) {
  if (threadIdx.x % 32 != 0) return;
  sm90::mbar_arrive(&h.full);  // the first ticket
  for (uint32_t phase = 0; s.next_id >= 0; phase ^= 1) {
    sm90::mbar_wait(&h.want, phase, "ticket wanted");
    if (p.spin_limit && *reinterpret_cast<volatile uint32_t*>(&p.state->error)) s.next_id = -1;
    else prefetch_next<kTickets>(p, s);
    sm90::mbar_arrive(&h.full);
  }
}

// The producer's side, lane 0: waits for the next ticket (then in s.next / s.next_id).
__device__ __forceinline__ void take_handed_ticket(TicketHandoff& h, uint32_t& phase) {
  sm90::mbar_wait(&h.full, phase, "ticket drawn");
  phase ^= 1;
}
// Lane 0, once per ticket taken: the slot may be refilled.
__device__ __forceinline__ void want_next_ticket(TicketHandoff& h) { sm90::mbar_arrive(&h.want); }
#endif

}  // namespace tw::runtime
