// `tileweave plan ffn|gemm`: the executor's own plan for a shape (tile shape, K slices, tiles,
// waves, order: the host copy of its sm90 tiling rules, model/validation.hpp) with the model's
// predicted DRAM bytes and time, then the candidate plans the model considers beside it, ranked
// (model/planner.hpp). `tileweave plan attention`: DecodeAttention's plan for a shape and lengths
// (graph/attention_graph.hpp: the same planner the op runs) with its bytes and a rough time.
// `tileweave plan prefill`: PrefillAttention's plan with the DRAM bytes the traffic model replays for
// its order of work items and the other one (model/prefill_traffic.hpp).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <memory>
#include <tuple>
#include <utility>
#include <nlohmann/json.hpp>

#include "cli_commands.hpp"
#include "tileweave/graph/attention_graph.hpp"
#include "tileweave/graph/prefill_attention_graph.hpp"
#include "tileweave/model/prefill_traffic.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/model/planner.hpp"

namespace tw::cli {

namespace {

using nlohmann::json;

constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();

struct PlanOptions {
  std::string op;
  int64_t m = kUnset, d = kUnset, f = kUnset, n = kUnset, k = kUnset;
  bool plain = false, json_out = false;
  std::string gpu = "h200";
  int refine = 4;
  int top = 20;
  double max_split_waves = 8;
  // attention
  int batch = 0, dim = 128, page_size = 0;
  bool causal = false, fp8 = false;  // prefill
  int64_t len = kUnset;
  std::string heads = "32/8", lens;
};

std::string slices_text(const PlanOp& o) {
  // Run-length: "7x16+2x8" K-steps per slice.
  std::string s;
  for (size_t i = 0; i < o.slice_steps.size();) {
    size_t j = i;
    while (j < o.slice_steps.size() && o.slice_steps[j] == o.slice_steps[i]) ++j;
    s += (s.empty() ? "" : "+") + (j - i > 1 ? fmt::format("{}x{}", j - i, o.slice_steps[i]) : fmt::format("{}", o.slice_steps[i]));
    i = j;
  }
  return s;
}

std::string ops_text(const PlanCandidate& c) {
  std::string s;
  for (const PlanOp& o : c.ops) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", o.name, o.split_k);
  return s;
}

json candidate_json(const PlanCandidate& c) {
  json ops = json::array();
  for (const PlanOp& o : c.ops)
    ops.push_back({{"name", o.name}, {"tile", {o.bm, o.bn, o.bk}}, {"k_slices", o.split_k}, {"slice_k_steps", o.slice_steps},
                   {"tiles", o.tiles}});
  json j{{"label", c.label},
         {"executor", c.executor},
         {"order", c.knobs.order},
         {"ops", ops},
         {"tiles", c.tiles},
         {"tickets", c.tickets},
         {"waves", c.waves},
         {"schedule", c.order},  // the order spec the executor runs ("order": the knobs')
         {"simple", {{"dram_read", c.simple_read}, {"dram_write", c.simple_write}, {"us", c.simple_us}}},
         {"model", c.refined ? "partitioned" : "simple"},
         {"dram_read", c.read()},
         {"us", c.us()},
         {"ratio_to_executor", c.ratio}};
  if (c.refined) j["partitioned"] = {{"dram_read", c.part_read}, {"dram_write", c.part_write}, {"us", c.part_us}};
  if (c.ops.size() == 2)
    j["knobs"] = {{"split_gate_up", c.knobs.split_gate_up}, {"split_down", c.knobs.split_down}, {"down_slices", "tail:1"}};
  else
    j["knobs"] = {{"split_k", c.knobs.split_k}, {"k_slices", "even"}};
  return j;
}

// --heads Q/KV -> (query heads, KV heads).
std::pair<int, int> parse_heads(const PlanOptions& o, const char* what) {
  const auto slash = o.heads.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no /");
    return {std::stoi(o.heads.substr(0, slash)), std::stoi(o.heads.substr(slash + 1))};
  } catch (const std::exception&) {
    throw InvalidArgument(std::string(what) + ": --heads '" + o.heads +
                          "' is not Q/KV (query heads / KV heads, e.g. 32/8)");
  }
}

// --lens a,b,c, or --len L for each of --batch sequences; lengths >= min_len.
std::vector<int> parse_lengths(const PlanOptions& o, const char* what, int min_len) {
  std::vector<int> lens;
  if (o.batch < 0) throw InvalidArgument(fmt::format("{}: --batch {} must be >= 1", what, o.batch));
  if (!o.lens.empty()) {
    if (o.len != kUnset) throw InvalidArgument(std::string(what) + ": give --len or --lens, not both");
    std::string item;
    for (size_t i = 0; i <= o.lens.size(); ++i) {
      if (i < o.lens.size() && o.lens[i] != ',') {
        item += o.lens[i];
        continue;
      }
      try {
        size_t used = 0;
        lens.push_back(std::stoi(item, &used));
        if (used != item.size()) throw std::invalid_argument("trailing");
      } catch (const std::exception&) {
        throw InvalidArgument(std::string(what) + ": --lens item '" + item + "' is not an integer");
      }
      if (lens.back() < min_len) throw InvalidArgument(fmt::format("{}: --lens item {} is below {}", what, lens.back(), min_len));
      item.clear();
    }
    if (o.batch > 0 && o.batch != int(lens.size()))
      throw InvalidArgument(fmt::format("{}: --batch {} but --lens has {} lengths", what, o.batch, lens.size()));
  } else {
    if (o.len == kUnset) throw InvalidArgument(std::string(what) + ": --len (every sequence) or --lens (one per sequence) is required");
    if (o.len < min_len || o.len > std::numeric_limits<int>::max())
      throw InvalidArgument(fmt::format("{}: --len {} is outside [{}, 2^31)", what, o.len, min_len));
    lens.assign(o.batch > 0 ? o.batch : 1, int(o.len));
  }
  return lens;
}

// Prefill attention (ops/prefill_attention.hpp): the op's plan for the shape and lengths (query rows
// per item, keys per K/V tile, items, rounds over the SMs), its FLOPs, and the DRAM bytes the
// traffic model replays for the kernel's order of items and the other (model/prefill_traffic.hpp).
void run_plan_prefill(const PlanOptions& o) {
  for (const int64_t v : {o.m, o.d, o.f, o.n, o.k})
    if (v != kUnset) throw InvalidArgument("plan prefill: --m/--d/--f/--n/--k do not apply (--batch, --heads, --dim, --len or --lens)");
  if (o.plain || o.page_size != 0) throw InvalidArgument("plan prefill: --plain and --page-size do not apply");
  PrefillAttentionShape s;
  std::tie(s.num_q_heads, s.num_kv_heads) = parse_heads(o, "plan prefill");
  s.head_dim = o.dim;
  s.causal = o.causal;
  s.fp8 = o.fp8;
  const std::vector<int> lens = parse_lengths(o, "plan prefill", 0);
  std::vector<int> cu{0};
  for (int l : lens) {
    if (int64_t(cu.back()) + l > std::numeric_limits<int>::max()) throw InvalidArgument("plan prefill: the lengths add up past 2^31 - 1 rows");
    cu.push_back(cu.back() + l);
  }
  validate_prefill_attention(s, cu, {});
  const GpuPreset gpu = find_gpu_preset(o.gpu);
  const double flops = prefill_attention_flops(s, cu, {});
  std::vector<std::pair<PrefillOrder, PrefillTraffic>> runs;
  for (PrefillOrder ord : {PrefillOrder::Heads, PrefillOrder::Tiles})
    runs.emplace_back(ord, predict_prefill_traffic(s, cu, {}, ord, gpu.sms, gpu.l2_bytes));
  const PrefillTraffic& k = runs.front().second;
  const int64_t rounds = (k.items + gpu.sms - 1) / gpu.sms;
  const double us = predict_prefill_us(s, cu, {}, gpu.sms, prefill_time_model(s));
  // How the kernel deals the items (the sm90 kernel's tail split over key ranges).
  const PrefillWork work = plan_prefill_work(plan_prefill_tiles(s, cu, {}, k.block_n, k.block_m), s.num_q_heads, gpu.sms,
                                             s.split_tail && s.mainloop != "sm80", prefill_piece_costs(s, k.block_n));
  const double peak_tflops = gpu.gemm_tflops * (s.fp8 ? 2 : 1);  // e4m3 runs at twice the bf16 rate
  const double compute_us = flops / (peak_tflops * 1e6);
  if (o.json_out) {
    json orders = json::array();
    for (const auto& [ord, t] : runs)
      orders.push_back({{"order", to_string(ord)}, {"kernel", ord == PrefillOrder::Heads}, {"dram_read", t.read_bytes()},
                        {"kv_dram_read", t.kv_read_bytes}, {"kv_tile_reads", t.kv_tile_reads},
                        {"kv_tile_misses", t.kv_tile_misses}, {"read_us_at_floor", t.read_bytes() / (gpu.read_tbps * 1e6)},
                        {"ratio_to_compulsory", t.read_bytes() / std::max(t.compulsory_read_bytes(), 1.0)}});
    std::cout << json{{"request", {{"num_q_heads", s.num_q_heads}, {"num_kv_heads", s.num_kv_heads}, {"head_dim", s.head_dim},
                                   {"causal", s.causal}, {"fp8", s.fp8}, {"lengths", lens}}},
                      {"preset", gpu.name},
                      {"plan", {{"block_m", k.block_m}, {"block_n", k.block_n}, {"items", k.items}, {"rounds", rounds},
                                {"whole_items", work.whole}, {"tail_units", work.units()}, {"split_items", work.groups},
                                {"tail_simulated_gain", work.makespan_whole / std::max(work.makespan, 1e-9)}}},
                      {"flops", flops},
                      {"predicted_us", us},
                      {"predicted_tflops", flops / std::max(us, 1e-9) * 1e-6},
                      {"bytes", {{"q", k.q_bytes}, {"kv", k.kv_bytes}, {"out", k.out_bytes},
                                 {"compulsory_read", k.compulsory_read_bytes()}}},
                      {"compute_us_at_gemm_peak", compute_us},
                      {"orders", orders}}
                         .dump(2)
              << "\n";
    return;
  }
  const bool equal = std::all_of(lens.begin(), lens.end(), [&](int l) { return l == lens[0]; });
  fmt::print("prefill attention heads {}/{} d={} {}{}, {} on {} ({} SMs, L2 {} MB)\n\n", s.num_q_heads, s.num_kv_heads,
             s.head_dim, s.causal ? "causal " : "", s.fp8 ? "fp8" : "bf16",
             equal ? fmt::format("{} x L={}", lens.size(), lens[0]) : fmt::format("{} sequences, {} rows", lens.size(), cu.back()),
             gpu.name, gpu.sms, gpu.l2_bytes >> 20);
  fmt::print("PrefillAttention's plan: items of {} query rows x 1 head, K/V tiles of {} keys; {} items, {} round(s) over the SMs\n",
             k.block_m, k.block_n, k.items, rounds);
  if (work.units() > 0)
    fmt::print("  the last {} items as a tail of {} units ({} split over key ranges, the last piece of each merging): "
               "simulated {:.3f}x sooner than whole items\n",
               work.items - work.whole, work.units(), work.groups, work.makespan_whole / std::max(work.makespan, 1e-9));
  else
    fmt::print("  every item whole (a split tail would not end sooner)\n");
  fmt::print("  {:.3g} GFLOP (4 d Hq x visible pairs); reads Q {:.1f} MB, K+V {:.1f} MB at least; writes {:.1f} MB\n",
             flops * 1e-9, k.q_bytes / 1e6, k.kv_bytes / 1e6, k.out_bytes / 1e6);
  const PrefillTimeModel tm = prefill_time_model(s);
  fmt::print("  predicted {:.1f} us, {:.0f} TFLOP/s (each item {:.3g} us + {:.4f} us a key row, on {} SMs; fitted on the "
             "H200: bench/fit_prefill_time.py)\n\n",
             us, flops / std::max(us, 1e-9) * 1e-6, tm.us_per_item, tm.us_per_key_row, gpu.sms);
  fmt::print("DRAM reads the traffic model replays (model/prefill_traffic.hpp: LRU over K/V tiles in L2 / 2):\n");
  fmt::print("  {:<8} {:>12} {:>14} {:>12} {:>10} {:>16}\n", "order", "read MB", "K/V read MB", "K/V misses", "x minimum",
             "us at the floor");
  for (const auto& [ord, t] : runs)
    fmt::print("  {:<8} {:>12.1f} {:>14.1f} {:>12} {:>9.2f}x {:>16.1f}{}\n", to_string(ord), t.read_bytes() / 1e6,
               t.kv_read_bytes / 1e6, t.kv_tile_misses, t.read_bytes() / std::max(t.compulsory_read_bytes(), 1.0),
               t.read_bytes() / (gpu.read_tbps * 1e6), ord == PrefillOrder::Heads ? "  (the kernel's)" : "");
  fmt::print("\nThe FLOPs at the preset's GEMM peak ({:.0f} TFLOP/s{}) take {:.1f} us: the kernel's DRAM reads are {:.1f}% of "
             "that.\n",
             peak_tflops, s.fp8 ? ", twice the bf16 peak for e4m3" : "", compute_us,
             100.0 * (k.read_bytes() / (gpu.read_tbps * 1e6)) / std::max(compute_us, 1e-9));
}

// Decode attention: the planner's tiles for the shape and lengths on the preset's SMs, what they
// stream and merge, the cost model's time for the plan and for every candidate it weighed. The ring
// depth is the op's, from the GPU's shared memory at run time.
void run_plan_attention(const PlanOptions& o) {
  for (const int64_t v : {o.m, o.d, o.f, o.n, o.k})
    if (v != kUnset) throw InvalidArgument("plan attention: --m/--d/--f/--n/--k do not apply (--batch, --heads, --dim, --len or --lens)");
  if (o.plain) throw InvalidArgument("plan attention: --plain applies to ffn only");
  DecodeAttentionShape s;
  std::tie(s.num_q_heads, s.num_kv_heads) = parse_heads(o, "plan attention");
  s.head_dim = o.dim;
  const std::vector<int> lens = parse_lengths(o, "plan attention", 1);
  s.batch = int(lens.size());
  std::vector<int> table;
  const int longest = lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end());
  if (o.page_size > 0) {
    s.layout = KvLayout::Paged;
    s.page_size = o.page_size;
    s.pages_per_seq = (longest + o.page_size - 1) / o.page_size;
    s.num_pages = s.batch * std::max(1, s.pages_per_seq);
    for (int b = 0; b < s.batch; ++b)
      for (int i = 0; i < s.pages_per_seq; ++i) table.push_back(b * s.pages_per_seq + i);
  } else if (o.page_size < 0) {
    throw InvalidArgument(fmt::format("plan attention: --page-size {} must be >= 16 (or 0: contiguous)", o.page_size));
  } else {
    s.max_seq_len = longest;
  }
  validate_decode_attention(s, lens, table);
  const GpuPreset gpu = find_gpu_preset(o.gpu);
  const DecodePlan plan = plan_decode_for(s, lens, gpu.sms);
  const DecodePlanSummary m = summarize_decode_plan(s, lens, plan);
  const DecodeCost cost = predict_decode_cost(s, lens, plan.num_tiles, plan.tiles_per_sm, gpu.sms);
  const double floor_us = double(m.kv_bytes) / (gpu.read_tbps * 1e6);
  const std::vector<DecodeCandidate> ranked = rank_decode_candidates(s, lens, gpu.sms);
  const bool equal = std::all_of(lens.begin(), lens.end(), [&](int l) { return l == lens[0]; });
  const std::string shape = fmt::format(
      "decode attention B={} heads {}/{} (group {}) d={}, {}, {}", s.batch, s.num_q_heads, s.num_kv_heads,
      s.num_q_heads / s.num_kv_heads, s.head_dim, equal ? "L=" + std::to_string(lens[0]) : "ragged, longest " + std::to_string(longest),
      o.page_size > 0 ? "paged " + std::to_string(o.page_size) : "contiguous");
  auto cost_json = [](const DecodeCost& c) {
    return json{{"us", c.us}, {"stream_us", c.stream_us}, {"merge_us", c.merge_us}, {"max_units", c.max_units},
                {"max_segments", c.max_segments}, {"widest_pair", c.widest_pair}};
  };
  if (o.json_out) {
    json cands = json::array();
    for (const DecodeCandidate& r : ranked)
      cands.push_back({{"tiles", r.tiles}, {"tiles_per_sm", r.tiles_per_sm}, {"model", cost_json(r.cost)}});
    std::cout << json{{"request", {{"batch", s.batch}, {"num_q_heads", s.num_q_heads}, {"num_kv_heads", s.num_kv_heads},
                                   {"head_dim", s.head_dim}, {"lengths", lens}, {"page_size", o.page_size}}},
                      {"preset", gpu.name},
                      {"plan", {{"tiles", m.tiles}, {"tiles_per_sm", m.tiles_per_sm}, {"warps", m.warps}, {"pairs", m.pairs},
                                {"units_per_tile", m.units_per_tile}, {"split_pairs", m.split_pairs},
                                {"widest_pair_tiles", m.widest_pair_tiles}, {"partials", m.partials},
                                {"rule_tiles", plan.rule_tiles}, {"rule_tiles_per_sm", plan.rule_tiles_per_sm},
                                {"rule_us", plan.rule_us}, {"few_tokens", plan.few_tokens}}},
                      {"model", cost_json(cost)},
                      {"bytes", {{"kv_bytes", m.kv_bytes}, {"partial_bytes", m.partial_bytes},
                                 {"widest_merge_bytes", m.widest_merge_bytes}, {"floor_us", floor_us}}},
                      {"candidates", cands}}
                         .dump(2)
              << "\n";
    return;
  }
  fmt::print("{} on {} ({} SMs)\n\n", shape, gpu.name, gpu.sms);
  if (plan.few_tokens)
    fmt::print("DecodeAttention runs the few-token path: {} blocks, one per (sequence, KV head) pair, all of a pair's K/V\n"
               "requested at once (no ring, no merge; decode_few_tokens). The stream-K plan below is what lengths on the\n"
               "device, plan overrides and the executor run:\n\n",
               m.pairs);
  fmt::print("DecodeAttention's plan (plan_decode_for; the ring depth is set by the op from shared memory):\n");
  fmt::print("  {} tiles, {} per SM, {} warps each; {} pairs (sequence, KV head), up to {} units of 16 tokens a tile\n",
             m.tiles, m.tiles_per_sm, m.warps, m.pairs, m.units_per_tile);
  if (m.split_pairs > 0)
    fmt::print("  {} pairs cut over several tiles ({} partials; the widest over {} tiles): merged in the launch by their last tile\n",
               m.split_pairs, m.partials, m.widest_pair_tiles);
  else
    fmt::print("  every pair held whole by one tile: no partials, no merges\n");
  if (plan.rule_tiles != plan.num_tiles || plan.rule_tiles_per_sm != plan.tiles_per_sm)
    fmt::print("  chosen by the cost model: the rules' plan ({} tiles, {} per SM) is predicted at {:.2f} us\n", plan.rule_tiles,
               plan.rule_tiles_per_sm, plan.rule_us);
  fmt::print("  K/V {:.2f} MB (the floor {:.2f} us), partials {:.3f} MB written and read back, widest merge {:.1f} KB on one SM\n",
             m.kv_bytes / 1e6, floor_us, m.partial_bytes / 2e6, m.widest_merge_bytes / 1e3);
  fmt::print("\nCost model (DecodeCostModel, fitted on the H200's sweeps; one launch, back to back):\n");
  fmt::print("  {:.2f} us: widest tile streams {} units ({:.2f} us), holds parts of {} pairs; widest merge {} partials ({:.2f} us)\n",
             cost.us, cost.max_units, cost.stream_us, cost.max_segments, cost.widest_pair, cost.merge_us);
  fmt::print("\nCandidates, best first ({} of {}):\n", std::min<size_t>(ranked.size(), size_t(o.top)), ranked.size());
  fmt::print("  {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7}\n", "tiles", "per SM", "us", "stream", "merge", "segments", "widest");
  for (size_t i = 0; i < ranked.size() && int(i) < o.top; ++i) {
    const DecodeCandidate& r = ranked[i];
    fmt::print("  {:>6} {:>6} {:>9.2f} {:>9.2f} {:>9.2f} {:>9} {:>7}{}\n", r.tiles, r.tiles_per_sm, r.cost.us, r.cost.stream_us,
               r.cost.merge_us, r.cost.max_segments, r.cost.widest_pair,
               r.tiles == plan.num_tiles && r.tiles_per_sm == plan.tiles_per_sm ? "  <- the plan" : "");
  }
}

void run_plan(const PlanOptions& o) {
  if (o.op == "attention") return run_plan_attention(o);
  if (o.op == "prefill") return run_plan_prefill(o);
  PlanRequest r;
  r.op = o.op;
  if (r.op != "ffn" && r.op != "gemm") throw InvalidArgument("plan: unknown op '" + r.op + "' (known: ffn, gemm, attention)");
  auto need = [&](int64_t v, const char* opt) {
    if (v == kUnset) throw InvalidArgument(fmt::format("plan {}: {} is required", r.op, opt));
    return v;
  };
  auto refuse = [&](int64_t v, const char* opt) {
    if (v != kUnset) throw InvalidArgument(fmt::format("plan {}: {} does not apply (ffn takes --d/--f, gemm --n/--k)", r.op, opt));
  };
  r.m = need(o.m, "--m");
  if (r.op == "ffn") {
    r.d = need(o.d, "--d"), r.f = need(o.f, "--f");
    refuse(o.n, "--n"), refuse(o.k, "--k");
    r.gated = !o.plain;
  } else {
    r.n = need(o.n, "--n"), r.k = need(o.k, "--k");
    refuse(o.d, "--d"), refuse(o.f, "--f");
    if (o.plain) throw InvalidArgument("plan gemm: --plain applies to ffn only");
  }
  if (o.refine < -1) throw InvalidArgument("plan: --refine must be >= 0 (or -1: all), got " + std::to_string(o.refine));
  if (o.top < 1) throw InvalidArgument("plan: --top must be >= 1, got " + std::to_string(o.top));
  if (!(o.max_split_waves >= 0))
    throw InvalidArgument(fmt::format("plan: --max-split-waves must be >= 0, got {}", o.max_split_waves));
  r.refine = o.refine;
  r.max_split_waves = o.max_split_waves;
  check_plan_request(r);
  const GpuPreset preset = find_gpu_preset(o.gpu);
  const PlanResult p = make_plan(r, preset);
  const PlanCandidate& e = p.executor;
  const std::string shape = r.op == "ffn" ? fmt::format("{} M={} d={} F={}", r.gated ? "gated FFN" : "plain MLP", r.m, r.d, r.f)
                                          : fmt::format("GEMM M={} N={} K={}", r.m, r.n, r.k);
  const std::string ranking =
      r.refine < 0 ? std::string("every candidate scored with the partitioned L2 model and the tile replay")
                   : fmt::format("every candidate scored with the simple L2 model and the tile replay; its best {} and the "
                                 "executor's plan re-scored with the partitioned L2 model, which ranks them first",
                                 r.refine);
  if (o.json_out) {
    json cands = json::array();
    for (const PlanCandidate& c : p.candidates) cands.push_back(candidate_json(c));
    json req{{"op", r.op}, {"m", r.m}};
    if (r.op == "ffn")
      req["d"] = r.d, req["f"] = r.f, req["gated"] = r.gated;
    else
      req["n"] = r.n, req["k"] = r.k;
    std::cout << json{{"request", req},        {"preset", p.preset},         {"grid", p.grid},
                      {"ranking", ranking},    {"executor", candidate_json(e)}, {"best", candidate_json(p.candidates.front())},
                      {"candidates", cands},   {"rejected", p.rejected},     {"skipped", p.skipped},
                      {"max_split_waves", r.max_split_waves}, {"left_out", p.left_out}}
                     .dump(2)
              << "\n";
    return;
  }
  fmt::print("{} on {} ({} SMs, one tile per SM)\n\n", shape, p.preset, p.grid);
  fmt::print("Executor's plan ({}):\n", r.op == "ffn" ? "FusedFfn's default options" : "DecodeGemm's default options");
  // Who sums a split tile: the slice of the last K range (the sm90 body's split finisher) on tiles
  // taller than the preset's split_finisher_rows, else the last slice to arrive.
  auto summed_by = [&](const PlanOp& op) -> std::string {
    if (op.split_k <= 1) return "";
    return preset.split_finisher_rows > 0 && op.bm > preset.split_finisher_rows ? "; summed by the slice of the last K range"
                                                                                  : "; summed by the last slice to arrive";
  };
  for (const PlanOp& op : e.ops)
    fmt::print("  {:<8} tile {}x{}x{} (act rows x weight rows x K-step), {} K slice{} ({} K-steps{}), {} tiles\n", op.name,
               op.bm, op.bn, op.bk, op.split_k, op.split_k > 1 ? "s" : "", slices_text(op), summed_by(op), op.tiles);
  fmt::print("  {} tiles in {} tickets, {:.2f} waves of {}, order {}\n", e.tiles, e.tickets, e.waves, p.grid, e.order);
  fmt::print("  model: {:.1f} MB read, {:.1f} MB written, {:.1f} us (partitioned L2 + tile replay); simple L2: {:.1f} MB, {:.1f} us\n\n",
             e.part_read / 1e6, e.part_write / 1e6, e.part_us, e.simple_read / 1e6, e.simple_us);
  fmt::print("Candidates ({} scored; {}):\n", p.candidates.size(), ranking);
  fmt::print("  {:>4}  {:<40} {:<19} {:>6} {:>6}  {:<5} {:>9} {:>9} {:>7}\n", "rank", "knobs (K slices; auto: the executor's)", "slices", "tickets",
             "waves", "model", "read MB", "us", "vs exec");
  const size_t shown = std::min<size_t>(p.candidates.size(), size_t(o.top));
  bool exec_shown = false;
  auto row = [&](size_t i, const PlanCandidate& c) {
    fmt::print("  {:>4}{} {:<40} {:<19} {:>6} {:>6.2f}  {:<5} {:>9.1f} {:>9.1f} {:>6.3f}x{}\n", i + 1, i == 0 ? '*' : ' ', c.label,
               ops_text(c), c.tickets, c.waves, c.refined ? "part" : "simpl", c.read() / 1e6, c.us(), c.ratio,
               c.executor ? "  <- executor" : "");
  };
  for (size_t i = 0; i < shown; ++i) {
    row(i, p.candidates[i]);
    exec_shown |= p.candidates[i].executor;
  }
  if (!exec_shown)
    for (size_t i = shown; i < p.candidates.size(); ++i)
      if (p.candidates[i].executor) fmt::print("  ...\n"), row(i, p.candidates[i]);
  if (shown < p.candidates.size()) fmt::print("  ({} more: --top N)\n", p.candidates.size() - shown);
  const PlanCandidate& b = p.candidates.front();
  fmt::print("\n* model's best: {} -- {:.1f} us, {:.3f}x the executor's plan ({:+.1f} us)\n", b.label, b.us(), b.ratio,
             b.us() - e.part_us);
  for (const std::string& s : p.rejected) fmt::print("rejected by the executor's rules: {}\n", s);
  for (const std::string& s : p.skipped) fmt::print("not scored (--max-split-waves {}): {}\n", r.max_split_waves, s);
  for (const std::string& s : p.left_out) fmt::print("left out: {}\n", s);
}

}  // namespace

void register_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* c = app.add_subcommand("plan", "the executor's plan for an op and shape, and the candidate plans the model ranks beside it");
  c->add_option("op", o->op,
                "ffn (fused FFN: gated, or --plain), gemm (DecodeGemm), attention (DecodeAttention) or prefill "
                "(PrefillAttention)")
      ->required();
  c->add_option("--m", o->m, "activation rows (tokens)");
  c->add_option("--d", o->d, "ffn: hidden size");
  c->add_option("--f", o->f, "ffn: intermediate size");
  c->add_option("--n", o->n, "gemm: output columns (W's rows)");
  c->add_option("--k", o->k, "gemm: inner size");
  c->add_flag("--plain", o->plain, "ffn: a plain two-GEMM MLP (no gate)");
  c->add_option("--batch", o->batch, "attention: sequences (with --len)");
  c->add_option("--heads", o->heads, "attention: query heads / KV heads")->capture_default_str();
  c->add_option("--dim", o->dim, "attention: head dim (64, 128 or 256)")->capture_default_str();
  c->add_option("--len", o->len, "attention: tokens in every sequence's cache (the new one included)");
  c->add_option("--lens", o->lens, "attention: one length per sequence, comma-separated (ragged batches)");
  c->add_option("--page-size", o->page_size, "attention: a paged cache of this many tokens per page (0: contiguous)");
  c->add_flag("--causal", o->causal, "prefill: the causal mask (bottom-right)");
  c->add_flag("--fp8", o->fp8, "prefill: the e4m3 path (head dim 128)");
  c->add_option("--gpu", o->gpu, "GPU preset: h200, h100, a100 or a preset JSON")->capture_default_str();
  c->add_option("--refine", o->refine, "the simple model's best N re-scored with the partitioned model (-1: all)")
      ->capture_default_str();
  c->add_option("--max-split-waves", o->max_split_waves,
                "K slices tried while slices x output tiles <= this many waves of the grid (0: all the executor allows)")
      ->capture_default_str();
  c->add_option("--top", o->top, "candidates printed (--json lists all)")->capture_default_str();
  c->add_flag("--json", o->json_out, "JSON output");
  c->callback([o] { run_plan(*o); });
}

}  // namespace tw::cli
