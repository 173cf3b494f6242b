// An ExecPlan uploaded to the GPU, with its counters and launch state. Counters are zeroed once
// here; launches after that need no memset (see runtime/executor.cuh).
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "tileweave/runtime/exec_params.hpp"

namespace tw::runtime {

class DevicePlan {
 public:
  // slots: launch states, one per part of the schedule that runs as a launch of its own (params_range).
  explicit DevicePlan(const ExecPlan& plan, int slots = 2);
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  ExecParams params(uint32_t spin_limit = 0, uint32_t delay_ns = 0) const;
  // Tickets [begin, end) of the schedule with launch state `slot` (< slots()), sharing the counters:
  // kernels that each run part of the schedule (the CuSync-style baseline; a tensor-parallel rank's
  // step between its collectives) synchronise through the same per-tile counters.
  ExecParams params_range(int begin, int end, int slot, uint32_t spin_limit = 0, uint32_t delay_ns = 0) const;
  const ExecPlan& host() const { return plan_; }
  int slots() const { return slots_; }
  // Synchronises the device; nonzero if a bounded wait expired in some launch since the last reset.
  uint32_t error() const;
  // Zeroes counters and state (needed only after an aborted launch).
  void reset();

  // Tile timeline: after enable_trace(), launches of bodies that record it (the sm90 FFN) write
  // each tile's times; read_trace() synchronises and returns the last launch's, in microseconds
  // from its first ticket. Costs a few global stores per tile.
  void enable_trace();
  bool tracing() const { return trace_ != nullptr; }
  struct TileTimes {
    int tile, sm;
    double taken, ready, started, computed, done;  // us; negative: not recorded
    double mark1, mark2;                           // a tile body's own phases (kTraceMark1/2)
  };
  std::vector<TileTimes> read_trace() const;

 private:
  ExecPlan plan_;
  char* mem_ = nullptr;
  size_t counter_bytes_ = 0;
  int slots_ = 2;
  ExecParams p_{};
  unsigned long long* trace_ = nullptr;
};

// CuSync's wait kernel on `stream`: returns once every block of the producer's current launch
// has started (see device_plan.cu).
void launch_wait_for_producer(const ExecParams& producer, const ExecParams& consumer, int producer_blocks,
                              cudaStream_t stream);

}  // namespace tw::runtime
