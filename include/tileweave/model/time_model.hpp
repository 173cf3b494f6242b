// Predicted time of a replayed schedule: per op a roofline over its DRAM bytes (from the traffic
// model) and FLOPs (from the tile graph), cut into waves of P tiles so the last, partial wave is
// charged what it really costs; per chain the same over all ops in one launch (the executor
// overlaps consecutive ops, so only the last op's tail is exposed) or op by op in separate launches.
// docs/model.md ("Predicted time") works an example.
#pragma once

#include <string>
#include <vector>

#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"

namespace tw {

struct TimeParams {
  double read_tbps = 0;       // DRAM floor (read and write bytes both move at it)
  double gemm_tflops = 0;     // compute peak
  double sm_stream_gbps = 0;  // one SM's streaming rate: a wave of r tiles moves at most r times this
  double launch_us = 0;       // per launch
  int slots = 0;              // P: tiles in flight (one per SM for the executor)
  void validate() const;      // InvalidArgument naming the bad value
};
TimeParams time_params(const GpuPreset& gpu, int slots);

struct OpTime {
  std::string name;
  int tiles = 0;
  double bytes = 0, flops = 0;
  double intensity = 0;       // FLOP per DRAM byte
  bool compute_bound = false; // intensity above the ridge point (gemm_tflops / read_tbps)
  double waves = 0;           // tiles / P
  double tail_efficiency = 1; // tiles / (ceil(waves) * P): the share of the last wave's slots in use
  double memory_us = 0, compute_us = 0;  // bytes at the floor, FLOPs at the peak (no waves)
  double us = 0;              // wave by wave: max(memory, compute) of each wave, the tail at its own rate
};

struct TimePrediction {
  std::vector<OpTime> ops;
  double ridge = 0;        // FLOP per byte where memory and compute time are equal
  double fused_us = 0;     // one launch: roofline over all ops + the last op's tail + one launch cost
  double separate_us = 0;  // op by op: sum of op times + one launch cost each
};

// From a report of simulate() (its per_op).
TimePrediction predict_time(const TrafficReport& r, const TimeParams& p);

// One op's time from its totals: tiles of equal share, `tiles` / P waves.
OpTime op_time(const std::string& name, int tiles, double bytes, double flops, const TimeParams& p);

}  // namespace tw
