// `tileweave validate`: issue 17's validation grid on the CPU. The model's columns of every case of
// bench/bench_model_vs_ncu (the same graphs, schedules and grid, through model/validation.hpp, the
// code the bench runs) against the GPU's columns of a merged model_vs_ncu.json (ncu's DRAM read
// bytes, the measured time): per case and, per op family and shape, the largest and the median
// |error|. Without --measured it prints the model's columns of the grid alone. With --timelines, the
// cases whose tile timeline was recorded (FFN: bench_ffn --trace; GEMM: bench_model_vs_ncu
// --trace-dir) replay it instead of drawn drift.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_commands.hpp"
#include "tileweave/model/validation.hpp"

namespace tw::cli {

namespace {

using nlohmann::json;

struct ValidateOptions {
  std::string measured;  // merged model_vs_ncu.json
  std::string gpu = "h200";
  std::string only;      // op or shape name
  std::string ms = "256,512,1024,2048,4096";
  std::string time_from = "partitioned";
  std::string timelines;  // a folder of recorded tile timelines (model/validation.hpp, RecordedTimeline)
  bool per_tensor = false, json_out = false;
};

struct Row {
  std::string op, shape, order, schedule;
  int64_t m = 0;
  double ncu_read = -1, measured_us = -1;
  int64_t simple_read = 0, part_read = 0, part_write = 0;
  double model_us = 0;
  bool replayed = false;  // the partitioned bytes replay a recorded timeline
  TrafficReport part;
};

double pct(double model, double truth) { return truth > 0 ? 100.0 * (model - truth) / truth : 0.0; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int64_t> parse_ms(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string x;
  while (std::getline(ss, x, ',')) {
    try {
      v.push_back(std::stoll(x));
    } catch (const std::exception&) {
      throw InvalidArgument("--ms: '" + x + "' is not a number");
    }
    if (v.back() < 1) throw InvalidArgument("--ms: M must be >= 1, got " + x);
  }
  return v;
}

void run_validate(const ValidateOptions& o) {
  const GpuPreset preset = find_gpu_preset(o.gpu);
  if (o.time_from != "partitioned" && o.time_from != "simple")
    throw InvalidArgument("--time-from must be partitioned or simple, got '" + o.time_from + "'");
  std::vector<Row> rows;
  if (!o.measured.empty()) {
    std::ifstream in(o.measured);
    if (!in) throw InvalidArgument("cannot read '" + o.measured + "'");
    json doc;
    try {
      doc = json::parse(in);
    } catch (const std::exception& e) {
      throw InvalidArgument("'" + o.measured + "': malformed JSON (" + e.what() + ")");
    }
    if (!doc.contains("cases") || !doc["cases"].is_array()) throw InvalidArgument("'" + o.measured + "' has no cases");
    for (const json& c : doc["cases"]) {
      Row r;
      r.op = c.at("op"), r.shape = c.at("shape"), r.order = c.at("order"), r.m = c.at("m");
      // The search's order is recorded by name: a spec (its parameter sweep's), or "search" when it
      // was annealed -- that order was not kept, so the case is skipped.
      r.schedule = c.value("schedule", r.order);
      r.ncu_read = c.value("ncu_read_bytes", -1.0);
      r.measured_us = c.value("measured_us", -1.0);
      rows.push_back(r);
    }
  } else {
    for (const ValidationShape& s : validation_shapes())
      for (int64_t m : parse_ms(o.ms))
        for (const std::string& order : validation_orders())
          if (order != "search") rows.push_back({s.op, s.name, order, order, m});
  }
  const std::vector<RecordedTimeline> timelines =
      o.timelines.empty() ? std::vector<RecordedTimeline>{} : load_recorded_timelines(o.timelines);
  std::vector<Row> done;
  int skipped = 0;
  for (Row& r : rows) {
    if (!o.only.empty() && r.op != o.only && r.shape != o.only) continue;
    if (r.schedule == "search") {
      ++skipped;
      continue;
    }
    const ValidationShape& vs = find_validation_shape(r.shape);
    const ValidationCase vc = make_validation_case(vs, r.m, r.schedule, preset.sms);
    const ValidationModel vm = model_validation_case(vc.graph, vc.schedule, vc.grid, preset, o.time_from == "simple");
    r.simple_read = vm.simple.dram_read;
    r.part_read = vm.partitioned.dram_read;
    r.part_write = vm.partitioned.dram_write;
    r.model_us = vm.time.fused_us;
    r.part = vm.partitioned;
    // A search row whose order is one of the named ones replays that order's timeline.
    if (const RecordedTimeline* t = find_recorded_timeline(timelines, vs, r.m, r.schedule)) {
      r.part = replay_recorded_timeline(vc, *t, validation_cache_config(preset, vc.grid, true));
      r.part_read = r.part.dram_read;
      r.part_write = r.part.dram_write;
      r.replayed = true;
    }
    done.push_back(r);
    if (!o.json_out) {
      fmt::print("{:<4} {:<10} {:>5} {:<18} {:<22}{}", r.op, r.shape, r.m, r.order, r.schedule.substr(0, 22),
                 r.replayed ? " T" : "  ");
      if (r.ncu_read > 0)
        fmt::print(" ncu {:>8.1f} MB  model {:>8.1f} ({:>+6.1f}%)  simple {:>8.1f} ({:>+6.1f}%)", r.ncu_read / 1e6,
                   r.part_read / 1e6, pct(r.part_read, r.ncu_read), r.simple_read / 1e6, pct(r.simple_read, r.ncu_read));
      else
        fmt::print(" model {:>8.1f} MB  simple {:>8.1f} MB", r.part_read / 1e6, r.simple_read / 1e6);
      if (r.measured_us > 0)
        fmt::print("  {:>7.1f} us vs {:>7.1f} ({:>+6.1f}%)\n", r.model_us, r.measured_us, pct(r.model_us, r.measured_us));
      else
        fmt::print("  {:>7.1f} us\n", r.model_us);
      if (o.per_tensor)
        for (const TensorTraffic& t : r.part.per_tensor)
          fmt::print("        {:<10} read {:>9.1f} MB  write {:>8.1f} MB  hit {:>5.1f}%\n", t.name, t.dram_read / 1e6,
                     t.dram_write / 1e6, t.requested_bytes ? 100.0 * t.hit_bytes / t.requested_bytes : 0.0);
      std::fflush(stdout);
    }
  }
  // Per family (op) and per shape: max and median |error|.
  struct Stat {
    std::vector<double> part, simple, time;
  };
  std::map<std::string, Stat> stats;
  for (const Row& r : done) {
    if (r.ncu_read <= 0) continue;
    for (const std::string& key : {std::string("all"), r.op, r.op + " " + r.shape}) {
      Stat& s = stats[key];
      s.part.push_back(std::fabs(pct(r.part_read, r.ncu_read)));
      s.simple.push_back(std::fabs(pct(r.simple_read, r.ncu_read)));
      if (r.measured_us > 0) s.time.push_back(std::fabs(pct(r.model_us, r.measured_us)));
    }
  }
  auto maxof = [](const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); };
  if (o.json_out) {
    json cases = json::array(), summary = json::object();
    for (const Row& r : done) {
      json c{{"op", r.op}, {"shape", r.shape}, {"m", r.m}, {"order", r.order}, {"schedule", r.schedule},
             {"model_read_bytes", r.part_read}, {"model_write_bytes", r.part_write}, {"simple_model_read_bytes", r.simple_read},
             {"model_us", r.model_us}, {"timeline_replayed", r.replayed}};
      if (r.ncu_read > 0) {
        c["ncu_read_bytes"] = r.ncu_read;
        c["read_error_pct"] = pct(r.part_read, r.ncu_read);
        c["simple_read_error_pct"] = pct(r.simple_read, r.ncu_read);
      }
      if (r.measured_us > 0) c["measured_us"] = r.measured_us, c["time_error_pct"] = pct(r.model_us, r.measured_us);
      cases.push_back(c);
    }
    for (const auto& [k, s] : stats)
      summary[k] = {{"cases", s.part.size()},
                    {"max_abs_read_error_pct", maxof(s.part)},
                    {"median_abs_read_error_pct", median(s.part)},
                    {"max_abs_simple_read_error_pct", maxof(s.simple)},
                    {"median_abs_simple_read_error_pct", median(s.simple)},
                    {"max_abs_time_error_pct", maxof(s.time)},
                    {"median_abs_time_error_pct", median(s.time)}};
    std::cout << json{{"preset", preset.name}, {"skipped", skipped}, {"summary", summary}, {"cases", cases}}.dump(2) << "\n";
    return;
  }
  if (skipped) fmt::print("skipped {} case(s) whose order was not recorded (annealed search results)\n", skipped);
  if (stats.empty()) return;
  fmt::print("\n|error| %          cases   read max  read med   simple max  simple med   time max  time med\n");
  for (const auto& [k, s] : stats)
    fmt::print("{:<18} {:>5} {:>10.1f} {:>9.1f} {:>12.1f} {:>11.1f} {:>10.1f} {:>9.1f}\n", k, s.part.size(), maxof(s.part),
               median(s.part), maxof(s.simple), median(s.simple), maxof(s.time), median(s.time));
}

}  // namespace

void register_validate_command(CLI::App& app) {
  auto o = std::make_shared<ValidateOptions>();
  CLI::App* c = app.add_subcommand(
      "validate", "the model's columns of issue 17's validation grid (bench_model_vs_ncu's cases) against a measured model_vs_ncu.json");
  c->add_option("--measured", o->measured, "merged model_vs_ncu.json (ncu and measured columns); without it, the model alone");
  c->add_option("--gpu", o->gpu, "GPU preset: h200, h100, a100 or a preset JSON (bench/l2_probe's)")->capture_default_str();
  c->add_option("--only", o->only, "only the cases of this op (ffn, gemm) or shape (llama3-8b, qwen2-7b, 8b-gate-up, 8b-down)");
  c->add_option("--ms", o->ms, "without --measured: the M values")->capture_default_str();
  c->add_option("--time-from", o->time_from, "which model's bytes the predicted time uses: partitioned | simple")
      ->capture_default_str();
  c->add_option("--timelines", o->timelines,
                 "a folder of recorded tile timelines (bench_ffn --trace, bench_model_vs_ncu --trace-dir): cases with one "
                 "replay it (T) instead of drawn drift");
  c->add_flag("--per-tensor", o->per_tensor, "the partitioned model's bytes per tensor under each case");
  c->add_flag("--json", o->json_out, "JSON output");
  c->callback([o] { run_validate(*o); });
}

}  // namespace tw::cli
