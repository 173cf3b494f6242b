#include "tileweave/order/orders.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace tw {

namespace {

struct Spec {
  std::string name;
  int64_t param = 0;  // 0: none given
};

Spec parse_spec(const std::string& spec) {
  Spec s;
  const auto colon = spec.find(':');
  s.name = spec.substr(0, colon);
  if (colon == std::string::npos) return s;
  const std::string arg = spec.substr(colon + 1);
  char* end = nullptr;
  const long long v = std::strtoll(arg.c_str(), &end, 10);
  if (arg.empty() || *end != '\0' || v <= 0 || v > (1 << 20))
    throw InvalidArgument("order '" + spec + "': parameter '" + arg + "' must be a positive integer");
  s.param = v;
  return s;
}

std::string known_orders() {
  std::string s;
  for (const auto& o : order_catalog()) s += (s.empty() ? "" : ", ") + o.spec;
  return s;
}

[[noreturn]] void unknown(const std::string& spec) {
  throw InvalidArgument("unknown order '" + spec + "' (known: " + known_orders() +
                        "; swizzle:<W>, grouped:<G>, chain_rows:<k> take any positive W, G, k; "
                        "<grid>+<grid> gives one grid order per op; dataflow:<lag>/<spec>; kslices/<spec>; "
                        "streamk:<units>/<spec>; waves:<grid>/<spec>)");
}

int64_t floor_div2(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }
int64_t sgn(int64_t v) { return (v > 0) - (v < 0); }

// Generalized Hilbert curve over a rectangle: the region spanned from (x, y) by the major axis
// (ax, ay) and the minor axis (bx, by) is split in two along the major axis when it is long,
// otherwise into three (a U: minor half, major rest, minor half back), choosing even splits so the
// pieces chain end to start. x = column (tn), y = row (tm).
void hilbert(int64_t x, int64_t y, int64_t ax, int64_t ay, int64_t bx, int64_t by, std::vector<Cell>& out) {
  const int64_t w = std::abs(ax + ay), h = std::abs(bx + by);
  const int64_t dax = sgn(ax), day = sgn(ay), dbx = sgn(bx), dby = sgn(by);
  if (h == 1) {
    for (int64_t i = 0; i < w; ++i, x += dax, y += day) out.push_back({y, x});
    return;
  }
  if (w == 1) {
    for (int64_t i = 0; i < h; ++i, x += dbx, y += dby) out.push_back({y, x});
    return;
  }
  int64_t ax2 = floor_div2(ax), ay2 = floor_div2(ay), bx2 = floor_div2(bx), by2 = floor_div2(by);
  const int64_t w2 = std::abs(ax2 + ay2), h2 = std::abs(bx2 + by2);
  if (2 * w > 3 * h) {
    if ((w2 % 2) && w > 2) ax2 += dax, ay2 += day;
    hilbert(x, y, ax2, ay2, bx, by, out);
    hilbert(x + ax2, y + ay2, ax - ax2, ay - ay2, bx, by, out);
  } else {
    if ((h2 % 2) && h > 2) bx2 += dbx, by2 += dby;
    hilbert(x, y, bx2, by2, ax2, ay2, out);
    hilbert(x + bx2, y + by2, ax, ay, bx - bx2, by - by2, out);
    hilbert(x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby), -bx2, -by2, -(ax - ax2), -(ay - ay2), out);
  }
}

uint64_t interleave_bits(uint64_t row, uint64_t col) {
  uint64_t z = 0;
  for (int b = 0; b < 32; ++b) z |= ((row >> b) & 1) << (2 * b + 1) | ((col >> b) & 1) << (2 * b);
  return z;
}

}  // namespace

const std::vector<OrderInfo>& order_catalog() {
  static const std::vector<OrderInfo> catalog = {
      {"row_major", "output tiles row by row (blockIdx.x over N fastest)", false},
      {"col_major", "output tiles column by column", false},
      {"snake", "rows, alternating direction (boustrophedon)", false},
      {"swizzle:2", "CUTLASS GemmIdentityThreadblockSwizzle<2>: bands of 2 tile columns, row by row", false},
      {"swizzle:4", "CUTLASS swizzle, bands of 4 tile columns", false},
      {"swizzle:8", "CUTLASS swizzle, bands of 8 tile columns", false},
      {"grouped:4", "Triton GROUP_M=4: bands of 4 tile rows, column by column", false},
      {"grouped:8", "Triton GROUP_M=8", false},
      {"grouped:16", "Triton GROUP_M=16", false},
      {"hilbert", "generalized Hilbert curve (any grid shape)", false},
      {"morton", "Z-order (bit interleaving of row and column)", false},
      {"chain_rows:1", "a row block of GEMM0, then the GEMM1 tiles it completes", true},
      {"chain_rows:2", "2 row blocks of GEMM0, then the GEMM1 tiles they complete", true},
      {"chain_rows:4", "4 row blocks of GEMM0, then the GEMM1 tiles they complete", true},
      {"chain_half_rows", "half a row block of GEMM0, then the GEMM1 tiles it completes", true},
      {"dataflow/col_major", "column-major op by op, each tile moved up to just after its producers "
                             "(the executor's FFN order; dataflow:<lag>/<spec> for others)", true},
  };
  return catalog;
}

std::vector<Cell> grid_order(const std::string& grid_spec, int64_t gm, int64_t gn) {
  if (gm <= 0 || gn <= 0)
    throw InvalidArgument("grid " + std::to_string(gm) + "x" + std::to_string(gn) + " must be positive");
  const Spec s = parse_spec(grid_spec);
  std::vector<Cell> out;
  out.reserve(gm * gn);
  auto no_param = [&] {
    if (s.param) unknown(grid_spec);
  };
  if (s.name == "row_major") {
    no_param();
    for (int64_t m = 0; m < gm; ++m)
      for (int64_t n = 0; n < gn; ++n) out.push_back({m, n});
  } else if (s.name == "col_major") {
    no_param();
    for (int64_t n = 0; n < gn; ++n)
      for (int64_t m = 0; m < gm; ++m) out.push_back({m, n});
  } else if (s.name == "snake") {
    no_param();
    for (int64_t m = 0; m < gm; ++m)
      for (int64_t i = 0; i < gn; ++i) out.push_back({m, m % 2 ? gn - 1 - i : i});
  } else if (s.name == "swizzle") {
    const int64_t w = s.param ? s.param : 1;
    for (int64_t band = 0; band * w < gn; ++band)
      for (int64_t m = 0; m < gm; ++m)
        for (int64_t j = 0; j < w && band * w + j < gn; ++j) out.push_back({m, band * w + j});
  } else if (s.name == "grouped") {
    // Triton's pid -> (pid_m, pid_n) mapping, applied to pid = 0, 1, 2, ...
    const int64_t group = s.param ? s.param : 1;
    for (int64_t pid = 0; pid < gm * gn; ++pid) {
      const int64_t in_group = group * gn;
      const int64_t first_m = pid / in_group * group;
      const int64_t size_m = std::min(gm - first_m, group);
      out.push_back({first_m + (pid % in_group) % size_m, (pid % in_group) / size_m});
    }
  } else if (s.name == "hilbert") {
    no_param();
    if (gn >= gm)
      hilbert(0, 0, gn, 0, 0, gm, out);
    else
      hilbert(0, 0, 0, gm, gn, 0, out);
  } else if (s.name == "morton") {
    no_param();
    for (int64_t m = 0; m < gm; ++m)
      for (int64_t n = 0; n < gn; ++n) out.push_back({m, n});
    std::stable_sort(out.begin(), out.end(), [](const Cell& a, const Cell& b) {
      return interleave_bits(a.tm, a.tn) < interleave_bits(b.tm, b.tn);
    });
  } else {
    unknown(grid_spec);
  }
  return out;
}

namespace {

void append_cell(const TileGraph& g, int op, const Cell& c, std::vector<int>& order) {
  const Op& o = g.op(op);
  for (int64_t ks = 0; ks < o.tiling.split_k; ++ks) order.push_back(g.tile_id(op, c.tm, c.tn, ks));
}

// The first op in chunks of its row blocks (`half`: each row block in two halves); after each chunk,
// every tile of a later op whose producers are all emitted, in tile id order.
std::vector<int> chain_order(const TileGraph& g, int64_t rows_per_chunk, bool half) {
  const int n = g.num_tiles();
  std::vector<int> missing(n, 0);
  std::vector<std::vector<int>> consumers(n);
  for (int t = 0; t < n; ++t) {
    missing[t] = static_cast<int>(g.tile(t).deps.size());
    for (int d : g.tile(t).deps) consumers[d].push_back(t);
  }
  std::vector<int> order, ready;
  auto emit = [&](int t) {
    order.push_back(t);
    for (int c : consumers[t])
      if (--missing[c] == 0) ready.push_back(c);
  };
  for (int t = g.op(0).num_tiles; t < n; ++t)
    if (missing[t] == 0) ready.push_back(t);
  auto drain = [&] {
    while (!ready.empty()) {
      std::vector<int> now;
      now.swap(ready);
      std::sort(now.begin(), now.end());
      for (int t : now) emit(t);
    }
  };
  const Op& p = g.op(0);
  const int64_t halves = half ? 2 : 1;
  for (int64_t m0 = 0; m0 < p.grid_m; m0 += rows_per_chunk)
    for (int64_t h = 0; h < halves; ++h) {
      const int64_t n0 = p.grid_n * h / halves, n1 = p.grid_n * (h + 1) / halves;
      for (int64_t m = m0; m < std::min(p.grid_m, m0 + rows_per_chunk); ++m)
        for (int64_t tn = n0; tn < n1; ++tn) {
          std::vector<int> cell;
          append_cell(g, 0, {m, tn}, cell);
          for (int t : cell) emit(t);
        }
      drain();
    }
  drain();
  return order;
}

// Cuts positions [begin, end) of `order` into min(parts, end - begin) runs of about equal work (a
// tile's work is its K range) and appends each run's end to `units`.
void cut_units(const TileGraph& g, const std::vector<int>& order, int begin, int end, int parts, std::vector<int>& units) {
  parts = std::min(parts, end - begin);
  std::vector<double> before(end - begin + 1, 0.0);  // work of positions [begin, begin + i)
  for (int i = begin; i < end; ++i) {
    const Tile& t = g.tile(order[i]);
    before[i - begin + 1] = before[i - begin] + double(std::max<int64_t>(1, t.k1 - t.k0));
  }
  const double total = before.back();
  int at = begin;
  for (int u = 1; u < parts; ++u) {
    // The cut nearest to u/parts of the work, leaving at least one tile to each unit.
    const double target = total * u / parts;
    int p = at + 1;
    const int hi = end - (parts - u);
    while (p < hi && std::abs(before[p + 1 - begin] - target) <= std::abs(before[p - begin] - target)) ++p;
    units.push_back(at = p);
  }
  units.push_back(end);
}

// waves:<W>/: the output blocks of each split-K op that fill whole waves of W tickets (the first
// blocks - blocks % W by their earliest slice) as one ticket of all their slices, the rest (the last,
// partial wave) slice by slice. A block whose slices wait for a tile placed after its first slice keeps
// its slices. No block is whole where an op has fewer blocks than W.
Schedule whole_waves(const TileGraph& g, const Schedule& base, int64_t w) {
  const int n = g.num_tiles();
  std::vector<int> pos(n);
  for (int i = 0; i < n; ++i) pos[base.order[i]] = i;
  std::vector<char> whole(n, 0);  // by tile id: every slice of a whole block
  for (int op = 0; op < static_cast<int>(g.ops().size()); ++op) {
    const Op& o = g.op(op);
    const int64_t blocks = o.grid_m * o.grid_n, split = o.tiling.split_k;
    if (split < 2 || blocks < w) continue;
    std::vector<std::pair<int, int64_t>> first;  // (earliest slice's position, block)
    for (int64_t b = 0; b < blocks; ++b) {
      int f = n;
      for (int64_t ks = 0; ks < split; ++ks) f = std::min(f, pos[g.tile_id(op, b / o.grid_n, b % o.grid_n, ks)]);
      first.push_back({f, b});
    }
    std::sort(first.begin(), first.end());
    for (int64_t i = 0; i < blocks - blocks % w; ++i) {
      const auto [f, b] = first[i];
      bool ok = true;
      for (int64_t ks = 0; ks < split && ok; ++ks)
        for (int d : g.tile(g.tile_id(op, b / o.grid_n, b % o.grid_n, ks)).deps) ok &= pos[d] < f;
      if (ok)
        for (int64_t ks = 0; ks < split; ++ks) whole[g.tile_id(op, b / o.grid_n, b % o.grid_n, ks)] = 1;
    }
  }
  Schedule s{base.name, {}, {0}};
  std::vector<char> placed(n, 0);
  for (int id : base.order) {
    if (placed[id]) continue;
    const Tile& t = g.tile(id);
    if (whole[id])
      for (int64_t ks = 0; ks < g.op(t.op).tiling.split_k; ++ks) {
        const int sl = g.tile_id(t.op, t.tm, t.tn, ks);
        s.order.push_back(sl);
        placed[sl] = 1;
      }
    else
      s.order.push_back(id), placed[id] = 1;
    s.units.push_back(static_cast<int>(s.order.size()));
  }
  if (static_cast<int>(s.units.size()) == n + 1) s.units.clear();  // every ticket one tile
  return s;
}

// "<name>[:<param>]/<base spec>": the head (its parameter required where `need_param`) and the base.
std::pair<Spec, std::string> split_head(const std::string& spec, const char* name, bool need_param) {
  const size_t slash = spec.find('/');
  if (slash == std::string::npos || slash + 1 == spec.size()) unknown(spec);
  const Spec head = parse_spec(spec.substr(0, slash));
  if (head.name != name || (need_param && !head.param)) unknown(spec);
  return {head, spec.substr(slash + 1)};
}

}  // namespace

Schedule make_order(const TileGraph& g, const std::string& spec) {
  if (g.ops().empty()) throw InvalidArgument("order '" + spec + "': the graph has no ops");
  Schedule out{spec, {}, {}};
  if (spec.rfind("dataflow", 0) == 0) {
    // dataflow[:<lag>]/<base spec>: the executor's dataflow order (schedule.hpp) over a named base.
    const auto [head, base] = split_head(spec, "dataflow", false);
    Schedule s = dataflow_order(g, make_order(g, base), static_cast<int>(head.param));
    s.name = spec;
    return s;
  }
  if (spec.rfind("streamk", 0) == 0) {
    // streamk:<units>/<spec>: each op's tiles, in the order <spec> gives them, cut into <units>
    // tickets of about equal K work (stream-K: one ticket per SM spreads an op evenly whatever its
    // tile count). With split-K slices, a ticket's consecutive slices of one output block are one
    // partial sum (fused_with_next).
    const auto [head, base] = split_head(spec, "streamk", true);
    Schedule s = make_order(g, base);
    if (!s.units.empty()) throw InvalidArgument("order '" + spec + "': its base order already has units");
    s.name = spec;
    s.units.push_back(0);
    for (int i = 0; i < g.num_tiles();) {
      const int op = g.tile(s.order[i]).op;
      int end = i;
      while (end < g.num_tiles() && g.tile(s.order[end]).op == op) ++end;
      if (end - i != g.op(op).num_tiles)
        throw InvalidArgument("order '" + spec + "': its base order interleaves op '" + g.op(op).name +
                              "' with others (stream-K units cut one op at a time)");
      cut_units(g, s.order, i, end, static_cast<int>(head.param), s.units);
      i = end;
    }
    validate(g, s);
    return s;
  }
  if (spec.rfind("waves:", 0) == 0) {
    // waves:<W>/<spec>: <spec> with each split-K op's whole waves of W tickets unsplit (whole_waves).
    const auto [head, base_spec] = split_head(spec, "waves", true);
    const Schedule base = make_order(g, base_spec);
    if (!base.units.empty()) throw InvalidArgument("order '" + spec + "': its base order already has units");
    Schedule s = whole_waves(g, base, head.param);
    s.name = spec;
    validate(g, s);
    return s;
  }
  if (spec.rfind("kslices/", 0) == 0) {
    // Each op's split-K slices outermost: tiles that run at the same time then add into different
    // accumulator rows, not all into the same one (same-address atomics serialise in L2).
    Schedule s = make_order(g, spec.substr(8));
    if (!s.units.empty()) throw InvalidArgument("order '" + spec + "': kslices/ reorders tiles across its base's units");
    std::stable_sort(s.order.begin(), s.order.end(), [&](int a, int b) {
      const Tile &ta = g.tile(a), &tb = g.tile(b);
      return ta.op != tb.op ? ta.op < tb.op : ta.ks < tb.ks;
    });
    s.name = spec;
    validate(g, s);
    return s;
  }
  if (spec.rfind("chain_", 0) == 0) {
    const Spec s = parse_spec(spec);
    if (s.name != "chain_rows" && s.name != "chain_half_rows") unknown(spec);
    if (g.ops().size() < 2)
      throw InvalidArgument("order '" + spec + "' needs a chain of ops; this graph has one op");
    if (s.name == "chain_half_rows" && s.param) unknown(spec);
    out.order = s.name == "chain_rows" ? chain_order(g, s.param ? s.param : 1, false) : chain_order(g, 1, true);
  } else {
    // One grid spec for every op, or one per op joined by '+'.
    std::vector<std::string> per_op;
    for (size_t at = 0;;) {
      const size_t plus = spec.find('+', at);
      per_op.push_back(spec.substr(at, plus == std::string::npos ? std::string::npos : plus - at));
      if (plus == std::string::npos) break;
      at = plus + 1;
    }
    const int nops = static_cast<int>(g.ops().size());
    if (per_op.size() != 1 && static_cast<int>(per_op.size()) != nops)
      throw InvalidArgument("order '" + spec + "' gives " + std::to_string(per_op.size()) + " grid orders for " +
                            std::to_string(nops) + " ops");
    out.order.reserve(g.num_tiles());
    for (int op = 0; op < nops; ++op)
      for (const Cell& c : grid_order(per_op[per_op.size() == 1 ? 0 : op], g.op(op).grid_m, g.op(op).grid_n))
        append_cell(g, op, c, out.order);
  }
  validate(g, out);
  return out;
}

std::vector<std::string> named_orders(const TileGraph& g) {
  std::vector<std::string> names;
  for (const auto& o : order_catalog())
    if (!o.chain_only || g.ops().size() > 1) names.push_back(o.spec);
  return names;
}

Schedule schedule_from_json(const TileGraph& g, const std::string& text, const std::string& default_name) {
  using nlohmann::json;
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("malformed JSON order: ") + e.what());
  }
  Schedule s{default_name, {}, {}};
  const json* list = &j;
  if (j.is_object()) {
    if (j.contains("name")) {
      if (!j["name"].is_string()) throw InvalidArgument("order JSON: \"name\" must be a string, got " + j["name"].dump());
      s.name = j["name"].get<std::string>();
    }
    if (!j.contains("order")) throw InvalidArgument("order JSON: no \"order\" list");
    list = &j["order"];
    if (j.contains("units")) {
      const json& u = j["units"];
      if (!u.is_array() || !std::all_of(u.begin(), u.end(), [](const json& v) { return v.is_number_integer(); }))
        throw InvalidArgument("order JSON: \"units\" must be a list of positions, got " + u.dump().substr(0, 40));
      for (const json& v : u) s.units.push_back(v.get<int>());
    }
  }
  if (!list->is_array()) throw InvalidArgument("order JSON: \"order\" must be a list, got " + list->dump().substr(0, 40));
  const int nops = static_cast<int>(g.ops().size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    const std::string where = "order JSON entry " + std::to_string(i) + " (" + e.dump().substr(0, 40) + ")";
    if (e.is_number_integer()) {
      const int64_t t = e.get<int64_t>();
      if (t < 0 || t >= g.num_tiles())
        throw InvalidArgument(where + ": tile id outside [0, " + std::to_string(g.num_tiles()) + ")");
      s.order.push_back(static_cast<int>(t));
    } else if (e.is_array() && (e.size() == 3 || e.size() == 4) &&
               std::all_of(e.begin(), e.end(), [](const json& v) { return v.is_number_integer(); })) {
      const int64_t op = e[0].get<int64_t>(), tm = e[1].get<int64_t>(), tn = e[2].get<int64_t>();
      const int64_t ks = e.size() == 4 ? e[3].get<int64_t>() : 0;
      if (op < 0 || op >= nops) throw InvalidArgument(where + ": op " + std::to_string(op) + " does not exist");
      const Op& o = g.op(static_cast<int>(op));
      if (tm < 0 || tm >= o.grid_m || tn < 0 || tn >= o.grid_n || ks < 0 || ks >= o.tiling.split_k)
        throw InvalidArgument(where + ": outside op '" + o.name + "' grid " + std::to_string(o.grid_m) + "x" +
                              std::to_string(o.grid_n) + "x" + std::to_string(o.tiling.split_k));
      s.order.push_back(g.tile_id(static_cast<int>(op), tm, tn, ks));
    } else {
      throw InvalidArgument(where + ": expected a tile id or [op, tm, tn(, ks)]");
    }
  }
  validate(g, s);
  return s;
}

Schedule load_order_file(const TileGraph& g, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("cannot read order file '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return schedule_from_json(g, ss.str(), path);
}

std::string schedule_to_json(const TileGraph& g, const Schedule& s) {
  nlohmann::json list = nlohmann::json::array();
  for (int t : s.order) {
    const Tile& tile = g.tile(t);
    list.push_back({tile.op, tile.tm, tile.tn, tile.ks});
  }
  nlohmann::json j{{"name", s.name}, {"order", list}};
  if (!s.units.empty()) j["units"] = s.units;
  return j.dump();
}

}  // namespace tw
