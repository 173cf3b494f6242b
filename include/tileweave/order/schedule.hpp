// A schedule: the order in which tiles run. Ticket i of the GPU executor runs tile order[i], and the
// traffic model simulates the same sequence.
#pragma once

#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

struct Schedule {
  std::string name;
  std::vector<int> order;  // tile ids
};

// Throws InvalidArgument naming the first offending position/tile unless `s` is a permutation of
// the graph's tiles in which every tile comes after all of its dependencies.
void validate(const TileGraph& g, const Schedule& s);

// Ops one after another, each op's tiles in id order (row-major over (tm, tn, ks)).
Schedule op_by_op_order(const TileGraph& g);

// Dataflow: every tile moved to just after the last of its dependencies, otherwise keeping the
// order of `base` (stable). In an FFN the down-projection tiles of a K slice then follow the
// gate/up tiles that produce that slice, instead of waiting for the whole first GEMM.
// With lag L > 0 a consumer comes at least L positions after its last producer: on a GPU running
// L tiles at once, a consumer placed closer would only wait for producers still in flight.
Schedule dataflow_order(const TileGraph& g, const Schedule& base, int lag = 0);

}  // namespace tw
