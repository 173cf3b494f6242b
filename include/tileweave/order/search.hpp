// Searching for the order with the least DRAM traffic (dram_read + dram_write of simulate()).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

struct ExactOptions {
  int max_tiles = 64;              // graphs with more tiles are refused
  int64_t max_states = 5000000;    // memo entries before giving up (InvalidArgument); ~250 B each
  double time_limit_s = 600;       // 0: none
  std::ostream* progress = nullptr;  // progress lines, e.g. &std::cerr
};
struct ExactResult {
  Schedule best;             // one optimal order
  int64_t traffic = 0;       // its DRAM bytes
  uint64_t num_optimal = 0;  // number of distinct optimal orders (saturates at UINT64_MAX)
  bool count_saturated = false;
  int64_t states = 0;        // distinct (done set, cache state) pairs visited
};
// Exact optimum over every dependency-respecting order, with one tile in flight (P = 1: the cache
// state after a prefix is then all that matters, so a memo over (done tiles, cache contents) is
// exact). Needs c.in_flight == 1.
ExactResult exact_search(const TileGraph& g, const CacheConfig& c, const ExactOptions& o = {});

struct HeuristicOptions {
  double time_limit_s = 10;
  int64_t max_evaluations = 0;  // 0: no cap
  uint64_t seed = 1;
  std::ostream* progress = nullptr;
};
struct HeuristicResult {
  Schedule best;
  int64_t traffic = 0;
  std::string seed_order;  // the best named order, where the search started
  int64_t seed_traffic = 0;
  int64_t evaluations = 0;
};
// Simulated annealing over segment reversals, moves and swaps that keep dependencies, seeded by the
// best named order; returns the best order seen, so never worse than that seed.
HeuristicResult heuristic_search(const TileGraph& g, const CacheConfig& c, const HeuristicOptions& o = {});

}  // namespace tw
