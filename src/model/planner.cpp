#include "tileweave/model/planner.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "tileweave/kernels/sm90/tile_shape.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/model/validation.hpp"
#include "tileweave/order/orders.hpp"

namespace tw {

namespace {

constexpr int kMaxSlices = 64;  // the sm90 body's slice table (src/ops/ffn_sm90.hpp)

void check_size(int64_t v, const std::string& what, int64_t max, int64_t multiple) {
  if (v <= 0) throw InvalidArgument("plan: " + what + " must be positive, got " + std::to_string(v));
  if (v > max) throw InvalidArgument("plan: " + what + " = " + std::to_string(v) + " is over the largest the planner takes (" +
                                     std::to_string(max) + ")");
  if (multiple > 1 && v % multiple)
    throw InvalidArgument("plan: " + what + " = " + std::to_string(v) + " must be a multiple of " + std::to_string(multiple) +
                          " (the executor's 16-byte rows)");
}

std::string split_name(int s) { return s ? std::to_string(s) : std::string("auto"); }

std::string label_of(const PlanRequest& r, const PlanKnobs& k) {
  const std::string order = k.order.empty() ? "" : " " + k.order;
  const std::string rows = k.tile_rows ? " rows=" + std::to_string(k.tile_rows) : "";
  if (r.op == "ffn") return "gate_up=" + split_name(k.split_gate_up) + " down=" + split_name(k.split_down) + order + rows;
  return "split=" + split_name(k.split_k) + order + rows;
}

// The slices of an op as a key (two knob values giving the same slices are one candidate).
std::vector<int64_t> slice_key(const Tiling& t) {
  std::vector<int64_t> v{t.split_k};
  v.insert(v.end(), t.k_cuts.begin(), t.k_cuts.end());
  return v;
}

PlanOp op_summary(const Op& o) {
  PlanOp p;
  p.name = o.name;
  p.bm = o.tiling.bm, p.bn = o.tiling.bn, p.bk = o.tiling.bk, p.split_k = o.tiling.split_k;
  for (int64_t ks = 0; ks < o.tiling.split_k; ++ks)
    p.slice_steps.push_back((o.k_begin(ks + 1) - o.k_begin(ks) + o.tiling.bk - 1) / o.tiling.bk);
  p.tiles = o.num_tiles;
  return p;
}

void score(const PlanRequest& r, const GpuPreset& preset, PlanCandidate& c, bool partitioned) {
  std::string order;
  const TileGraph g = plan_graph(r, c.knobs, preset.sms, &preset, &order);
  const Schedule s = make_order(g, order);
  if (order != c.knobs.order) c.label = label_of(r, PlanKnobs{c.knobs.split_gate_up, c.knobs.split_down, c.knobs.split_k, order, c.knobs.tile_rows});
  const TrafficReport t = simulate(g, s, validation_cache_config(preset, preset.sms, partitioned));
  const double us = predict_time(g, s, t, time_params(preset, preset.sms)).fused_us;
  if (partitioned) {
    c.refined = true;
    c.part_read = t.dram_read, c.part_write = t.dram_write, c.part_us = us;
  } else {
    c.simple_read = t.dram_read, c.simple_write = t.dram_write, c.simple_us = us;
  }
  if (c.ops.empty()) {
    for (const Op& o : g.ops()) c.ops.push_back(op_summary(o));
    c.tiles = g.num_tiles();
    c.tickets = s.num_tickets();
    c.waves = double(c.tickets) / preset.sms;
    c.order = order;
  }
}

}  // namespace

std::string ffn_whole_waves_order(int sms) { return "waves:" + std::to_string(sms) + "/kslices/col_major"; }

void check_plan_request(const PlanRequest& r) {
  if (r.op != "ffn" && r.op != "gemm") throw InvalidArgument("plan: unknown op '" + r.op + "' (known: ffn, gemm)");
  check_size(r.m, "M", kPlanMaxM, 1);
  if (r.op == "ffn") {
    check_size(r.d, "d", kPlanMaxDim, 8);
    check_size(r.f, "F", kPlanMaxDim, 8);
  } else {
    check_size(r.n, "N", kPlanMaxDim, 1);
    check_size(r.k, "K", kPlanMaxDim, 8);
  }
}

const std::vector<std::string>& plan_orders() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> o;
    for (const std::string& s : validation_orders())
      if (s != "search") o.push_back(s);
    return o;
  }();
  return v;
}

std::vector<int> plan_splits(int64_t m, int64_t k, int64_t out_tiles, int grid, double max_waves) {
  const int64_t step = sm90::stage_cols_for(sm90::act_rows_for(m));
  const int64_t cap = std::min<int64_t>((k + step - 1) / step, kMaxSlices);
  std::vector<int> v;
  for (int64_t s = 1; s <= cap; s *= 2) {
    if (s > 1 && max_waves > 0 && double(s * out_tiles) > max_waves * grid) break;
    v.push_back(int(s));
  }
  return v;
}

TileGraph plan_graph(const PlanRequest& r, const PlanKnobs& k, int sms, const GpuPreset* preset, std::string* order) {
  if (order) *order = ffn_order_spec(k.order, sms);
  if (r.op == "ffn") {
    const FfnShape fs{r.m, r.d, r.f, r.gated};
    if (is_stream_k_order(k.order)) return build_ffn_graph(fs, sm90_ffn_stream_k_tiling(fs, sms, k.tile_rows)).graph;
    FfnSplits sp{k.split_gate_up, k.split_down};
    // As FusedFfn: the model's splits where it chooses (its default knobs and order, the executor's
    // tile height), and with them, where it runs only the last waves in slices, its order.
    if (preset && !sp.split_gate_up && !sp.split_down && !k.tile_rows)
      sp = choose_ffn_splits(fs, *preset, k.order == PlanKnobs{}.order);
    if (sp.whole_waves && order) *order = ffn_whole_waves_order(sms);
    return build_ffn_graph(fs, sm90_ffn_tiling(fs, sms, sp.split_gate_up, sp.split_down, sp.whole_waves ? "even" : "tail:1",
                                               k.tile_rows))
        .graph;
  }
  if (is_stream_k_order(k.order))  // as DecodeGemm takes order "streamk"
    return decode_gemm_graph(r.m, r.n, r.k, sms, k.split_k ? k.split_k : stream_k_split(r.m, r.n, r.k, sms, k.tile_rows),
                             "even", k.tile_rows);
  return decode_gemm_graph(r.m, r.n, r.k, sms, k.split_k, "even", k.tile_rows);
}

FfnSplits choose_ffn_splits(const FfnShape& s, const GpuPreset& preset, bool whole_waves) {
  FfnSplits best;
  const int sms = preset.sms;
  const CacheConfig cache = validation_cache_config(preset, sms, false);
  const TimeParams tp = time_params(preset, sms);
  auto predict = [&](const FfnTiling& t, bool waves = false) {
    const TileGraph g = build_ffn_graph(s, t).graph;
    const Schedule order = make_order(g, waves ? ffn_whole_waves_order(sms) : "kslices/col_major");
    return predict_time(g, order, simulate(g, order, cache), tp).fused_us;
  };
  const FfnTiling rules = sm90_ffn_tiling(s, sms);
  best.rules_us = best.us = predict(rules);
  if (whole_waves) {
    // The last wave in slices (ffn_splits.hpp). Each op's candidates with the other op at its rule.
    const FfnGraph rg = build_ffn_graph(s, rules);
    double fastest = best.us;
    FfnSplits pick;
    int op_best[2] = {0, 0};
    for (int op = 0; op < 2; ++op) {
      const Op& o = rg.graph.op(op == 0 ? rg.op_gate_up : rg.op_down);
      const int64_t tiles = o.grid_m * o.grid_n, rem = tiles % sms;
      if (tiles <= sms || rem == 0 || o.tiling.split_k != 1) continue;
      double op_fastest = best.rules_us;
      for (int sl : {2, 3, 4, 6, 8, 12, 16}) {
        if (rem * sl > 2 * int64_t(sms)) break;
        FfnTiling t;
        try {
          t = sm90_ffn_tiling(s, sms, op == 0 ? sl : 0, op == 1 ? sl : 0, op == 1 ? "even" : "tail:1");
        } catch (const InvalidArgument&) {
          break;  // more slices than the body takes for this K
        }
        const double us = predict(t, true);
        if (us < op_fastest) op_fastest = us, op_best[op] = sl;
        if (us < fastest) fastest = us, pick = {op == 0 ? sl : 0, op == 1 ? sl : 0, true};
      }
    }
    if (op_best[0] && op_best[1]) {
      const double us = predict(sm90_ffn_tiling(s, sms, op_best[0], op_best[1], "even"), true);
      if (us < fastest) fastest = us, pick = {op_best[0], op_best[1], true};
    }
    if (fastest <= (1 - kFfnModelSplitGain) * best.rules_us) {
      pick.rules_us = best.rules_us;
      pick.us = fastest;
      best = pick;
    }
  }
  if (s.m > kFfnModelSplitWideM) return best;
  const int64_t rows = sm90::act_rows_for(s.m), row_blocks = (s.m + rows - 1) / rows;
  const int64_t gate_up_tiles = row_blocks * (((s.gated ? 2 : 1) * s.f + sm90::kTileRows - 1) / sm90::kTileRows);
  const int64_t down_tiles = row_blocks * ((s.d + sm90::kTileRows - 1) / sm90::kTileRows);
  double fastest = best.us;
  int pick_gu = 0, pick_dn = 0;
  auto consider = [&](int sg, int sd) {
    const int split = sg ? sg : sd;
    if (split * (sg ? gate_up_tiles : down_tiles) > 8 * int64_t(sms)) return;  // split-K only fills waves
    FfnTiling t;
    try {
      t = sm90_ffn_tiling(s, sms, sg, sd);
    } catch (const InvalidArgument&) {
      return;  // more slices than the body takes for this K
    }
    const Tiling &a = sg ? t.gate_up : t.down, &b = sg ? rules.gate_up : rules.down;
    if (a.split_k == b.split_k && a.k_cuts == b.k_cuts) return;  // the rules' own slices
    const double us = predict(t);
    if (us < fastest) fastest = us, pick_gu = sg, pick_dn = sd;
  };
  const bool wide = s.m > kFfnModelSplitMaxM;  // then only gate/up splits finer than the rules' (ffn_splits.hpp)
  for (int sg : {1, 2, 3, 4, 6, 8})
    if (!wide || sg > rules.gate_up.split_k) consider(sg, 0);
  if (!wide)
    for (int sd : {1, 2, 4, 8}) consider(0, sd);
  if (fastest < best.us && fastest <= (1 - kFfnModelSplitGain) * best.rules_us)
    best = {pick_gu, pick_dn, false, best.rules_us, fastest};
  return best;
}

std::vector<PlanKnobs> plan_candidate_knobs(const PlanRequest& r, int sms, std::vector<std::string>* rejected,
                                            std::vector<std::string>* skipped) {
  check_plan_request(r);
  // Tilings: the executor's own (auto) first, then each op's K slices varied with the other's at
  // the executor's rule (FFN), or the GEMM's. Output tiles per op from the executor's own graph.
  const TileGraph base = plan_graph(r, PlanKnobs{}, sms);
  auto splits = [&](int op, int64_t k) {
    const Op& o = base.op(op);
    const int64_t out = o.grid_m * o.grid_n;
    std::vector<int> v = plan_splits(r.m, k, out, sms, r.max_split_waves);
    const std::vector<int> all = plan_splits(r.m, k);
    if (skipped && all.size() > v.size())
      skipped->push_back(o.name + ": K slices " + std::to_string(all[v.size()]) +
                         (all.size() > v.size() + 1 ? ".." + std::to_string(all.back()) : std::string()) + " (" +
                         std::to_string(out) + " output tiles x slices over " +
                         std::to_string(int64_t(r.max_split_waves * sms)) + " tiles = max_split_waves x grid)");
    return v;
  };
  std::vector<PlanKnobs> tilings{PlanKnobs{}};
  if (r.op == "ffn") {
    for (int s : splits(1, r.f)) tilings.push_back({0, s, 0, "", 0});
    for (int s : splits(0, r.d)) tilings.push_back({s, 0, 0, "", 0});
  } else {
    for (int s : splits(0, r.k)) tilings.push_back({0, 0, s, "", 0});
  }
  std::vector<PlanKnobs> out;
  std::vector<std::vector<std::vector<int64_t>>> seen;
  for (PlanKnobs t : tilings) {
    std::vector<std::vector<int64_t>> key;
    try {
      if (r.op == "ffn") {
        const FfnTiling ft = sm90_ffn_tiling({r.m, r.d, r.f, r.gated}, sms, t.split_gate_up, t.split_down);
        key = {slice_key(ft.gate_up), slice_key(ft.down)};
      } else {
        key = {slice_key(decode_gemm_graph(r.m, r.n, r.k, sms, t.split_k).op(0).tiling)};
      }
    } catch (const InvalidArgument& e) {
      // The executor itself refuses its own default only where the shape is out of its reach.
      if (t == PlanKnobs{}) throw;
      t.order = "";
      if (rejected) rejected->push_back(label_of(r, t) + ": " + e.what());
      continue;
    }
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    for (const std::string& o : plan_orders()) {
      t.order = o;
      out.push_back(t);
    }
  }
  // Where the powers of two (tile_rows "pow2") differ from the executor's fitted heights, the
  // executor's plan on them. Stream-K (order "streamk"; plan_graph builds it) is no candidate: on the
  // H200 it ran 1.19x slower than the default (geomean of the seed-16 sweep, faster on 2 of 64),
  // because a ticket's slices each restart the weight stream (docs/executor.md, "Stream-K"). The
  // replay now charges that (GpuPreset::slice_restart_us) and ranks it slower too.
  const int pow2 = sm90::act_rows_for(r.m);
  if (pow2 != sm90::fit_act_rows(r.m)) out.push_back({0, 0, 0, "kslices/col_major", pow2});
  // The executor's own plan first: its tiling with its default order.
  const auto it = std::find(out.begin(), out.end(), PlanKnobs{});
  if (it != out.end()) std::rotate(out.begin(), it, it + 1);
  return out;
}

PlanResult make_plan(const PlanRequest& r, const GpuPreset& preset) {
  PlanResult res;
  res.request = r;
  res.preset = preset.name;
  res.grid = preset.sms;
  const std::vector<PlanKnobs> knobs = plan_candidate_knobs(r, preset.sms, &res.rejected, &res.skipped);
  std::vector<PlanCandidate> cs;
  for (const PlanKnobs& k : knobs) {
    PlanCandidate c;
    c.knobs = k;
    c.label = label_of(r, k);
    c.executor = k == PlanKnobs{};
    score(r, preset, c, false);
    cs.push_back(std::move(c));
  }
  // Rank by the simple model (ties: fewer bytes, then the enumeration order), re-score the best
  // `refine` and the executor's plan with the partitioned model, rank those first by it.
  std::stable_sort(cs.begin(), cs.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.simple_us != b.simple_us) return a.simple_us < b.simple_us;
    return a.simple_read < b.simple_read;
  });
  const size_t refine = r.refine < 0 ? cs.size() : std::min<size_t>(cs.size(), size_t(r.refine));
  for (size_t i = 0; i < cs.size(); ++i)
    if (i < refine || cs[i].executor) score(r, preset, cs[i], true);
  std::stable_sort(cs.begin(), cs.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.refined != b.refined) return a.refined;
    if (a.us() != b.us()) return a.us() < b.us();
    return a.read() < b.read();
  });
  for (const PlanCandidate& c : cs)
    if (c.executor) res.executor = c;
  for (PlanCandidate& c : cs) {
    const double base = c.refined ? res.executor.part_us : res.executor.simple_us;
    c.ratio = base > 0 ? c.us() / base : 0;
  }
  res.executor.ratio = 1;
  res.candidates = std::move(cs);
  res.left_out = {
      "tile heights other than the executor's and the fitted one (tile_rows: any multiple of 32 from 96 to 256), "
      "and weight rows per tile (128, fixed by the body)",
      "tiles per SM and ring depth: one CTA per SM (the sm90 body takes over half the shared memory), its "
      "ring fixed by the body",
      r.op == "ffn" ? "down_slices other than tail:1 (even, tail:2..4), and both splits varied together: executor "
                      "knobs the planner does not enumerate"
                    : "k_slices other than even (tail:1..4): a DecodeGemm knob the planner does not enumerate",
      "orders other than the validation grid's five (dataflow, chain orders, the search's): see tileweave search",
  };
  return res;
}

}  // namespace tw
