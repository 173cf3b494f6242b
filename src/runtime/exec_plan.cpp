#include "tileweave/runtime/exec_plan.hpp"

#include <algorithm>

namespace tw {

const char* to_string(SyncPolicy p) {
  switch (p) {
    case SyncPolicy::Tile: return "tile";
    case SyncPolicy::Row: return "row";
    case SyncPolicy::Strided: return "strided";
  }
  return "?";
}

SyncPolicy parse_sync_policy(const std::string& s) {
  if (s == "tile") return SyncPolicy::Tile;
  if (s == "row") return SyncPolicy::Row;
  if (s == "strided") return SyncPolicy::Strided;
  throw InvalidArgument("unknown sync policy '" + s + "' (expected tile, row or strided)");
}

ExecPlan make_exec_plan(const TileGraph& g, const Schedule& s, const std::map<int, SyncSpec>& policy) {
  validate(g, s);
  for (const auto& [op, spec] : policy) {
    if (op < 0 || op >= static_cast<int>(g.ops().size()))
      throw InvalidArgument("sync policy given for op " + std::to_string(op) + ", which does not exist");
    if (spec.policy == SyncPolicy::Strided && spec.stride < 1)
      throw InvalidArgument("strided sync needs stride >= 1, got " + std::to_string(spec.stride));
  }
  ExecPlan p;
  p.order.assign(s.order.begin(), s.order.end());
  p.units.assign(s.units.begin(), s.units.end());
  p.tiles.resize(g.num_tiles());

  // Counter layout per op: signal counters [sig_base, sig_base + n), arrival counters likewise.
  struct OpCounters {
    int sig_base, arr_base;
    SyncSpec spec;
    uint32_t per_counter;  // signals each counter receives per launch
  };
  std::vector<OpCounters> oc(g.ops().size());
  for (size_t i = 0; i < g.ops().size(); ++i) {
    const Op& o = g.op(static_cast<int>(i));
    auto it = policy.find(static_cast<int>(i));
    SyncSpec spec = it == policy.end() ? SyncSpec{} : it->second;
    int n = 0;
    uint32_t per = static_cast<uint32_t>(o.tiling.split_k);
    switch (spec.policy) {
      case SyncPolicy::Tile: n = static_cast<int>(o.grid_m * o.grid_n); break;
      case SyncPolicy::Row:
        n = static_cast<int>(o.grid_m);
        per *= static_cast<uint32_t>(o.grid_n);
        break;
      case SyncPolicy::Strided: {
        const int64_t st = std::min<int64_t>(spec.stride, o.grid_n);
        spec.stride = static_cast<int>(st);
        n = static_cast<int>(o.grid_m * st);
        break;  // per-counter counts differ when stride does not divide grid_n: computed below
      }
    }
    oc[i] = {p.num_signal_counters, p.num_arrive_counters, spec, per};
    p.num_signal_counters += n;
    if (o.tiling.split_k > 1) p.num_arrive_counters += static_cast<int>(o.grid_m * o.grid_n);
  }
  auto signal_of = [&](const Tile& t) {
    const Op& o = g.op(t.op);
    const OpCounters& c = oc[t.op];
    switch (c.spec.policy) {
      case SyncPolicy::Tile: return c.sig_base + static_cast<int>(t.tm * o.grid_n + t.tn);
      case SyncPolicy::Row: return c.sig_base + static_cast<int>(t.tm);
      case SyncPolicy::Strided: return c.sig_base + static_cast<int>(t.tm * c.spec.stride + t.tn % c.spec.stride);
    }
    return -1;
  };
  std::vector<uint32_t> signals_per_counter(p.num_signal_counters, 0);
  for (int id = 0; id < g.num_tiles(); ++id) signals_per_counter[signal_of(g.tile(id))]++;

  // A coarse policy makes a tile wait for more than its dependencies: for every tile of the
  // counter. The no-deadlock argument (runtime/executor.cuh) needs all of them to hold smaller
  // tickets, so a policy/order pair that breaks this is refused here, before any launch.
  std::vector<int> pos(g.num_tiles()), last_signal(p.num_signal_counters, -1);
  for (int i = 0; i < g.num_tiles(); ++i) pos[s.order[i]] = i;
  for (int id = 0; id < g.num_tiles(); ++id) last_signal[signal_of(g.tile(id))] = std::max(last_signal[signal_of(g.tile(id))], pos[id]);

  for (int id = 0; id < g.num_tiles(); ++id) {
    const Tile& t = g.tile(id);
    const Op& o = g.op(t.op);
    DeviceTile& d = p.tiles[id];
    d.op = t.op;
    d.tm = static_cast<int32_t>(t.tm);
    d.tn = static_cast<int32_t>(t.tn);
    d.ks = static_cast<int32_t>(t.ks);
    d.signal = signal_of(t);
    d.arrive = o.tiling.split_k > 1 ? oc[t.op].arr_base + static_cast<int32_t>(t.tm * o.grid_n + t.tn) : -1;
    d.wait_begin = static_cast<int32_t>(p.waits.size());
    std::vector<int> counters;
    for (int dep : t.deps) counters.push_back(signal_of(g.tile(dep)));
    std::sort(counters.begin(), counters.end());
    counters.erase(std::unique(counters.begin(), counters.end()), counters.end());
    for (int c : counters) {
      if (last_signal[c] > pos[id]) {
        const Op& po = g.op(g.tile(s.order[last_signal[c]]).op);
        throw InvalidArgument("order '" + s.name + "' with " + to_string(oc[g.tile(s.order[last_signal[c]]).op].spec.policy) +
                              " sync on op '" + po.name + "': tile " + std::to_string(id) + " (position " +
                              std::to_string(pos[id]) + ") would wait for tile " + std::to_string(s.order[last_signal[c]]) +
                              " at the later position " + std::to_string(last_signal[c]) +
                              " (use tile sync, or an order that finishes each synchronised group first)");
      }
      p.waits.push_back({c, signals_per_counter[c]});
    }
    d.wait_end = static_cast<int32_t>(p.waits.size());
    p.max_waits_per_tile = std::max(p.max_waits_per_tile, d.wait_end - d.wait_begin);
  }
  return p;
}

std::vector<int> run_slices_whole(ExecPlan& p, const TileGraph& g, const std::function<bool(const Tile&)>& whole) {
  if (!p.units.empty()) throw InvalidArgument("run_slices_whole: the plan's tickets already hold several tiles (units)");
  const int n = static_cast<int>(p.order.size());
  std::vector<int> pos(g.num_tiles(), -1), last_signal(p.num_signal_counters, -1);
  for (int i = 0; i < n; ++i) pos[p.order[i]] = i;
  for (int i = 0; i < n; ++i) last_signal[p.tiles[p.order[i]].signal] = i;
  std::vector<char> keep(n, 1);
  for (int id = 0; id < g.num_tiles(); ++id) {
    const Tile& t = g.tile(id);
    const Op& o = g.op(t.op);
    if (o.tiling.split_k < 2 || t.ks != 0 || pos[id] < 0 || !whole(t)) continue;
    std::vector<int> slices;
    int first = n;
    for (int64_t ks = 0; ks < o.tiling.split_k; ++ks) {
      slices.push_back(g.tile_id(t.op, t.tm, t.tn, ks));
      first = std::min(first, pos[slices.back()]);
    }
    // The union of the slices' waits; every counter in it complete before the ticket at `first`
    // (the executor's no-deadlock argument: a ticket waits only for smaller ones). The tile's own
    // consumers came after its last slice, so after `first` too.
    std::vector<WaitEntry> waits;
    for (int s : slices)
      for (int w = p.tiles[s].wait_begin; w < p.tiles[s].wait_end; ++w) {
        const WaitEntry& e = p.waits[w];
        bool seen = false;
        for (const WaitEntry& x : waits) seen |= x.counter == e.counter;
        if (!seen) waits.push_back(e);
      }
    bool ok = true;
    for (const WaitEntry& e : waits) ok &= last_signal[e.counter] < first;
    if (!ok) continue;
    for (int s : slices) keep[pos[s]] = 0;
    keep[first] = 1;
    p.order[first] = id;
    DeviceTile& d = p.tiles[id];
    d.arrive = -1;
    d.wait_begin = static_cast<int32_t>(p.waits.size());
    p.waits.insert(p.waits.end(), waits.begin(), waits.end());
    d.wait_end = static_cast<int32_t>(p.waits.size());
    p.max_waits_per_tile = std::max(p.max_waits_per_tile, d.wait_end - d.wait_begin);
  }
  std::vector<int> moved(n + 1);
  std::vector<int32_t> order;
  for (int i = 0; i < n; ++i) {
    moved[i] = static_cast<int>(order.size());
    if (keep[i]) order.push_back(p.order[i]);
  }
  moved[n] = static_cast<int>(order.size());
  p.order = std::move(order);
  return moved;
}

bool run_whole_units(ExecPlan& p, const TileGraph& g) {
  if (p.units.empty()) return false;
  std::vector<char> whole(g.num_tiles(), 0);  // by the first slice's id
  for (size_t u = 0; u + 1 < p.units.size(); ++u) {
    const int b = p.units[u], e = p.units[u + 1];
    if (e - b == 1) continue;
    const Tile& t = g.tile(p.order[b]);
    if (t.ks != 0 || e - b != g.op(t.op).tiling.split_k) return false;
    for (int i = b; i < e; ++i)
      if (p.order[i] != g.tile_id(t.op, t.tm, t.tn, i - b)) return false;
    whole[p.order[b]] = 1;
  }
  p.units.clear();
  run_slices_whole(p, g, [&](const Tile& t) { return whole[g.tile_id(t.op, t.tm, t.tn, 0)] != 0; });
  return true;
}

}  // namespace tw
