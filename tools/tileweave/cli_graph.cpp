// `tileweave graph`: a tile graph's ops and, for every producer -> consumer edge, its fusion class
// (model/fusion.hpp): which consumer tiles can start after which producer tiles.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_commands.hpp"
#include "cli_problem.hpp"
#include "tileweave/graph/step_graph.hpp"
#include "tileweave/model/fusion.hpp"

namespace tw::cli {

namespace {

struct GraphOptions {
  ProblemOptions problem;
  std::string step_model;  // --decode-step: a whole decode step's graph instead of the problem's
  int batch = 1, kv = 1024;
  bool json = false;
};

void run_graph(const GraphOptions& o) {
  TileGraph graph;
  std::string description;
  if (!o.step_model.empty()) {
    const ModelConfig c = std::filesystem::exists(o.step_model) ? load_hf_config(o.step_model) : named_config(o.step_model);
    if (o.kv < 1) throw InvalidArgument("--kv " + std::to_string(o.kv) + " must be >= 1 (tokens after the append)");
    if (o.batch < 1) throw InvalidArgument("--batch " + std::to_string(o.batch) + " must be >= 1");
    const GpuPreset gpu = find_gpu_preset(o.problem.gpu);
    DecodeStepShape s;
    s.batch = o.batch;
    s.max_seq_len = (int64_t(o.kv) + 15) / 16 * 16;
    graph = build_step_graph(c, s, std::vector<int>(o.batch, o.kv - 1), {}, plan_step_tiling(c, o.batch, gpu.sms)).graph;
    description = fmt::format("decode step of {}, batch {}, KV {} tokens, planned for {}", c.name, o.batch, o.kv, gpu.name);
  } else {
    Problem p = make_problem(o.problem);
    graph = std::move(p.graph);
    description = p.description;
  }
  const std::vector<FusionEdge> edges = fusion_report(graph);
  auto tensor = [&](int t) { return graph.tensor(t).name; };
  if (o.json) {
    nlohmann::json ops = nlohmann::json::array(), list = nlohmann::json::array();
    for (const Op& op : graph.ops())
      ops.push_back({{"name", op.name}, {"kind", to_string(op.kind)}, {"m", op.m}, {"n", op.n}, {"k", op.k},
                     {"grid", {op.grid_m, op.grid_n}}, {"split_k", op.tiling.split_k}, {"tiles", op.num_tiles}});
    for (const FusionEdge& e : edges)
      list.push_back({{"producer", graph.op(e.producer).name}, {"consumer", graph.op(e.consumer).name},
                      {"tensor", tensor(e.tensor)}, {"class", to_string(e.cls)}, {"producer_tiles", e.producer_tiles},
                      {"consumer_tiles", e.consumer_tiles}, {"pairs", e.pairs},
                      {"fan_in", {{"min", e.fan_in_min}, {"mean", e.fan_in_mean}, {"max", e.fan_in_max}}},
                      {"fan_out", {{"min", e.fan_out_min}, {"mean", e.fan_out_mean}, {"max", e.fan_out_max}}},
                      {"reads_per_element", e.reads_per_element}, {"barrier", e.barrier}, {"meaning", e.meaning}});
    std::cout << nlohmann::json{{"problem", description}, {"tiles", graph.num_tiles()}, {"ops", ops}, {"edges", list}}.dump(2)
              << "\n";
    return;
  }
  fmt::print("{}\n  {} tiles in {} ops\n", description, graph.num_tiles(), graph.ops().size());
  if (graph.ops().size() <= 40)
    for (const Op& op : graph.ops())
      fmt::print("  op {:<16} {:<15} {}x{}x{}, grid {}x{}{}, {} tiles\n", op.name, to_string(op.kind), op.m, op.n, op.k,
                 op.grid_m, op.grid_n, op.tiling.split_k > 1 ? fmt::format(" x {} K slices", op.tiling.split_k) : "",
                 op.num_tiles);
  fmt::print("  edges (producer -> consumer via tensor): class; producer tiles each consumer tile waits on (fan-in), "
             "consumer tiles each producer tile feeds (fan-out), reads per element\n");
  for (const FusionEdge& e : edges) {
    fmt::print("  {} -> {} via {}: {}; fan-in {}..{} (mean {:.1f}) of {}, fan-out {}..{} of {}, {:.2f} reads/element{}\n",
               graph.op(e.producer).name, graph.op(e.consumer).name, tensor(e.tensor), to_string(e.cls), e.fan_in_min,
               e.fan_in_max, e.fan_in_mean, e.producer_tiles, e.fan_out_min, e.fan_out_max, e.consumer_tiles,
               e.reads_per_element, e.barrier ? ", barrier" : "");
    fmt::print("      {}\n", e.meaning);
  }
}

}  // namespace

void register_graph_command(CLI::App& app) {
  auto o = std::make_shared<GraphOptions>();
  CLI::App* c = app.add_subcommand("graph", "a tile graph's ops and the fusion class of every producer -> consumer edge");
  add_problem_options(*c, o->problem);
  c->add_option("--decode-step", o->step_model, "a whole decode step's graph of this model config (named or a folder) instead");
  c->add_option("--batch", o->batch, "with --decode-step: sequences")->capture_default_str();
  c->add_option("--kv", o->kv, "with --decode-step: tokens each sequence attends to")->capture_default_str();
  c->add_flag("--json", o->json, "JSON output");
  c->callback([o] { run_graph(*o); });
}

}  // namespace tw::cli
