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
  if (s.units.empty()) return;
  if (s.units.front() != 0 || s.units.back() != n)
    throw InvalidArgument("order '" + s.name + "': its units must start at position 0 and end at " + std::to_string(n) +
                          ", got " + std::to_string(s.units.front()) + " .. " + std::to_string(s.units.back()));
  for (size_t u = 1; u < s.units.size(); ++u)
    if (s.units[u] <= s.units[u - 1])
      throw InvalidArgument("order '" + s.name + "': unit " + std::to_string(u - 1) + " is empty or reversed (positions " +
                            std::to_string(s.units[u - 1]) + " .. " + std::to_string(s.units[u]) + ")");
}

bool split_finisher_last(const TileGraph& g, const Schedule& s) {
  std::vector<int64_t> first(g.ops().size(), -1);  // the op's first block, -1 without split-K
  int64_t blocks = 0;
  for (size_t op = 0; op < g.ops().size(); ++op) {
    const Op& o = g.ops()[op];
    if (o.tiling.split_k > 1) first[op] = blocks, blocks += o.grid_m * o.grid_n;
  }
  std::vector<int64_t> last_ks(blocks, -1), max_ks(blocks, -1);
  for (const int id : s.order) {
    const Tile& t = g.tile(id);
    if (first[t.op] < 0) continue;
    const int64_t b = first[t.op] + t.tm * g.op(t.op).grid_n + t.tn;
    last_ks[b] = t.ks;
    max_ks[b] = std::max(max_ks[b], t.ks);
  }
  return last_ks == max_ks;
}

std::vector<uint8_t> fused_with_next(const TileGraph& g, const Schedule& s) {
  std::vector<uint8_t> f(s.order.size(), 0);
  for (int u = 0; u < s.num_tickets(); ++u)
    for (int i = s.ticket_begin(u); i + 1 < s.ticket_end(u); ++i) {
      const Tile &a = g.tile(s.order[i]), &b = g.tile(s.order[i + 1]);
      f[i] = a.op == b.op && a.tm == b.tm && a.tn == b.tn && b.ks == a.ks + 1 && g.op(a.op).tiling.split_k > 1;
    }
  return f;
}

TicketDealer::TicketDealer(const TileGraph& g, const Schedule& s)
    : s_(s), fused_(fused_with_next(g, s)), whole_(s.order.size(), 0) {
  const int n = static_cast<int>(s.order.size());
  for (int i = 0, end = 0; i < n; i = end) {
    end = i + 1;
    while (fused_[end - 1]) ++end;  // the run [i, end): fused_ is 0 at a ticket's last position
    const Tile& t = g.tile(s.order[i]);
    if (t.ks == 0 && end - i == g.op(t.op).tiling.split_k && end - i > 1) std::fill(whole_.begin() + i, whole_.begin() + end, 1);
  }
}

bool TicketDealer::next(Cursor& c) {
  if (c.pos >= 0 && c.pos + 1 < c.end) {
    c.run_begin = fused_[c.pos] ? c.run_begin : c.pos + 1;
    ++c.pos;
    return true;
  }
  if (next_ticket_ >= s_.num_tickets()) {
    c.pos = -1;
    return false;
  }
  c.pos = c.run_begin = s_.ticket_begin(next_ticket_);
  c.end = s_.ticket_end(next_ticket_++);
  return true;
}

Schedule restrict_schedule(const Schedule& s, const std::vector<uint8_t>& keep) {
  Schedule r{s.name, {}, {}};
  for (int u = 0; u < s.num_tickets(); ++u) {
    const size_t before = r.order.size();
    for (int i = s.ticket_begin(u); i < s.ticket_end(u); ++i)
      if (keep[s.order[i]]) r.order.push_back(s.order[i]);
    if (!s.units.empty() && r.order.size() > before) {
      if (r.units.empty()) r.units.push_back(0);
      r.units.push_back(static_cast<int>(r.order.size()));
    }
  }
  return r;
}

Schedule op_by_op_order(const TileGraph& g) {
  Schedule s{"op_by_op", std::vector<int>(g.num_tiles()), {}};
  std::iota(s.order.begin(), s.order.end(), 0);
  return s;
}

Schedule dataflow_order(const TileGraph& g, const Schedule& base, int lag) {
  validate(g, base);
  if (lag < 0) throw InvalidArgument("dataflow order: lag must be >= 0, got " + std::to_string(lag));
  const int n = g.num_tiles();
  std::vector<int> missing(n), ready_at(n, 0);
  std::vector<std::vector<int>> consumers(n);
  for (int t = 0; t < n; ++t) {
    missing[t] = static_cast<int>(g.tile(t).deps.size());
    for (int d : g.tile(t).deps) consumers[d].push_back(t);
  }
  std::vector<int> pos(n);
  for (int i = 0; i < n; ++i) pos[base.order[i]] = i;
  // Consumers whose producers are all emitted wait in `pending` (by base position) until the
  // output has grown `lag` past their last producer; tiles with no dependencies keep base order.
  Schedule s{lag ? "dataflow(" + base.name + ", lag " + std::to_string(lag) + ")" : "dataflow(" + base.name + ")", {}, {}};
  s.order.reserve(n);
  std::vector<int> pending;  // a min-heap on base position
  auto by_pos = [&](int a, int b) { return pos[a] > pos[b]; };
  auto emit = [&](int t) {
    s.order.push_back(t);
    for (int c : consumers[t])
      if (--missing[c] == 0) {
        ready_at[c] = static_cast<int>(s.order.size()) + lag;
        pending.push_back(c);
        std::push_heap(pending.begin(), pending.end(), by_pos);
      }
  };
  auto flush = [&](bool all) {
    // Emit every pending consumer whose lag has passed, earliest base position first.
    for (bool progress = true; progress;) {
      progress = false;
      std::vector<int> later;
      while (!pending.empty()) {
        std::pop_heap(pending.begin(), pending.end(), by_pos);
        const int c = pending.back();
        pending.pop_back();
        if (all || ready_at[c] <= static_cast<int>(s.order.size())) {
          emit(c);
          progress = true;
        } else {
          later.push_back(c);
        }
      }
      for (int c : later) {
        pending.push_back(c);
        std::push_heap(pending.begin(), pending.end(), by_pos);
      }
    }
  };
  for (int t : base.order) {
    flush(false);
    if (missing[t] == 0 && g.tile(t).deps.empty()) emit(t);
  }
  flush(true);
  return s;
}

}  // namespace tw
