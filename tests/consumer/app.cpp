// Builds a small FFN's tile graph, simulates two orders over a small cache and checks the result
// against the lower bound, through the installed headers and library only. Exits 1 on a wrong result.
#include <cstdio>

#include "tileweave/order/bounds.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/model/cache_model.hpp"

int main() {
  const tw::FfnShape shape{64, 512, 1024, true};
  const tw::FfnGraph g = tw::build_ffn_graph(shape, {{32, 64, 64, 1, {}}, {32, 64, 64, 1, {}}});
  tw::CacheConfig cache;
  cache.capacity_bytes = 256 << 10;
  cache.in_flight = 4;
  const int64_t bound = tw::traffic_bounds(g.graph, cache).best();
  for (const char* spec : {"row_major", "dataflow/col_major"}) {
    const tw::TrafficReport r = tw::simulate(g.graph, tw::make_order(g.graph, spec), cache);
    std::printf("%-20s %10lld B DRAM (bound %lld B)\n", spec, static_cast<long long>(r.dram_total()),
                static_cast<long long>(bound));
    if (r.dram_total() < bound || r.dram_total() <= 0) {
      std::fprintf(stderr, "consumer: %s moved %lld B, below the bound %lld B\n", spec,
                   static_cast<long long>(r.dram_total()), static_cast<long long>(bound));
      return 1;
    }
  }
  try {
    tw::make_order(g.graph, "no_such_order");
  } catch (const tw::InvalidArgument& e) {
    std::printf("bad order rejected: %s\n", e.what());
    return 0;
  }
  std::fprintf(stderr, "consumer: an unknown order was accepted\n");
  return 1;
}
