// Presets the CLI and the explorer share: GPUs (L2 size, SM count) and model FFN shapes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

struct GpuPreset {
  std::string name;
  int64_t l2_bytes = 0;
  int sms = 0;
  double read_tbps = 0;  // the streaming-read floor (measured on the lent H200/H100; A100: datasheet x 0.93)
};
// "h100" | "h200" | "a100"; unknown -> InvalidArgument naming it.
GpuPreset gpu_preset(const std::string& name);
std::vector<std::string> gpu_preset_names();

// "llama3-8b" (d 4096, ffn 14336, gated) | "llama3-70b" (8192, 28672, gated) |
// "chain" (the plain two-GEMM chain with the 8B sizes); m rows (tokens).
FfnShape model_preset(const std::string& name, int64_t m);
std::vector<std::string> model_preset_names();

}  // namespace tw
