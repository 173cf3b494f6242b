#include "tileweave/order/schedule.hpp"

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

}  // namespace tw
