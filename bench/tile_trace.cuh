// One launch's tile timeline, recorded and written one way for every benchmark that records one: the
// fused FFN's (bench_ffn --trace) and the plain GEMM's (bench_model_vs_ncu --trace-dir). The JSON is
// what `tileweave validate --timelines` replays (model/validation.hpp, RecordedTimeline) and
// scripts/plot_trace.py draws: a header naming the case, then per tile its id, coordinates (op, tm,
// tn, ks), SM and times in us from the launch's first ticket (taken, ready, started, computed, done;
// a split tile also arrived / summed).
#pragma once

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.cuh"
#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/runtime/device_plan.hpp"

namespace tw::bench {

struct TracedLaunch {
  double launch_us = 0;  // the traced launch, between events
  std::vector<runtime::DevicePlan::TileTimes> times;
};

// Three launches of `run`, each after the L2 is flushed by reading a buffer 4x its size (reads: no
// dirty lines whose write-backs would slow the launch's start, as a memset's do); the third one's
// timeline. `plan` is the op's plan, built with its trace option; measure_floor must have run first
// (it sets up the read kernel's shared memory).
inline TracedLaunch trace_cold_launch(const Gpu& gpu, const runtime::DevicePlan& plan,
                                      const std::function<void(cudaStream_t)>& run) {
  if (!plan.tracing()) throw std::invalid_argument("trace_cold_launch: the op was built without its trace option");
  const size_t flush_bytes = size_t(gpu.prop.l2CacheSize) * 4;
  char* flush = nullptr;
  TW_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  TW_CUDA_CHECK(cudaMemset(flush, 1, flush_bytes));
  cudaEvent_t e0, e1;
  TW_CUDA_CHECK(cudaEventCreate(&e0));
  TW_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) {
    stream_read(gpu, flush, flush_bytes, 0);
    TW_CUDA_CHECK(cudaEventRecord(e0));
    run(0);
    TW_CUDA_CHECK(cudaEventRecord(e1));
  }
  float ms = 0;
  TW_CUDA_CHECK(cudaEventSynchronize(e1));
  TW_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  TracedLaunch t;
  t.launch_us = ms * 1e3;
  t.times = plan.read_trace();
  TW_CUDA_CHECK(cudaEventDestroy(e0));
  TW_CUDA_CHECK(cudaEventDestroy(e1));
  TW_CUDA_CHECK(cudaFree(flush));
  return t;
}

// The timeline document: `header` (what the case is: "benchmark" and the shape) plus the GPU, the
// graph's op names, the grid, the launch time, the tiles' span, the floor and `weight_bytes` at the floor
// ("floor_us"), the tiles and the date. Prints, under `label`, where the time went: per op the tile
// durations and waits, and when the SMs ran out of work. A tile taken with no done time is an error.
inline nlohmann::json tile_timeline_json(nlohmann::json header, const std::string& label, const Gpu& gpu, const Floor& floor,
                                         const TileGraph& g, int grid, const TracedLaunch& tl, double weight_bytes) {
  nlohmann::json tiles = nlohmann::json::array();
  std::map<int, double> sm_last;
  struct OpStat {
    int n = 0, waited = 0;
    double busy = 0, epilogue = 0, wait = 0, max_wait = 0, first = 1e30, last = 0;
  };
  std::vector<OpStat> ops(g.ops().size());
  double span = 0;
  for (const auto& t : tl.times) {
    const Tile& tile = g.tile(t.tile);
    if (t.taken < 0 && t.done < 0) continue;  // no ticket of its own: a later K slice of a whole ticket
    if (t.done < 0) throw std::runtime_error("trace: tile " + std::to_string(t.tile) + " has no done time");
    OpStat& o = ops[tile.op];
    ++o.n;
    o.busy += t.done - t.started;
    o.epilogue += t.done - t.computed;
    const double w = t.ready - t.taken;
    o.wait += w;
    o.max_wait = std::max(o.max_wait, w);
    o.waited += w > 1.0;
    o.first = std::min(o.first, t.started);
    o.last = std::max(o.last, t.done);
    span = std::max(span, t.done);
    sm_last[t.sm] = std::max(sm_last[t.sm], t.done);
    tiles.push_back({{"id", t.tile}, {"op", tile.op}, {"tm", tile.tm}, {"tn", tile.tn}, {"ks", tile.ks}, {"sm", t.sm},
                     {"taken", t.taken}, {"ready", t.ready}, {"started", t.started}, {"computed", t.computed},
                     {"done", t.done}});
    // A split tile's phases (ffn_sm90.cu): arrived after its partial, and the last slice's sums read.
    if (t.mark1 >= 0) tiles.back()["arrived"] = t.mark1;
    if (t.mark2 >= 0) tiles.back()[t.mark1 >= 0 ? "summed" : "stored"] = t.mark2;  // split tiles: sums read; FFN whole: stores done
  }
  std::vector<double> last;
  for (auto [sm, d] : sm_last) last.push_back(d);
  std::sort(last.begin(), last.end());
  if (last.empty()) throw std::runtime_error("trace: no tiles");
  const double floor_us = weight_bytes / (floor.tbps() * 1e12) * 1e6;
  std::printf("TRACE %s: launch %.1f us (events; weights at %.1f%% of the %.3f TB/s floor), tiles span "
              "%.1f us on %zu SMs; SMs out of work at min %.1f / median %.1f / max %.1f us\n",
              label.c_str(), tl.launch_us, 100 * floor_us / tl.launch_us, floor.tbps(), span, last.size(), last.front(),
              last[last.size() / 2], last.back());
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpStat& o = ops[i];
    std::printf("  op %-8s %4d tiles  mean tile %.2f us (epilogue %.2f)  mean wait %.2f us (max %.2f, %d tiles > 1 us)  "
                "first start %.1f  last done %.1f us\n",
                g.op(int(i)).name.c_str(), o.n, o.busy / std::max(o.n, 1), o.epilogue / std::max(o.n, 1),
                o.wait / std::max(o.n, 1), o.max_wait, o.waited, o.first, o.last);
  }
  nlohmann::json doc = std::move(header);
  doc["gpu"] = gpu.prop.name;
  doc["grid"] = grid;
  doc["launch_us"] = tl.launch_us;
  doc["span_us"] = span;
  doc["floor_read_tbps"] = floor.tbps();
  doc["floor_us"] = floor_us;
  doc["ops"] = nlohmann::json::array();
  for (const Op& o : g.ops()) doc["ops"].push_back(o.name);
  doc["tiles"] = std::move(tiles);
  doc["date_utc"] = utc_now();
  return doc;
}

// `doc` as <dir>/<name>.json (dir created); returns the path. Says so when the file cannot be written.
inline std::string write_tile_timeline(const nlohmann::json& doc, const std::filesystem::path& dir, const std::string& name) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path p = dir / (name + ".json");
  std::ofstream out(p);
  out << doc.dump(1) << "\n";
  if (!out) throw std::runtime_error("trace: cannot write '" + p.string() + "'");
  std::printf("  timeline: %s\n", p.string().c_str());
  return p.string();
}

}  // namespace tw::bench
