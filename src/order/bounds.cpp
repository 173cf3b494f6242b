#include "tileweave/order/bounds.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tw {

int64_t TrafficBounds::best() const {
  int64_t b = compulsory();
  for (const Bound& x : bounds) b = std::max(b, x.bytes);
  return b;
}

// I/O lower bound of the red-blue pebble game for C += A.B (m x k times k x n) with a fast memory of
// s words: the reads have leading-order term 2mnk/sqrt(s) — T. M. Smith, B. Lowery, J. Langou,
// R. A. van de Geijn, "A Tight I/O Lower Bound for Matrix Multiplication", arXiv:1702.02017, which
// sharpens Hong & Kung (STOC 1981) and Irony, Toledo & Tiskin (JPDC 2004). The -2s takes off the
// segment argument's lower-order terms (the fast memory's contents at each segment's start and end),
// keeping the bound on the safe side.
double gemm_read_lower_bound_elems(double m, double n, double k, double s) {
  if (!(s > 0)) throw InvalidArgument("fast memory size must be positive, got " + std::to_string(s));
  return std::max(0.0, 2.0 * m * n * k / std::sqrt(s) - 2.0 * s);
}

TrafficBounds traffic_bounds(const TileGraph& g, const CacheConfig& c) {
  c.validate();
  TrafficBounds out;
  // Compulsory traffic in the model's own units: one pass with a cache that never evicts.
  CacheConfig unbounded = c;
  unbounded.capacity_bytes = std::numeric_limits<int64_t>::max() / 4;
  unbounded.sets = 1;
  unbounded.in_flight = 1;
  unbounded.trace = unbounded.trace_resident = false;
  const TrafficReport once = simulate(g, op_by_op_order(g), unbounded);
  out.compulsory_read = once.dram_read;
  out.compulsory_write = once.dram_write;
  out.bounds.push_back({"compulsory", out.compulsory(),
                        "inputs and weights read once; every written block (outputs, intermediates, split-K "
                        "accumulators) written back once"});

  std::vector<bool> produced(g.tensors().size(), false);
  for (const Tile& t : g.tiles())
    for (const Region& w : t.writes) produced[w.tensor] = true;

  // Pebble bound per GEMM whose operands both come from DRAM (an intermediate operand may never
  // leave the cache, so a consumer GEMM gets no such bound). The fast memory is the cache plus what
  // P tiles hold on chip (accumulators and one K-step of operands each), so the bound stays below
  // the model, whose tiles keep those outside the cache. The other reads and all writes are disjoint
  // I/O and add their compulsory bytes. For a chain this is the GEMM0-side bound: GEMM0's I/O bound
  // + GEMM1's weights read once + every write once (the model writes h back; docs/model.md).
  for (const Op& op : g.ops()) {
    if (op.kind != OpKind::Gemm && op.kind != OpKind::GemmSiluMul) continue;
    if (produced[op.a] || produced[op.b]) continue;
    const double n_eff = op.kind == OpKind::GemmSiluMul ? 2.0 * op.n : double(op.n);
    const double e = g.tensor(op.a).elem_bytes;
    const Tiling& t = op.tiling;
    const double bn_eff = op.kind == OpKind::GemmSiluMul ? 2.0 * t.bn : double(t.bn);
    const double on_chip = double(c.in_flight) * (t.bm * bn_eff + (t.bm + bn_eff) * t.bk);
    const double s_elems = double(c.capacity_bytes) / e + on_chip;
    const double pebble = gemm_read_lower_bound_elems(op.m, n_eff, op.k, s_elems) * e;
    const int64_t operands_once = once.per_tensor[op.a].dram_read + once.per_tensor[op.b].dram_read;
    const int64_t operand_reads = std::max(operands_once, static_cast<int64_t>(std::floor(pebble)));
    const int64_t other_reads = out.compulsory_read - operands_once;
    const bool chain = g.ops().size() > 1;
    out.bounds.push_back(
        {(chain ? "chain:" : "pebble:") + op.name, operand_reads + other_reads + out.compulsory_write,
         "red-blue pebble bound on " + op.name + "'s operand reads (2mnk/sqrt(S) - 2S, Smith et al., arXiv:1702.02017)" +
             (chain ? " + the other ops' inputs once + every write once" : " + every write once")});
  }
  return out;
}

}  // namespace tw
