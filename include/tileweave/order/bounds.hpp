// Lower bounds on DRAM traffic, in the model's units (line-rounded bytes), so that
// bound <= simulate() for every order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/cache_model.hpp"

namespace tw {

struct Bound {
  std::string name;  // "compulsory", "pebble:<op>", "chain"
  int64_t bytes = 0;
  std::string note;
};

struct TrafficBounds {
  int64_t compulsory_read = 0;   // every external input/weight block read once
  int64_t compulsory_write = 0;  // every written block written back once (outputs, intermediates, partials)
  std::vector<Bound> bounds;     // compulsory first; the best (largest) is best()
  int64_t compulsory() const { return compulsory_read + compulsory_write; }
  int64_t best() const;
};

// Red-blue pebble game I/O lower bound on the reads of one GEMM C[m,n] += A[m,k] B[k,n] with a fast
// memory of s_elems elements, in elements: max(0, 2mnk/sqrt(s) - 2s).
double gemm_read_lower_bound_elems(double m, double n, double k, double s_elems);

TrafficBounds traffic_bounds(const TileGraph& g, const CacheConfig& c);

}  // namespace tw
