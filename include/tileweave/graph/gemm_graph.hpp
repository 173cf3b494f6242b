// A single GEMM as a tile graph: C[M,N] = A[M,K] . B[N,K]^T (the simplest case for orders/search).
#pragma once

#include "tileweave/graph/tile_graph.hpp"

namespace tw {

struct GemmGraph {
  TileGraph graph;
  int a = -1, b = -1, c = -1, op = -1;
};
GemmGraph build_gemm_graph(int64_t m, int64_t n, int64_t k, const Tiling& t, int elem_bytes = 2);

}  // namespace tw
