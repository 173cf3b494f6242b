// Predicted time of a schedule: the executor's launch replayed tile by tile. P slots (one resident
// tile per SM) take tickets in schedule order; a tile pays a fixed latency (its first stages' loads,
// the epilogue), waits for its producers, then runs its K-steps at the slower of the mainloop's
// compute rate and its share of DRAM (the op's bytes from the traffic model, the floor shared by the
// tiles streaming at the time, at most one SM's streaming rate each); a split-K slice then adds its
// fp32 partial sums into its output block at the L2's reduction rate (all slices of the launch share
// it), and the last slice of a block reads the sums back (or, on the sm90 body's larger tiles, the
// slice of the last K range: TimeParams::split_finisher_rows). Per op the roofline summary (bytes at the
// floor vs FLOPs at the GEMM peak, waves and the tail) describes why. docs/model.md ("Predicted time")
// gives the constants, what they were fitted to and worked examples.
#pragma once

#include <string>
#include <vector>

#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

struct TimeParams {
  double read_tbps = 0;       // DRAM floor (read and write bytes both move at it)
  double gemm_tflops = 0;     // GEMM peak of the roofline (the ridge point is gemm_tflops / read_tbps)
  double sm_stream_gbps = 0;  // one SM's streaming rate: r tiles streaming move at most r times this
  double launch_us = 0;       // per launch
  int slots = 0;              // P: tiles in flight (one per SM for the executor)
  // The tile replay (GpuPreset says what each was fitted to):
  double tile_tflops = 0;     // the mainloop's rate with all P slots busy: a tile's K-step takes its
                              // FLOPs / (tile_tflops / P); 0 = gemm_tflops
  double tile_fixed_us = 0;   // per tile: first stages' load latency + epilogue, not hidden by the ring
  double tile_fixed_base_us = -1;  // a GEMM tile of bm rows: base + (tile_fixed_us - base) * min(bm, 256) / 256
                                   // (the epilogue grows with the rows; -1: tile_fixed_us for every tile)
  double reduce_tbps = 0;     // L2's rate for split-K fp32 reductions, shared by the whole launch (0: free)
  double reduce_block_gbps = 0;  // reductions into one output block serialise at this rate (0: no limit)
  double slice_restart_us = 0;   // a run's next K slice (tickets of several tiles) waits this long first
  // Split tiles of more than this many rows (0: none), where the schedule puts each block's slice of
  // the last K range after its others: that slice adds no partial sums, waits for the others' to be
  // served and reads them back; the others' slots go on once their reductions are issued (the sm90
  // body's split finisher). Otherwise the last run of a block to arrive reads the sums back.
  int split_finisher_rows = 0;
  double overlap_power = 0;   // a K-step takes (compute^n + memory^n)^(1/n); 0: max(compute, memory)
  void validate() const;      // InvalidArgument naming the bad value
};
TimeParams time_params(const GpuPreset& gpu, int slots);

struct OpTime {
  std::string name;
  int tiles = 0;
  double bytes = 0, flops = 0;
  double intensity = 0;        // FLOP per DRAM byte
  bool compute_bound = false;  // intensity above the ridge point (gemm_tflops / read_tbps)
  double waves = 0;            // tiles / P
  double tail_efficiency = 1;  // tiles / (ceil(waves) * P): the share of the last wave's slots in use
  double memory_us = 0, compute_us = 0;  // bytes at the floor, FLOPs at the GEMM peak (no waves)
  double roofline_us = 0;      // wave by wave: max(memory, compute) of each wave, the tail at its own rate
  // From the replay (predict_time):
  double reduce_bytes = 0;     // split-K partial sums added at L2 (fp32)
  double us = 0;               // the op replayed alone (its own launch, without the launch cost)
  double start_us = 0, end_us = 0;  // in the one-launch replay: its first ticket taken, its last tile done
};

struct TimePrediction {
  std::vector<OpTime> ops;
  double ridge = 0;        // FLOP per byte where memory and compute time are equal
  double fused_us = 0;     // one launch: the replay of the whole schedule + one launch cost
  double separate_us = 0;  // op by op: each op's replay + one launch cost each
};

// One op's roofline summary from its totals: tiles of equal share, `tiles` / P waves (no replay: `us`,
// `start_us`, `end_us` stay 0).
OpTime op_time(const std::string& name, int tiles, double bytes, double flops, const TimeParams& p);

// The replay of `s` over `g` with the DRAM bytes of `r` (a report of simulate(g, s, ...): its per_op).
TimePrediction predict_time(const TileGraph& g, const Schedule& s, const TrafficReport& r, const TimeParams& p);

// Start and end of every tile in one replay (by tile id), for tests and timelines. `end` is when its
// output is complete (a split-K slice's reductions served; the last slice's read-back done).
struct TileTimes {
  std::vector<double> take, start, end;  // ticket taken, K-steps begin (producers done), output complete
  double makespan = 0;
};
TileTimes replay_tiles(const TileGraph& g, const Schedule& s, const TrafficReport& r, const TimeParams& p);

}  // namespace tw
