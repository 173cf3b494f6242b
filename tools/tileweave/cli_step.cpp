// `tileweave step`: a whole decode step's tile graph (graph/step_graph.hpp) as the GPU decode step
// plans it, through the traffic model: predicted DRAM bytes beside the step's floor (every weight
// and K/V byte once) and the time they take at the GPU preset's read bandwidth.
#include <CLI/CLI.hpp>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_commands.hpp"
#include "tileweave/graph/step_graph.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/order/orders.hpp"

namespace tw::cli {

namespace {

struct StepOptions {
  std::string model = "llama-3.2-1b", layout = "contiguous", gpu = "h200", order = "kslices/col_major";
  int batch = 1, kv = 1024, page_size = 16, tp = 1;
  double collective_us = 10;
  bool json = false;
};

void run_step(const StepOptions& o) {
  const ModelConfig full = std::filesystem::exists(o.model) ? load_hf_config(o.model) : named_config(o.model);
  const ModelConfig c = tensor_parallel_shard(full, o.tp);  // one rank's (the whole model at --tp 1)
  const StepCollectives k = step_collectives(full, o.tp, o.batch);
  if (o.collective_us < 0) throw InvalidArgument("--collective-us " + std::to_string(o.collective_us) + " must be >= 0");
  const GpuPreset gpu = gpu_preset(o.gpu);
  if (o.kv < 1) throw InvalidArgument("--kv " + std::to_string(o.kv) + " must be >= 1 (tokens after the append)");
  DecodeStepShape s;
  s.batch = o.batch;
  s.max_seq_len = (int64_t(o.kv) + 15) / 16 * 16;  // whole 16-token units: the model's blocks of the cache
  s.page_size = o.page_size;
  s.tp = o.tp;
  s.layout = o.layout == "paged" ? KvLayout::Paged : KvLayout::Contiguous;
  if (o.layout != "paged" && o.layout != "contiguous") throw InvalidArgument("--layout '" + o.layout + "' is not contiguous or paged");
  std::vector<int> table;
  if (s.layout == KvLayout::Paged)
    for (int i = 0; i < s.batch * s.pages_per_seq(); ++i) table.push_back(i);
  const std::vector<int> lens(o.batch, o.kv - 1);
  const StepTiling t = plan_step_tiling(c, o.batch, gpu.sms, 0, o.tp);
  const auto t0 = std::chrono::steady_clock::now();
  const StepGraph g = build_step_graph(c, s, lens, table, t);
  CacheConfig cc;
  cc.capacity_bytes = gpu.l2_bytes;
  cc.in_flight = gpu.sms;
  const TrafficReport r = simulate(g.graph, make_order(g.graph, o.order), cc);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t wbytes = c.decode_weight_bytes(), kvbytes = c.kv_bytes(std::vector<int>(o.batch, o.kv));
  const double floor_us = double(wbytes + kvbytes) / (gpu.read_tbps * 1e6);
  const double model_us = double(r.dram_read + r.dram_write) / (gpu.read_tbps * 1e6);
  auto split = [](const Tiling& x) { return x.split_k; };
  if (o.json) {
    std::cout << nlohmann::json{{"model", c.name}, {"batch", o.batch}, {"kv_len", o.kv}, {"layout", o.layout},
                                {"gpu", gpu.name}, {"tiles", g.graph.num_tiles()}, {"ops", g.graph.ops().size()},
                                {"weight_bytes", wbytes}, {"kv_bytes", kvbytes}, {"floor_us", floor_us},
                                {"model_read_bytes", r.dram_read}, {"model_write_bytes", r.dram_write},
                                {"model_us", model_us}, {"attention_tiles", t.attention_tiles},
                                {"act_rows", t.qkv.bm}, {"stage_cols", t.qkv.bk},
                                {"splits", {{"qkv", split(t.qkv)}, {"o_proj", split(t.o_proj)},
                                            {"gate_up", split(t.gate_up)}, {"down", split(t.down)}}},
                                {"gate_up_whole", t.gate_up_whole},
                                {"oproj_merges", oproj_merges_pairs(g, o.batch)}, {"oproj_slice_cols", oproj_slice_cols(g)},
                                {"tp", o.tp},
                                {"collectives", {{"all_reduces", k.all_reduces}, {"all_reduce_bytes", k.all_reduce_bytes},
                                                 {"max_reduces", k.max_reduces}, {"max_reduce_bytes", k.max_reduce_bytes},
                                                 {"link_bytes", k.link_bytes}, {"graph_link_bytes", g.graph.link_bytes()},
                                                 {"collective_us", o.collective_us},
                                                 {"latency_us", (k.all_reduces + k.max_reduces) * o.collective_us}}}}
                     .dump(2)
              << "\n";
    return;
  }
  fmt::print("decode step of {} ({} layers, d {}, ffn {}, heads {}/{} x {}), batch {}, KV {} tokens ({}), on {}\n",
             c.name, c.num_layers, c.hidden_size, c.intermediate_size, c.num_q_heads, c.num_kv_heads, c.head_dim,
             o.batch, o.kv, o.layout, gpu.name);
  const std::string gate_up = t.gate_up_whole > 0 ? fmt::format("{} (the last wave's tiles; the first {} whole)", split(t.gate_up),
                                                                 t.gate_up_whole)
                                                   : std::to_string(split(t.gate_up));
  fmt::print("  {} tiles in {} ops; K slices: qkv {}, o_proj {}, gate/up {}, down {}; {} attention tiles per layer\n",
             g.graph.num_tiles(), g.graph.ops().size(), split(t.qkv), split(t.o_proj), gate_up, split(t.down),
             t.attention_tiles);
  fmt::print("  tiles of {} activation rows x {} weight rows; a stage is {} K columns, one {} KiB copy of weights\n",
             t.qkv.bm, sm90::kTileRows, t.qkv.bk, sm90::kTileRows * t.qkv.bk * 2 / 1024);
  const int64_t merge_cols = o.batch * oproj_slice_cols(g);
  if (oproj_merges_pairs(g, o.batch))
    fmt::print("  split attention pairs merged by o_proj's consumers (batch x its K slice: {} <= {} columns)\n", merge_cols,
               kOprojMergeCols);
  else
    fmt::print("  split attention pairs merged by the last attention tile of each (o_proj's merge takes batch <= {},\n"
               "    tiles of <= 32 rows and batch x its K slice <= {} columns: here {} rows, {})\n",
               kOprojMergeMaxBatch, kOprojMergeCols, t.o_proj.bm, merge_cols);
  fmt::print("  floor:  weights {:.1f} MB + K/V {:.1f} MB = {:.1f} MB, {:.1f} us at {:.2f} TB/s\n", wbytes / 1e6,
             kvbytes / 1e6, (wbytes + kvbytes) / 1e6, floor_us, gpu.read_tbps);
  fmt::print("  model:  DRAM read {:.1f} MB, write {:.1f} MB ({:.2f}x the floor's bytes), {:.1f} us at that bandwidth\n",
             r.dram_read / 1e6, r.dram_write / 1e6, double(r.dram_read + r.dram_write) / double(wbytes + kvbytes), model_us);
  if (o.tp > 1)
    fmt::print("  tensor parallel: the lines above are one rank's of {} (heads {}/{}, ffn {}, vocab {} each); per step\n"
               "    {} all-reduces of {:.1f} KB (the fp32 stream after o_proj and down; in the graph as ops of\n"
               "    128-column tiles, {:.2f} MB over each rank's link) + {} all-reduce (max) of the LM head's {} B of\n"
               "    (value, index) keys, {:.2f} MB in all (ring); at {:.1f} us a collective, {:.0f} us of latency\n"
               "    unless overlapped (the GPU step: DecodeStep with tp, the collectives in its launch or between)\n",
               o.tp, c.num_q_heads, c.num_kv_heads, c.intermediate_size, c.vocab_size, k.all_reduces,
               k.all_reduce_bytes / 1e3, g.graph.link_bytes() / 1e6, k.max_reduces, k.max_reduce_bytes,
               k.link_bytes / 1e6, o.collective_us, (k.all_reduces + k.max_reduces) * o.collective_us);
  fmt::print("  (simulated in {:.1f} s; the GPU run: build-gpu/bench/bench_decode_step)\n", seconds);
}

}  // namespace

void register_step_command(CLI::App& app) {
  auto o = std::make_shared<StepOptions>();
  CLI::App* c = app.add_subcommand("step", "a whole decode step's tile graph through the traffic model");
  c->add_option("--model", o->model, "named config (" + [] {
    std::string s;
    for (const auto& n : named_config_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }() + ") or a folder with config.json")->capture_default_str();
  c->add_option("--batch", o->batch, "sequences")->capture_default_str();
  c->add_option("--kv", o->kv, "tokens each sequence attends to (after the append)")->capture_default_str();
  c->add_option("--layout", o->layout, "contiguous | paged")->capture_default_str();
  c->add_option("--page-size", o->page_size, "paged: tokens per page")->capture_default_str();
  c->add_option("--gpu", o->gpu, "GPU preset (L2, SMs, read bandwidth)")->capture_default_str();
  c->add_option("--order", o->order, "order spec")->capture_default_str();
  c->add_option("--tp", o->tp, "tensor-parallel ranks: one rank's shard, and the step's collectives")->capture_default_str();
  c->add_option("--collective-us", o->collective_us,
                "latency of one collective for the estimate (an assumption until measured with NCCL on the GPUs)")
      ->capture_default_str();
  c->add_flag("--json", o->json, "JSON output");
  c->callback([o] { run_step(*o); });
}

}  // namespace tw::cli
