#include "tileweave/graph/gemm_graph.hpp"

namespace tw {

GemmGraph build_gemm_graph(int64_t m, int64_t n, int64_t k, const Tiling& t, int elem_bytes) {
  GemmGraph g;
  g.a = g.graph.add_tensor("A", m, k, elem_bytes, TensorRole::Input);
  g.b = g.graph.add_tensor("B", n, k, elem_bytes, TensorRole::Weight);
  g.c = g.graph.add_tensor("C", m, n, elem_bytes, TensorRole::Output);
  g.op = g.graph.add_gemm("gemm", g.a, g.b, g.c, t);
  return g;
}

}  // namespace tw
