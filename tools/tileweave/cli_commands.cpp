#include "cli_commands.hpp"

#include <CLI/CLI.hpp>
#include <chrono>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_problem.hpp"
#include "tileweave/order/bounds.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/order/search.hpp"
#include "tileweave/model/time_model.hpp"

namespace tw::cli {

namespace {

using nlohmann::json;

std::string human_bytes(int64_t b) {
  if (b >= 1000000000) return fmt::format("{:.3f} GB", b / 1e9);
  if (b >= 1000000) return fmt::format("{:.2f} MB", b / 1e6);
  if (b >= 10000) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", b);
}

json report_json(const TrafficReport& r, int64_t bound, bool per_tensor) {
  json j{{"order", r.order},
         {"dram_read", r.dram_read},
         {"dram_write", r.dram_write},
         {"dram_total", r.dram_total()},
         {"hit_rate", r.hit_rate()},
         {"vs_bound", bound ? double(r.dram_total()) / double(bound) : 0.0}};
  if (per_tensor) {
    json t = json::array();
    for (const TensorTraffic& x : r.per_tensor)
      t.push_back({{"tensor", x.name}, {"role", to_string(x.role)}, {"dram_read", x.dram_read},
                   {"dram_write", x.dram_write}, {"hit_bytes", x.hit_bytes}, {"requested_bytes", x.requested_bytes}});
    j["per_tensor"] = t;
  }
  if (!r.trace.empty()) {
    json t = json::array();
    for (const TraceStep& s : r.trace) t.push_back({s.tile, s.dram_read, s.dram_write, s.hit_bytes});
    j["trace"] = {{"columns", {"tile", "dram_read", "dram_write", "hit_bytes"}}, {"rows", t}};
  }
  return j;
}

json time_json(const TimePrediction& t) {
  json ops = json::array();
  for (const OpTime& o : t.ops)
    ops.push_back({{"op", o.name}, {"tiles", o.tiles}, {"dram_bytes", o.bytes}, {"flops", o.flops},
                   {"flop_per_byte", o.intensity}, {"bound", o.compute_bound ? "compute" : "memory"},
                   {"waves", o.waves}, {"tail_efficiency", o.tail_efficiency}, {"memory_us", o.memory_us},
                   {"compute_us", o.compute_us}, {"roofline_us", o.roofline_us}, {"reduce_bytes", o.reduce_bytes},
                   {"us", o.us}, {"start_us", o.start_us}, {"end_us", o.end_us}});
  return {{"ridge_flop_per_byte", t.ridge}, {"fused_us", t.fused_us}, {"separate_us", t.separate_us}, {"ops", ops}};
}

json bounds_json(const TrafficBounds& b) {
  json list = json::array();
  for (const Bound& x : b.bounds) list.push_back({{"name", x.name}, {"bytes", x.bytes}, {"note", x.note}});
  return {{"compulsory_read", b.compulsory_read}, {"compulsory_write", b.compulsory_write}, {"best", b.best()}, {"bounds", list}};
}

void print_bounds(const TrafficBounds& b) {
  for (const Bound& x : b.bounds) fmt::print("  bound {:<18} {:>12}   {}\n", x.name, human_bytes(x.bytes), x.note);
}

// times: the predicted one-launch time of each report (empty: no time column).
void print_table(const std::vector<TrafficReport>& rs, int64_t bound, const std::vector<double>& times = {}) {
  fmt::print("  {:<20} {:>12} {:>12} {:>12} {:>8} {:>8}{}\n", "order", "DRAM read", "DRAM write", "total", "x bound", "L2 hit",
             times.empty() ? "" : fmt::format(" {:>10}", "pred. us"));
  int64_t best = -1;
  for (const auto& r : rs)
    if (best < 0 || r.dram_total() < best) best = r.dram_total();
  for (size_t i = 0; i < rs.size(); ++i) {
    const TrafficReport& r = rs[i];
    fmt::print("  {:<20} {:>12} {:>12} {:>12} {:>8.3f} {:>7.1f}%{}{}\n", r.order, human_bytes(r.dram_read),
               human_bytes(r.dram_write), human_bytes(r.dram_total()), double(r.dram_total()) / double(bound),
               100.0 * r.hit_rate(), times.empty() ? "" : fmt::format(" {:>10.1f}", times[i]),
               r.dram_total() == best ? "  <- best" : "");
  }
}

void print_time(const TrafficReport& r, const TimePrediction& t, const TimeParams& p) {
  fmt::print("  predicted time ({}): {:.2f} TB/s floor, {:.0f} TFLOP/s peak, ridge {:.0f} FLOP/B, P = {}, "
             "{:.0f} GB/s per SM in a tail, {:.1f} us per launch\n",
             r.order, p.read_tbps, p.gemm_tflops, t.ridge, p.slots, p.sm_stream_gbps, p.launch_us);
  // The fixed latency per GEMM tile: one value, or growing with the tile's rows (tile_fixed_base_us).
  const std::string fixed = p.tile_fixed_base_us >= 0
                                ? fmt::format("{:.1f}-{:.1f} us fixed per tile (by its rows)", p.tile_fixed_base_us,
                                              p.tile_fixed_us)
                                : fmt::format("{:.1f} us fixed per tile", p.tile_fixed_us);
  const std::string finisher = p.split_finisher_rows > 0
                                   ? fmt::format("summed by the slice of the last K range above {} rows", p.split_finisher_rows)
                                   : std::string("summed by the last slice to arrive");
  fmt::print("  replay: tile K-steps at {:.0f} TFLOP/s over P, {}, compute/memory overlap power {}, "
             "split-K sums at {:.2f} TB/s ({:.0f} GB/s into one block; {}), {:.1f} us per slice of a stream-K run\n",
             p.tile_tflops > 0 ? p.tile_tflops : p.gemm_tflops, fixed, p.overlap_power, p.reduce_tbps,
             p.reduce_block_gbps, finisher, p.slice_restart_us);
  fmt::print("  {:<14} {:>7} {:>7} {:>6} {:>12} {:>10} {:>8} {:<8} {:>9} {:>9} {:>9} {:>10} {:>9} {:>17}\n", "op", "tiles",
             "waves", "tail", "DRAM bytes", "GFLOP", "FLOP/B", "bound", "mem us", "comp us", "roof us", "split-K", "alone us",
             "in launch us");
  for (const OpTime& o : t.ops)
    fmt::print("  {:<14} {:>7} {:>7.2f} {:>5.0f}% {:>12} {:>10.2f} {:>8.1f} {:<8} {:>9.1f} {:>9.1f} {:>9.1f} {:>10} {:>9.1f} {:>8.1f}-{:<8.1f}\n",
               o.name, o.tiles, o.waves, 100 * o.tail_efficiency, human_bytes(static_cast<int64_t>(o.bytes)), o.flops / 1e9,
               o.intensity, o.compute_bound ? "compute" : "memory", o.memory_us, o.compute_us, o.roofline_us,
               o.reduce_bytes > 0 ? human_bytes(static_cast<int64_t>(o.reduce_bytes)) : "-", o.us, o.start_us, o.end_us);
  fmt::print("  chain: {:.1f} us in one launch (the tiles replayed in ticket order; ops overlap), {:.1f} us op by op\n",
             t.fused_us, t.separate_us);
}

void print_per_tensor(const TrafficReport& r) {
  fmt::print("  per tensor ({}):\n  {:<22} {:<13} {:>12} {:>12} {:>8}\n", r.order, "tensor", "role", "DRAM read",
             "DRAM write", "hit");
  for (const auto& t : r.per_tensor)
    fmt::print("  {:<22} {:<13} {:>12} {:>12} {:>7.1f}%\n", t.name, to_string(t.role), human_bytes(t.dram_read),
               human_bytes(t.dram_write), t.requested_bytes ? 100.0 * t.hit_bytes / t.requested_bytes : 0.0);
}

// The ticket number of every output cell of every op, as a grid (small grids only).
void print_grid(const TileGraph& g, const Schedule& s) {
  std::vector<int> ticket(g.num_tiles());
  for (size_t i = 0; i < s.order.size(); ++i) ticket[s.order[i]] = static_cast<int>(i);
  for (int op = 0; op < static_cast<int>(g.ops().size()); ++op) {
    const Op& o = g.op(op);
    if (o.grid_n > 20 || o.grid_m > 20) {
      fmt::print("  op {} ({}x{} tiles): too large to draw\n", o.name, o.grid_m, o.grid_n);
      continue;
    }
    fmt::print("  op {} ({}x{} tiles{}), ticket of each output tile:\n", o.name, o.grid_m, o.grid_n,
               o.tiling.split_k > 1 ? ", first K slice" : "");
    for (int64_t tm = 0; tm < o.grid_m; ++tm) {
      fmt::print("   ");
      for (int64_t tn = 0; tn < o.grid_n; ++tn) fmt::print(" {:>4}", ticket[g.tile_id(op, tm, tn, 0)]);
      fmt::print("\n");
    }
  }
}

void print_json(const json& j) { std::cout << j.dump(2) << "\n"; }

// ---- sim ----
struct SimOptions {
  ProblemOptions problem;
  std::vector<std::string> orders;
  std::string order_file;
  bool json = false, trace = false, per_tensor = false, timing = false, per_op = false;
};

void run_sim(const SimOptions& o) {
  Problem p = make_problem(o.problem);
  std::vector<Schedule> schedules;
  for (const auto& spec : o.orders) schedules.push_back(make_order(p.graph, spec));
  if (!o.order_file.empty()) schedules.push_back(load_order_file(p.graph, o.order_file));
  if (schedules.empty())
    for (const auto& spec : named_orders(p.graph)) schedules.push_back(make_order(p.graph, spec));
  CacheConfig cfg = p.cache;
  cfg.trace = o.trace;
  const TrafficBounds b = traffic_bounds(p.graph, p.cache);
  std::vector<TrafficReport> reports;
  std::vector<double> seconds;
  for (const auto& s : schedules) {
    const auto t0 = std::chrono::steady_clock::now();
    reports.push_back(simulate(p.graph, s, cfg));
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<TimePrediction> times;
  std::vector<double> fused;
  for (size_t i = 0; i < reports.size(); ++i) {
    times.push_back(predict_time(p.graph, schedules[i], reports[i], p.time));
    fused.push_back(times.back().fused_us);
  }
  if (o.json) {
    json list = json::array();
    for (size_t i = 0; i < reports.size(); ++i) {
      list.push_back(report_json(reports[i], b.best(), o.per_tensor || reports.size() == 1));
      list.back()["time"] = time_json(times[i]);
      if (o.timing) list.back()["seconds"] = seconds[i];
    }
    print_json({{"problem", p.description}, {"tiles", p.graph.num_tiles()}, {"l2_model", to_string(p.cache.l2)},
                {"bounds", bounds_json(b)}, {"orders", list}});
    return;
  }
  fmt::print("{}\n  {} tiles\n", p.description, p.graph.num_tiles());
  print_bounds(b);
  print_table(reports, b.best(), fused);
  if (o.per_tensor || reports.size() == 1)
    for (const auto& r : reports) print_per_tensor(r);
  if (o.per_op || reports.size() == 1)
    for (size_t i = 0; i < reports.size(); ++i) print_time(reports[i], times[i], p.time);
  if (o.timing)
    for (size_t i = 0; i < reports.size(); ++i) fmt::print("  simulated {} in {:.3f} s\n", reports[i].order, seconds[i]);
}

// ---- search ----
struct SearchOptions {
  ProblemOptions problem;
  std::string method = "auto", save;
  double time_limit = 10;
  int64_t max_states = 5000000;
  uint64_t seed = 1;
  bool json = false, quiet = false;
};

void run_search(const SearchOptions& o) {
  Problem p = make_problem(o.problem);
  if (o.method != "auto" && o.method != "exact" && o.method != "heuristic")
    throw InvalidArgument("unknown search method '" + o.method + "' (known: auto, exact, heuristic)");
  if (!(o.time_limit >= 0) || o.time_limit > 86400)
    throw InvalidArgument("time limit " + fmt::format("{}", o.time_limit) + " s must be in [0, 86400]");
  if (o.max_states < 1) throw InvalidArgument("max states " + std::to_string(o.max_states) + " must be positive");
  const bool exact = o.method == "exact" || (o.method == "auto" && p.graph.num_tiles() <= 20 && p.cache.in_flight == 1);
  if (exact && p.cache.l2 == L2Kind::Partitioned)
    throw InvalidArgument("the exact search replays the simple L2 model only: use --method heuristic with --l2-model partitioned");
  std::ostream* progress = o.quiet ? nullptr : &std::cerr;
  const TrafficBounds b = traffic_bounds(p.graph, p.cache);
  // The best named order, for comparison.
  TrafficReport best_named;
  for (const auto& spec : named_orders(p.graph)) {
    TrafficReport r = simulate(p.graph, make_order(p.graph, spec), p.cache);
    if (best_named.order.empty() || r.dram_total() < best_named.dram_total()) best_named = r;
  }
  Schedule found;
  int64_t traffic = 0;
  json extra;
  std::string summary;
  if (exact) {
    ExactOptions eo;
    eo.max_states = o.max_states;
    eo.time_limit_s = o.time_limit;
    eo.progress = progress;
    const ExactResult r = exact_search(p.graph, p.cache, eo);
    found = r.best;
    traffic = r.traffic;
    extra = {{"method", "exact"}, {"num_optimal_orders", r.num_optimal}, {"count_saturated", r.count_saturated}, {"states", r.states}};
    summary = fmt::format("exact optimum: {} ({} B); {}{} optimal orders; {} states searched", human_bytes(r.traffic),
                          r.traffic, r.count_saturated ? ">= " : "", r.num_optimal, r.states);
  } else {
    HeuristicOptions ho;
    ho.time_limit_s = o.time_limit;
    ho.seed = o.seed;
    ho.progress = progress;
    const HeuristicResult r = heuristic_search(p.graph, p.cache, ho);
    found = r.best;
    traffic = r.traffic;
    extra = {{"method", "heuristic"}, {"seed_order", r.seed_order}, {"seed_traffic", r.seed_traffic}, {"evaluations", r.evaluations}};
    summary = fmt::format("heuristic search: {} ({} B), order {}, after {} simulations; best named order {} ({})",
                          human_bytes(r.traffic), r.traffic, r.best.name, r.evaluations, r.seed_order,
                          human_bytes(r.seed_traffic));
  }
  if (exact) found.name = "exact";  // the heuristic names its result: a spec, or "search" after local moves
  if (!o.save.empty()) {
    std::ofstream out(o.save);
    if (!out) throw InvalidArgument("cannot write '" + o.save + "'");
    out << schedule_to_json(p.graph, found) << "\n";
  }
  if (o.json) {
    json j{{"problem", p.description}, {"tiles", p.graph.num_tiles()}, {"bounds", bounds_json(b)},
           {"best_named", report_json(best_named, b.best(), false)}, {"traffic", traffic},
           {"order", json::parse(schedule_to_json(p.graph, found))["order"]}};
    j.update(extra);
    print_json(j);
    return;
  }
  fmt::print("{}\n  {} tiles\n", p.description, p.graph.num_tiles());
  print_bounds(b);
  fmt::print("  best named order: {} ({})\n  {}\n", best_named.order, human_bytes(best_named.dram_total()), summary);
  print_grid(p.graph, found);
  if (!o.save.empty()) fmt::print("  order saved to {} (use it with --order-file)\n", o.save);
}

// ---- orders ----
struct OrdersOptions {
  ProblemOptions problem;
  std::vector<std::string> show;
  std::string order_file;
  bool json = false;
};

void run_orders(const OrdersOptions& o) {
  if (o.show.empty() && o.order_file.empty()) {
    if (o.json) {
      json list = json::array();
      for (const auto& x : order_catalog())
        list.push_back({{"spec", x.spec}, {"description", x.description}, {"chain_only", x.chain_only}});
      print_json(list);
      return;
    }
    fmt::print("Named orders (--order SPEC; swizzle:<W>, grouped:<G>, chain_rows:<k> take any positive value):\n");
    for (const auto& x : order_catalog())
      fmt::print("  {:<16} {}{}\n", x.spec, x.description, x.chain_only ? " [chains]" : "");
    fmt::print("Custom: --order-file FILE with {{\"name\": ..., \"order\": [tile id | [op, tm, tn(, ks)], ...]}}\n");
    return;
  }
  Problem p = make_problem(o.problem);
  std::vector<Schedule> ss;
  for (const auto& spec : o.show) ss.push_back(make_order(p.graph, spec));
  if (!o.order_file.empty()) ss.push_back(load_order_file(p.graph, o.order_file));
  if (o.json) {
    json list = json::array();
    for (const auto& s : ss) list.push_back(json::parse(schedule_to_json(p.graph, s)));
    print_json(list);
    return;
  }
  fmt::print("{}\n", p.description);
  for (const auto& s : ss) {
    fmt::print("order {} (valid: a permutation that respects every dependency)\n", s.name);
    print_grid(p.graph, s);
  }
}

// ---- bounds ----
struct BoundsOptions {
  ProblemOptions problem;
  bool json = false;
};

void run_bounds(const BoundsOptions& o) {
  Problem p = make_problem(o.problem);
  const TrafficBounds b = traffic_bounds(p.graph, p.cache);
  if (o.json) {
    print_json({{"problem", p.description}, {"bounds", bounds_json(b)}});
    return;
  }
  fmt::print("{}\n", p.description);
  print_bounds(b);
  fmt::print("  best lower bound: {}\n", human_bytes(b.best()));
}

}  // namespace

void register_model_commands(CLI::App& app) {
  // Options live as long as the app: callbacks run after parsing.
  auto sim = std::make_shared<SimOptions>();
  CLI::App* c = app.add_subcommand("sim", "simulate orders over the cache and count DRAM traffic");
  add_problem_options(*c, sim->problem);
  c->add_option("--order", sim->orders, "order spec (repeatable; default: every named order)");
  c->add_option("--order-file", sim->order_file, "custom order (JSON)");
  c->add_flag("--json", sim->json, "JSON output");
  c->add_flag("--trace", sim->trace, "with --json: cumulative traffic after every tile");
  c->add_flag("--per-tensor", sim->per_tensor, "per-tensor breakdown for every order");
  c->add_flag("--time", sim->timing, "print the simulation time of every order");
  c->add_flag("--per-op", sim->per_op, "predicted time per op for every order (shown anyway for one order)");
  c->callback([sim] { run_sim(*sim); });

  auto search = std::make_shared<SearchOptions>();
  c = app.add_subcommand("search", "search for the order with the least DRAM traffic");
  add_problem_options(*c, search->problem);
  c->add_option("--method", search->method, "auto | exact | heuristic (auto: exact for <= 20 tiles and P = 1)")
      ->capture_default_str();
  c->add_option("--time-limit", search->time_limit, "seconds (0: heuristic stops at the best named order)")
      ->capture_default_str();
  c->add_option("--max-states", search->max_states, "exact search: memo entries before giving up")->capture_default_str();
  c->add_option("--seed", search->seed, "heuristic search: random seed")->capture_default_str();
  c->add_option("--save", search->save, "write the order found as JSON (for --order-file)");
  c->add_flag("--json", search->json, "JSON output");
  c->add_flag("--quiet", search->quiet, "no progress on stderr");
  c->callback([search] { run_search(*search); });

  auto orders = std::make_shared<OrdersOptions>();
  c = app.add_subcommand("orders", "list the named orders, or draw some (--show) on a problem");
  add_problem_options(*c, orders->problem);
  c->add_option("--show", orders->show, "order spec to draw as a ticket grid (repeatable)");
  c->add_option("--order-file", orders->order_file, "custom order (JSON) to check and draw");
  c->add_flag("--json", orders->json, "JSON output");
  c->callback([orders] { run_orders(*orders); });

  auto bounds = std::make_shared<BoundsOptions>();
  c = app.add_subcommand("bounds", "lower bounds on DRAM traffic");
  add_problem_options(*c, bounds->problem);
  c->add_flag("--json", bounds->json, "JSON output");
  c->callback([bounds] { run_bounds(*bounds); });
}

int run_main_report() {
  struct Case {
    const char* label;
    int64_t m;
  };
  for (const Case& k : {Case{"decode", 16}, Case{"prefill", 4096}}) {
    ProblemOptions po;
    po.model = "llama3-8b";
    po.m = k.m;
    po.gpu = "h200";
    Problem p = make_problem(po);
    fmt::print("== {}: {}\n  {} tiles\n", k.label, p.description, p.graph.num_tiles());
    const TrafficBounds b = traffic_bounds(p.graph, p.cache);
    print_bounds(b);
    std::vector<TrafficReport> rs;
    for (const auto& spec : named_orders(p.graph)) rs.push_back(simulate(p.graph, make_order(p.graph, spec), p.cache));
    print_table(rs, b.best());
    fmt::print("\n");
  }
  fmt::print("(x bound = simulated DRAM bytes / best lower bound; `tileweave --help` for the commands)\n");
  return 0;
}

}  // namespace tw::cli
