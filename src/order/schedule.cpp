#include "tileweave/order/schedule.hpp"

#include <algorithm>
#include <numeric>

namespace tw {

void validate(const TileGraph& g, const Schedule& s) {
  const int n = g.num_tiles();
  if (static_cast<int>(s.order.size()) != n)
    throw InvalidArgument("order '" + s.name + "' has " + std::to_string(s.order.size()) + " tiles, the graph has " +
                          std::to_string(n));
  std::vector<int> pos(n, -1);
  for (int i = 0; i < n; ++i) {
    const int t = s.order[i];
    if (t < 0 || t >= n)
      throw InvalidArgument("order '" + s.name + "': position " + std::to_string(i) + " names tile " +
                            std::to_string(t) + ", outside [0, " + std::to_string(n) + ")");
    if (pos[t] >= 0)
      throw InvalidArgument("order '" + s.name + "': tile " + std::to_string(t) + " appears twice (positions " +
                            std::to_string(pos[t]) + " and " + std::to_string(i) + ")");
    pos[t] = i;
  }
  for (int i = 0; i < n; ++i)
    for (int d : g.tile(s.order[i]).deps)
      if (pos[d] > i)
        throw InvalidArgument("order '" + s.name + "': tile " + std::to_string(s.order[i]) + " at position " +
                              std::to_string(i) + " runs before its dependency tile " + std::to_string(d) +
                              " (position " + std::to_string(pos[d]) + ")");
}

Schedule op_by_op_order(const TileGraph& g) {
  Schedule s{"op_by_op", std::vector<int>(g.num_tiles())};
  std::iota(s.order.begin(), s.order.end(), 0);
  return s;
}

Schedule op_by_op_column_order(const TileGraph& g) {
  Schedule s{"op_by_op_column", {}};
  for (const Op& o : g.ops())
    for (int64_t tn = 0; tn < o.grid_n; ++tn)
      for (int64_t tm = 0; tm < o.grid_m; ++tm)
        for (int64_t ks = 0; ks < o.tiling.split_k; ++ks)
          s.order.push_back(g.tile_id(static_cast<int>(&o - g.ops().data()), tm, tn, ks));
  return s;
}

Schedule dataflow_order(const TileGraph& g, const Schedule& base) {
  validate(g, base);
  const int n = g.num_tiles();
  std::vector<int> missing(n);
  std::vector<std::vector<int>> consumers(n);
  for (int t = 0; t < n; ++t) {
    missing[t] = static_cast<int>(g.tile(t).deps.size());
    for (int d : g.tile(t).deps) consumers[d].push_back(t);
  }
  std::vector<int> pos(n);
  for (int i = 0; i < n; ++i) pos[base.order[i]] = i;
  // A tile becomes ready when its last dependency is emitted; ready consumers are emitted right
  // after it, in base order. Tiles with no dependencies are emitted in base order.
  Schedule s{"dataflow(" + base.name + ")", {}};
  s.order.reserve(n);
  std::vector<char> emitted(n, 0);
  std::vector<int> ready;
  auto emit = [&](auto&& self, int t) -> void {
    s.order.push_back(t);
    emitted[t] = 1;
    std::vector<int> now;
    for (int c : consumers[t])
      if (--missing[c] == 0) now.push_back(c);
    std::sort(now.begin(), now.end(), [&](int a, int b) { return pos[a] < pos[b]; });
    for (int c : now) self(self, c);
  };
  for (int t : base.order)
    if (!emitted[t] && missing[t] == 0) emit(emit, t);
  return s;
}

}  // namespace tw
