#include "gui_api.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "tileweave/graph/gemm_graph.hpp"
#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/order/bounds.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/order/schedule.hpp"
#include "tileweave/order/search.hpp"

namespace tw::gui {
namespace {

using nlohmann::json;

constexpr const char* kSearchOrder = "search";

ApiError bad(const std::string& message) { return ApiError(400, message); }

// ---------------------------------------------------------------- the problem

// What the page sends. `kind`: "gemm" (C[M,N] = A[M,K] B[N,K]^T), "chain" (the research notes'
// two-GEMM chain, y = (x W0^T) W1^T with x [M, d], W0 [F, d]; N is F and K is d) or "ffn" (the
// gated FFN: silu(x Wg^T) * (x Wu^T), then the down projection; same sizes as the chain).
struct Problem {
  std::string kind = "gemm";
  int64_t m = 256, n = 256, k = 128;
  int64_t bm = 64, bn = 64, bk = 64;
  int64_t elem_bytes = 2;
  int64_t cache_bytes = 64 * 1024;
  int64_t line_bytes = 32;
  int64_t in_flight = 1;
};

json to_json(const Problem& p) {
  return {{"kind", p.kind}, {"m", p.m}, {"n", p.n}, {"k", p.k}, {"bm", p.bm}, {"bn", p.bn}, {"bk", p.bk},
          {"elem_bytes", p.elem_bytes}, {"cache_bytes", p.cache_bytes}, {"line_bytes", p.line_bytes},
          {"in_flight", p.in_flight}};
}

// An integer field in [lo, hi]; absent -> `fallback`. The error names the field and the value.
int64_t int_field(const json& j, const char* key, int64_t fallback, int64_t lo, int64_t hi, const char* why = "") {
  if (!j.contains(key)) return fallback;
  const json& v = j.at(key);
  int64_t x = 0;
  if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) && std::abs(v.get<double>()) < 9e15) {
    x = static_cast<int64_t>(v.get<double>());  // 256.0 is 256 (JavaScript has one number type)
  } else {
    throw bad(std::string(key) + " must be an integer, got " + (v.is_string() ? "'" + v.get<std::string>() + "'" : v.dump()));
  }
  if (x < lo || x > hi)
    throw bad(std::string(key) + " = " + std::to_string(x) + " is outside [" + std::to_string(lo) + ", " +
              std::to_string(hi) + "]" + why);
  return x;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Problem parse_problem(const json& body, const Limits& lim) {
  if (!body.is_object() || !body.contains("problem") || !body.at("problem").is_object())
    throw bad("the request needs a JSON object with a 'problem' object");
  const json& j = body.at("problem");
  Problem p;
  if (j.contains("kind")) {
    if (!j.at("kind").is_string()) throw bad("kind must be a string, got " + j.at("kind").dump());
    p.kind = j.at("kind").get<std::string>();
    if (p.kind != "gemm" && p.kind != "chain" && p.kind != "ffn")
      throw bad("kind '" + p.kind + "' is unknown (gemm, chain, ffn)");
  }
  const bool chain = p.kind != "gemm";
  const std::string dim_limit = " (the explorer's limit on a dimension)";
  p.m = int_field(j, "m", p.m, 1, lim.max_dim, dim_limit.c_str());
  p.n = int_field(j, "n", p.n, 1, lim.max_dim, dim_limit.c_str());
  p.k = int_field(j, "k", p.k, 1, lim.max_dim, dim_limit.c_str());
  // A tile may not be larger than the problem it tiles (in the chain, BN and BK tile both F and d).
  const int64_t n_cap = chain ? std::min(p.n, p.k) : p.n, k_cap = chain ? std::min(p.n, p.k) : p.k;
  p.bm = int_field(j, "bm", p.bm, 1, p.m, " (a tile must fit in M)");
  p.bn = int_field(j, "bn", p.bn, 1, n_cap, chain ? " (a tile must fit in F and in d)" : " (a tile must fit in N)");
  p.bk = int_field(j, "bk", p.bk, 1, k_cap, chain ? " (a tile must fit in F and in d)" : " (a tile must fit in K)");
  p.elem_bytes = int_field(j, "elem_bytes", p.elem_bytes, 1, 4);
  if (p.elem_bytes == 3) throw bad("elem_bytes must be 1, 2 or 4, got 3");
  if (chain && p.elem_bytes != 2)
    throw bad("elem_bytes = " + std::to_string(p.elem_bytes) + ": the chain and FFN views are bf16 (2 bytes)");
  p.line_bytes = int_field(j, "line_bytes", p.line_bytes, 1, lim.max_line_bytes);
  p.cache_bytes = int_field(j, "cache_bytes", p.cache_bytes, p.line_bytes, lim.max_cache_bytes,
                            " (at least one line, at most the explorer's limit)");
  p.in_flight = int_field(j, "in_flight", p.in_flight, 1, lim.max_in_flight);

  // Refuse before building anything big: the graph has one tile per output block per op.
  int64_t tiles = ceil_div(p.m, p.bm) * ceil_div(p.n, p.bn);
  if (chain) tiles += ceil_div(p.m, p.bm) * ceil_div(p.k, p.bn);
  if (tiles > lim.max_tiles)
    throw bad("the problem has " + std::to_string(tiles) + " tiles; the explorer's limit is " +
              std::to_string(lim.max_tiles) + " (every click re-simulates the order): use larger tiles, or `tileweave sim`");
  const int64_t k_steps = std::max(ceil_div(p.k, p.bk), chain ? ceil_div(p.n, p.bk) : 0);
  if (k_steps > 1024)
    throw bad("K / BK = " + std::to_string(k_steps) + " K-steps per tile; the explorer's limit is 1024: use a larger BK");
  return p;
}

struct Model {
  Problem problem;
  TileGraph graph;
  CacheConfig cache;
};

Model build_model(const Problem& p, const Limits& lim) {
  Model md{p, {}, {}};
  const Tiling t{p.bm, p.bn, p.bk, 1};
  try {
    if (p.kind == "gemm") {
      md.graph = build_gemm_graph(p.m, p.n, p.k, t, static_cast<int>(p.elem_bytes)).graph;
    } else {
      FfnShape shape{p.m, p.k, p.n, p.kind == "ffn"};
      md.graph = build_ffn_graph(shape, FfnTiling{t, t}).graph;
    }
    md.cache.capacity_bytes = p.cache_bytes;
    md.cache.line_bytes = p.line_bytes;
    md.cache.in_flight = static_cast<int>(p.in_flight);
    md.cache.validate();
  } catch (const InvalidArgument& e) {
    throw bad(e.what());
  }
  int64_t blocks = 0;
  CacheModel probe(md.graph, md.cache);
  for (size_t t = 0; t < md.graph.tensors().size(); ++t)
    blocks += probe.grid(static_cast<int>(t)).num_rows * probe.grid(static_cast<int>(t)).num_cols;
  if (blocks > lim.max_blocks)
    throw bad("the cache model cuts this problem into " + std::to_string(blocks) + " blocks; the explorer's limit is " +
              std::to_string(lim.max_blocks) + ": use larger tiles");
  return md;
}

std::string tile_label(const TileGraph& g, int id) {
  const Tile& t = g.tile(id);
  return g.op(t.op).name + "(" + std::to_string(t.tm) + "," + std::to_string(t.tn) + ")";
}

// ---------------------------------------------------------------- orders

std::vector<int> parse_order(const json& body, const TileGraph& g) {
  if (!body.contains("order") || !body.at("order").is_array()) throw bad("the request needs an 'order' array of tile ids");
  std::vector<int> order;
  for (const json& v : body.at("order")) {
    if (!v.is_number_integer()) throw bad("order entries must be tile ids, got " + v.dump());
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= g.num_tiles())
      throw bad("tile id " + std::to_string(id) + " is outside [0, " + std::to_string(g.num_tiles()) + ")");
    order.push_back(static_cast<int>(id));
  }
  return order;
}

// A prefix of an order is valid when its completion by the remaining tiles in id order (ids are a
// topological order: producers are added first) passes validate(). A refused tile gets a reason
// that names the producer it waits for and the region it reads from it.
void check_prefix(const TileGraph& g, const std::vector<int>& prefix) {
  Schedule s{"clicked", prefix, {}};
  std::vector<char> seen(g.num_tiles(), 0);
  for (int t : prefix) seen[t] = 1;
  for (int t = 0; t < g.num_tiles(); ++t)
    if (!seen[t]) s.order.push_back(t);
  try {
    validate(g, s);
  } catch (const InvalidArgument& e) {
    std::vector<int> pos(g.num_tiles(), -1);
    for (size_t i = 0; i < prefix.size(); ++i) {
      const int t = prefix[i];
      if (pos[t] >= 0) throw ApiError(409, tile_label(g, t) + " already ran at step " + std::to_string(pos[t] + 1));
      pos[t] = static_cast<int>(i);
      std::vector<int> missing;
      for (int d : g.tile(t).deps)
        if (pos[d] < 0) missing.push_back(d);
      if (missing.empty()) continue;
      const Tile& producer = g.tile(missing.front());
      std::string reads;
      for (const Region& r : g.tile(t).reads)
        for (const Region& w : producer.writes)
          if (r.overlaps(w) && reads.empty())
            reads = g.tensor(r.tensor).name + "[" + std::to_string(std::max(r.r0, w.r0)) + ":" +
                    std::to_string(std::min(r.r1, w.r1)) + ", " + std::to_string(std::max(r.c0, w.c0)) + ":" +
                    std::to_string(std::min(r.c1, w.c1)) + "]";
      throw ApiError(409, tile_label(g, t) + " cannot run at step " + std::to_string(i + 1) + ": it reads " + reads +
                              ", written by " + tile_label(g, missing.front()) + ", which has not run (" +
                              std::to_string(missing.size()) + " of its " + std::to_string(g.tile(t).deps.size()) +
                              " producer tiles are missing)");
    }
    throw ApiError(409, e.what());  // validate() saw something the walk above did not: report it as is
  }
}

struct NamedOrder {
  Schedule schedule;
  std::string note;
};

NamedOrder named_order(const Model& md, const std::string& name, const Limits& lim) {
  const TileGraph& g = md.graph;
  try {
    if (name != kSearchOrder) return {make_order(g, name), ""};
    std::string why_heuristic = "more than " + std::to_string(lim.max_exact_search_tiles) + " tiles or P > 1";
    if (g.num_tiles() <= lim.max_exact_search_tiles && md.cache.in_flight == 1) {
      ExactOptions o;
      o.time_limit_s = lim.exact_search_seconds;
      o.max_states = 2000000;
      try {
        ExactResult r = exact_search(g, md.cache, o);
        r.best.name = kSearchOrder;
        return {r.best, "exact search: optimal traffic " + std::to_string(r.traffic) + " B, " +
                            std::to_string(r.num_optimal) + (r.count_saturated ? "+" : "") + " optimal orders"};
      } catch (const InvalidArgument& e) {
        why_heuristic = e.what();  // over its time or state budget: a heuristic answer beats none
      }
    }
    HeuristicOptions o;
    o.time_limit_s = lim.heuristic_search_seconds;
    HeuristicResult r = heuristic_search(g, md.cache, o);
    r.best.name = kSearchOrder;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", lim.heuristic_search_seconds);
    return {r.best, "heuristic search from '" + r.seed_order + "' (" + std::to_string(r.evaluations) + " orders in " +
                        seconds + " s): " + std::to_string(r.traffic) + " B vs " + std::to_string(r.seed_traffic) +
                        " B; exact search skipped: " + why_heuristic};
  } catch (const InvalidArgument& e) {
    throw bad(e.what());
  }
}

// ---------------------------------------------------------------- routes

json route_meta(const Limits& lim) {
  json models = json::array(), gpus = json::array();
  for (const std::string& name : model_preset_names()) {
    const FfnShape s = model_preset(name, 16);
    models.push_back({{"name", name}, {"hidden", s.d}, {"ffn", s.f}, {"gated", s.gated}});
  }
  for (const std::string& name : gpu_preset_names()) {
    const GpuPreset gp = gpu_preset(name);
    gpus.push_back({{"name", name}, {"cache_bytes", gp.l2_bytes}, {"in_flight", gp.sms}});
  }
  return {{"models", models},
          {"gpus", gpus},
          {"default_problem", to_json(Problem{})},
          {"limits",
           {{"max_dim", lim.max_dim}, {"max_tiles", lim.max_tiles}, {"max_blocks", lim.max_blocks},
            {"max_cache_bytes", lim.max_cache_bytes}, {"max_line_bytes", lim.max_line_bytes},
            {"max_in_flight", lim.max_in_flight}}}};
}

json route_layout(const Model& md) {
  const TileGraph& g = md.graph;
  CacheModel cm(g, md.cache);
  json tensors = json::array(), ops = json::array(), tiles = json::array();
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    const Tensor& x = g.tensors()[t];
    const BlockGrid& bg = cm.grid(static_cast<int>(t));
    tensors.push_back({{"name", x.name}, {"role", to_string(x.role)}, {"rows", x.rows}, {"cols", x.cols},
                       {"block_rows", bg.block_rows}, {"block_cols", bg.block_cols},
                       {"num_rows", bg.num_rows}, {"num_cols", bg.num_cols}});
  }
  for (size_t o = 0; o < g.ops().size(); ++o) {
    const Op& op = g.ops()[o];
    json ids = json::array();
    for (int i = 0; i < op.num_tiles; ++i) ids.push_back(op.first_tile + i);
    ops.push_back({{"name", op.name}, {"kind", to_string(op.kind)}, {"m", op.m}, {"n", op.n}, {"k", op.k},
                   {"bm", op.tiling.bm}, {"bn", op.tiling.bn}, {"bk", op.tiling.bk},
                   {"grid_m", op.grid_m}, {"grid_n", op.grid_n}, {"a", op.a}, {"b", op.b}, {"c", op.c},
                   {"a_name", g.tensor(op.a).name}, {"b_name", g.tensor(op.b).name}, {"c_name", g.tensor(op.c).name},
                   {"tiles", ids}});
  }
  for (const Tile& t : g.tiles()) tiles.push_back({{"op", t.op}, {"tm", t.tm}, {"tn", t.tn}, {"deps", t.deps}});

  const TrafficBounds tb = traffic_bounds(g, md.cache);
  json bounds = json::array();
  for (const Bound& b : tb.bounds) bounds.push_back({{"name", b.name}, {"bytes", b.bytes}, {"note", b.note}});
  std::vector<std::string> orders = named_orders(g);
  // The chart starts with a few orders that tell different stories; the rest are a click away.
  std::vector<std::string> chart;
  const bool chain = g.ops().size() > 1;
  for (const char* want : {"row_major", "col_major", chain ? "chain_rows:1" : "snake", chain ? "chain_half_rows" : "hilbert"})
    if (std::find(orders.begin(), orders.end(), want) != orders.end()) chart.push_back(want);
  orders.push_back(kSearchOrder);
  return {{"problem", to_json(md.problem)}, {"tensors", tensors}, {"ops", ops}, {"tiles", tiles},
          {"orders", orders}, {"chart_default_orders", chart},
          {"compulsory_bytes", tb.compulsory()}, {"lower_bound_bytes", tb.best()}, {"bounds", bounds}};
}

// Runs `order` (a dependency-closed prefix) through the step-by-step CacheModel. Tickets run in
// waves of P = in_flight (P = 1: one tile at a time, the research notes' GUI); a tile that needs a
// tile of its own wave starts the next wave. When every tile has run, the dirty blocks are flushed
// (their write-back counts) and simulate() of the same order is reported beside it.
json route_simulate(const Model& md, const std::vector<int>& order) {
  const TileGraph& g = md.graph;
  check_prefix(g, order);
  CacheModel cm(g, md.cache);
  json steps = json::array();
  int64_t cumulative = 0;
  auto record = [&](const TileResult& r) {
    cumulative += r.dram_read + r.dram_write;
    steps.push_back({{"tile", r.tile}, {"hit_bytes", r.hit_bytes}, {"miss_bytes", r.dram_read},
                     {"write_bytes", r.dram_write}, {"requested_bytes", r.requested_bytes},
                     {"cumulative_bytes", cumulative}});
  };
  const size_t P = static_cast<size_t>(md.cache.in_flight);
  std::vector<int> wave;
  auto run_wave = [&] {
    if (wave.empty()) return;
    if (wave.size() == 1) record(cm.run_tile(wave.front()));
    else for (const TileResult& r : cm.run_concurrent(wave)) record(r);
    wave.clear();
  };
  for (int t : order) {
    const auto& deps = g.tile(t).deps;
    const bool needs_wave = std::any_of(deps.begin(), deps.end(), [&](int d) {
      return std::find(wave.begin(), wave.end(), d) != wave.end();
    });
    if (needs_wave || wave.size() == P) run_wave();
    wave.push_back(t);
  }
  run_wave();

  // What is in the cache now, per tensor, as a block matrix: 0 absent, 1 clean, 2 dirty.
  std::vector<std::vector<std::vector<int>>> resident;
  for (size_t t = 0; t < g.tensors().size(); ++t) {
    const BlockGrid& bg = cm.grid(static_cast<int>(t));
    resident.emplace_back(bg.num_rows, std::vector<int>(bg.num_cols, 0));
  }
  int64_t dirty_bytes = 0;
  for (const ResidentBlock& b : cm.resident()) {
    resident.at(b.block.tensor).at(b.block.block_row).at(b.block.block_col) = b.dirty ? 2 : 1;
    if (b.dirty) dirty_bytes += b.bytes;
  }
  json out = {{"steps", steps}, {"resident", resident}, {"resident_bytes", cm.resident_bytes()},
              {"dirty_bytes", dirty_bytes}, {"complete", static_cast<int>(order.size()) == g.num_tiles()}};
  int64_t total = cumulative;
  if (out["complete"]) {
    const TileResult f = cm.flush();
    total += f.dram_read + f.dram_write;
    out["flush_bytes"] = f.dram_read + f.dram_write;
    out["simulate_bytes"] = simulate(g, Schedule{"clicked", order, {}}, md.cache).dram_total();
  }
  out["total_bytes"] = total;
  return out;
}

json route_compare(const Model& md, const json& body, const Limits& lim) {
  if (!body.contains("names") || !body.at("names").is_array()) throw bad("the request needs a 'names' array of order names");
  if (static_cast<int>(body.at("names").size()) > lim.max_compare_orders)
    throw bad(std::to_string(body.at("names").size()) + " orders to compare; the explorer's limit is " +
              std::to_string(lim.max_compare_orders));
  json series = json::array();
  CacheConfig cfg = md.cache;
  cfg.trace = true;
  for (const json& n : body.at("names")) {
    if (!n.is_string()) throw bad("order names must be strings, got " + n.dump());
    const NamedOrder no = named_order(md, n.get<std::string>(), lim);
    const TrafficReport r = simulate(md.graph, no.schedule, cfg);
    std::vector<int64_t> cumulative;
    for (const TraceStep& s : r.trace) cumulative.push_back(s.dram_read + s.dram_write);
    if (!cumulative.empty()) cumulative.back() = r.dram_total();  // the last point includes the final flush
    series.push_back({{"name", n}, {"cumulative", cumulative}, {"total_bytes", r.dram_total()}});
  }
  const TrafficBounds tb = traffic_bounds(md.graph, md.cache);
  return {{"series", series}, {"compulsory_bytes", tb.compulsory()}, {"lower_bound_bytes", tb.best()}};
}

// The `tileweave sim` line that models the same problem as the page, so that an exported order can
// be checked; empty (with the reason in `why`) where the CLI has no flags for the shape.
std::string cli_line(const Problem& p, std::string& why) {
  std::string s = "tileweave sim";
  if (p.kind == "gemm") {
    if (p.elem_bytes != 2) {
      why = "the CLI models bf16 GEMMs only (elem_bytes 2)";
      return "";
    }
    s += " --gemm " + std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k);
  } else {
    // The CLI starts from a model preset of the same kind (gated or not) and overrides its sizes.
    std::string preset;
    for (const std::string& name : model_preset_names())
      if (preset.empty() && model_preset(name, p.m).gated == (p.kind == "ffn")) preset = name;
    if (preset.empty()) {
      why = "no CLI model preset is a " + p.kind;
      return "";
    }
    s += " --model " + preset + " --m " + std::to_string(p.m) + " --d " + std::to_string(p.k) + " --ffn " +
         std::to_string(p.n);
  }
  s += " --tile " + std::to_string(p.bm) + "x" + std::to_string(p.bn) + "x" + std::to_string(p.bk) + " --cache " +
       std::to_string(p.cache_bytes) + " --line " + std::to_string(p.line_bytes) + " --p " +
       std::to_string(p.in_flight) + " --order-file tileweave-order.json";
  return s;
}

json route_export(const Model& md, const json& body) {
  const TileGraph& g = md.graph;
  const std::vector<int> order = parse_order(body, g);
  if (static_cast<int>(order.size()) != g.num_tiles())
    throw bad("the order has " + std::to_string(order.size()) + " of " + std::to_string(g.num_tiles()) +
              " tiles: run every tile (End plays a loaded order out) before exporting it");
  check_prefix(g, order);
  std::string name = body.value("name", std::string("clicked"));
  if (name.empty()) name = "clicked";
  try {
    std::string why;
    const std::string cli = cli_line(md.problem, why);
    return {{"file", json::parse(schedule_to_json(g, Schedule{name, order, {}}))}, {"cli", cli}, {"cli_note", why}};
  } catch (const InvalidArgument& e) {
    throw bad(e.what());
  }
}

}  // namespace

json handle_api(const std::string& route, const json& body, const Limits& lim) {
  if (route == "meta") return route_meta(lim);
  const Model md = build_model(parse_problem(body, lim), lim);
  if (route == "layout") return route_layout(md);
  if (route == "simulate") return route_simulate(md, parse_order(body, md.graph));
  if (route == "compare") return route_compare(md, body, lim);
  if (route == "export") return route_export(md, body);
  if (route == "order") {
    if (!body.contains("name") || !body.at("name").is_string()) throw bad("the request needs an order 'name'");
    const NamedOrder no = named_order(md, body.at("name").get<std::string>(), lim);
    return {{"name", no.schedule.name}, {"order", no.schedule.order}, {"note", no.note}};
  }
  throw ApiError(404, "no API route '" + route + "'");
}

}  // namespace tw::gui
