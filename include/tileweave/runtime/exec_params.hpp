// What the executor kernel reads: the plan's tables in device memory and the launch state.
// Plain C++ (host code fills it); the device side is runtime/executor.cuh.
#pragma once

#include <cstdint>

#include "tileweave/runtime/exec_plan.hpp"

namespace tw::runtime {

struct ExecState {
  uint32_t ticket;
  uint32_t done_blocks;
  uint32_t epoch;
  uint32_t error;    // set when a bounded wait expires (test builds): the launch aborts
  uint32_t started;  // blocks that have started, over all launches (for two-kernel baselines)
};

struct ExecParams {
  const int32_t* order;
  const DeviceTile* tiles;
  // tiles[order[i]] at i: a ticket's descriptor in one load beside order[i], not a second round trip
  // after it (a round trip costs 1-3 us from an SM with bulk copies in flight: runtime/ticket_warp.cuh).
  const DeviceTile* ordered;
  const WaitEntry* waits;
  uint32_t* signals;   // one per signal counter
  uint32_t* arrivals;  // one per split-K group
  ExecState* state;
  int32_t num_tiles;
  // Tickets of several tiles (Schedule::units): ticket u runs positions [units[u], units[u + 1]) of
  // `order` on one block; null: ticket i is position i.
  const int32_t* units;
  int32_t num_units;
  uint32_t spin_limit;  // 0: wait forever (benchmarks); else abort after this many polls
  uint32_t delay_ns;    // stress mode: producers sleep up to this long before signalling
  // Optional timeline (DevicePlan::enable_trace): kTraceWords words per tile id, see TraceWord.
  unsigned long long* trace;
};

// Per tile, in %globaltimer nanoseconds except the SM: where the tile ran and when it was taken
// (its ticket came up), had its dependencies met, was picked up by the block's compute threads,
// finished its math (the epilogue follows), and published its output.
// kTraceMark1/2: phases inside a tile body, its own to define (the decode step's: see decode_step_kernel.cuh).
enum TraceWord { kTraceSm, kTraceTaken, kTraceReady, kTraceStarted, kTraceComputed, kTraceDone, kTraceMark1, kTraceMark2, kTraceWords };

}  // namespace tw::runtime
