// Presets the CLI and the explorer share: GPUs (L2, SM count, bandwidth, GEMM peak and the partitioned
// L2 model's parameters) and model FFN shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/cache_model.hpp"

namespace tw {

struct GpuPreset {
  std::string name;
  int64_t l2_bytes = 0;
  int sms = 0;
  double read_tbps = 0;       // the streaming-read floor (measured on the lent H200/H100; A100: datasheet x 0.93)
  double gemm_tflops = 0;     // bf16 dense GEMM peak, as measured (not the datasheet's)
  double sm_stream_gbps = 0;  // what one SM streams when few do (a wave's tail cannot use the whole floor)
  double launch_us = 0;       // fixed cost of one launch (start, first loads, drain)
  // The time replay's constants (model/time_model.hpp; fitted on the H200, src/model/presets.cpp):
  double tile_tflops = 0;     // the tile mainloop's K-step rate over all SMs (0: gemm_tflops)
  double tile_fixed_us = 0;   // per tile: first stages' latency + epilogue, not hidden by the weight ring
  double tile_fixed_base_us = -1;  // the same for a tile of no rows: a GEMM tile of bm rows takes
                                   // base + (tile_fixed_us - base) * min(bm, 256) / 256 (-1: no such scaling)
  double reduce_tbps = 0;     // split-K fp32 reductions at L2, the whole GPU (0: free)
  double reduce_block_gbps = 0;  // split-K slices adding into the same block serialise at this rate (0: no limit)
  double slice_restart_us = 0;   // a ticket's next K slice of the same block: the stall before its K-steps
  int split_finisher_rows = 0;   // split tiles of more than this many rows are summed by their slice of the
                                 // last K range (the sm90 body's split finisher; 0: by the last to arrive)
  double overlap_power = 0;   // K-step = (compute^n + memory^n)^(1/n) (0: the roofline's max)
  L2Params l2;                // the partitioned L2 model's parameters (--l2-model partitioned)
};
// "h100" | "h200" | "a100"; unknown -> InvalidArgument naming it.
GpuPreset gpu_preset(const std::string& name);
std::vector<std::string> gpu_preset_names();
// The preset for a device as the CUDA runtime names it ("NVIDIA H200" -> h200, an A100 -> a100, any
// other -> h100, the Hopper part whose constants are the H200's), with the device's SM count and L2
// size where given (> 0). For the ops' planners: the ranking of plans, not an absolute time.
GpuPreset gpu_preset_for_device(const std::string& device_name, int sms, int64_t l2_bytes);
// A preset as JSON (what bench/l2_probe writes): {"base": "h200", "l2_bytes": ..., "l2": {"ways": ...}, ...};
// keys left out keep the base preset's values. Unreadable file, bad JSON or bad value -> InvalidArgument.
GpuPreset gpu_preset_from_json(const std::string& json_text, const std::string& what);
// A name, or a path ending in .json (gpu_preset_from_json of the file).
GpuPreset find_gpu_preset(const std::string& name_or_file);

// "llama3-8b" (d 4096, ffn 14336, gated) | "llama3-70b" (8192, 28672, gated) |
// "chain" (the plain two-GEMM chain with the 8B sizes); m rows (tokens).
FfnShape model_preset(const std::string& name, int64_t m);
std::vector<std::string> model_preset_names();

}  // namespace tw
