// The options every `tileweave` subcommand shares (what to model and on which cache), turned into a
// tile graph and a cache configuration. The explorer's `gui` command may reuse them.
#pragma once

#include <cstdint>
#include <string>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/model/time_model.hpp"

namespace CLI {
class App;
}

namespace tw::cli {

struct ProblemOptions {
  std::string model = "llama3-8b";  // --model, unless --gemm is given
  int64_t m = 16;                   // --m
  int64_t d = 0, ffn = 0;           // --d, --ffn: override the preset's hidden / intermediate size
  std::string gemm;                 // --gemm MxNxK: one GEMM instead of a model FFN
  std::string attention;            // --attention BxL: Llama-3-8B decode attention -> o_proj instead
  std::string dit;  // HxL: the attention half of a DiT block (graph/dit_graph.hpp)
  std::string tile;                 // --tile BMxBNxBK (default 128x128x64, clipped to the problem)
  int64_t split_k = 1;              // --split-k, for the last GEMM (FFN down / the single GEMM)
  std::string gpu = "h200";         // --gpu
  std::string cache;                // --cache: overrides the GPU's L2 size (e.g. 60MiB, 4096)
  int64_t line = 32;                // --line
  int64_t in_flight = 0;            // --p: 0 = the GPU's SM count
  int64_t sets = 1;                 // --sets
  std::string l2_model = "simple";  // --l2-model simple | partitioned
  // Partitioned model's parameters; unset (negative) = the GPU preset's.
  int64_t l2_partitions = -1, l2_ways = -1, l2_far_copies = -1;
  double l2_jitter = -1, l2_skew = -1;
};
void add_problem_options(CLI::App& cmd, ProblemOptions& o);

struct Problem {
  std::string description;  // one line: shapes, tiling, cache
  TileGraph graph;
  CacheConfig cache;
  GpuPreset gpu;
  TimeParams time;  // for predicted times (P = the cache's tiles in flight)
};
// Validates every value (InvalidArgument naming it) and builds the graph.
Problem make_problem(const ProblemOptions& o);

// "60MiB", "4KiB", "1G", "512" -> bytes (K, M, G and their KiB/KB forms are all powers of 1024).
int64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace tw::cli
