// The traffic model against the GPU (issue 17's validation grid): the fused FFN and the plain GEMM
// on the tile executor, two shapes each, M in {256, 512, 1024, 2048, 4096}, six orders (row, col,
// grouped:8, hilbert, the default kslices/col_major, and the heuristic search's best), each launch
// cold (L2 flushed by a memset 4x its size). bench/model_vs_ncu.py runs it twice and merges:
//   bench_model_vs_ncu [--gpu-preset FILE.json] [--ms 256,...] [--quick]
//       per case: the model's DRAM bytes (simple and partitioned L2) and predicted time for the
//       executor's own graph and schedule, and the measured time (median of 5 cold launches)
//       -> $TW_RESULTS_DIR/<gpu>/model_vs_ncu_timing.json
//   bench_model_vs_ncu --ncu [...]   the same cases, each launched once more between
//       cudaProfilerStart/Stop after two warm-ups, for `ncu --profile-from-start off` (one kernel per
//       case, in case order). The search's orders are saved by the first run and reused here, so
//       both runs measure the same schedules.
//   bench_model_vs_ncu --trace-dir DIR [--ms 1024,2048,4096] [--only 8b-down]   the plain GEMM cases'
//       tile timelines: one launch each (the third, L2 flushed before each; tile_trace.cuh), written
//       as DIR/gemm_trace_<shape>_m<M>_<order>.json for `tileweave validate --timelines DIR`. The
//       search's order is the saved one if the first run left it, else searched as that run does; a
//       search that found one of the named orders reuses that order's timeline. (The FFN cases'
//       timelines: bench_ffn --trace 'mainloop=sm90,order=<order>'.)
//   --only OP|SHAPE: only the cases of this op (ffn, gemm) or shape, as `tileweave validate --only`.
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "harness.cuh"
#include "tile_trace.cuh"
#include "tileweave/model/l2_model.hpp"
#include "tileweave/model/presets.hpp"
#include "tileweave/model/time_model.hpp"
#include "tileweave/model/validation.hpp"
#include "tileweave/ops/decode_gemm.hpp"
#include "tileweave/ops/ffn.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/order/search.hpp"

using namespace tw;
using namespace tw::bench;
using bf16 = __nv_bfloat16;

namespace {

// The grid (shapes, orders) and the model's columns come from model/validation.hpp, which
// `tileweave validate` uses to recompute them on a CPU.
using Shape = ValidationShape;

// The executor object of one case, behind one interface.
struct Runner {
  std::function<void(cudaStream_t)> run;
  const TileGraph* graph = nullptr;
  Schedule schedule;
  int grid = 0;
  const runtime::DevicePlan* plan = nullptr;  // its tile timeline, when built to trace
  std::shared_ptr<void> keep;                 // the op object
};

std::string order_file(const Gpu& gpu, const Shape& s, int64_t m) {
  const char* dir = std::getenv("TW_RESULTS_DIR");
  std::filesystem::path p = std::filesystem::path(dir ? dir : "bench/results") / gpu.slug / "model_vs_ncu_orders";
  std::filesystem::create_directories(p);
  return (p / (s.name + "_m" + std::to_string(m) + ".json")).string();
}

// A file name's part from an order spec: "kslices/col_major" -> "kslices-col_major", "grouped:8" ->
// "grouped-8" (the file's header holds the spec itself).
std::string file_part(std::string spec) {
  for (char& c : spec)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '-';
  return spec;
}

}  // namespace

int main(int argc, char** argv) {
  std::string preset_file, ms_arg = "256,512,1024,2048,4096", trace_dir, only;
  bool ncu = false, quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--gpu-preset") && i + 1 < argc) preset_file = argv[++i];
    else if (!std::strcmp(argv[i], "--ms") && i + 1 < argc) ms_arg = argv[++i];
    else if (!std::strcmp(argv[i], "--ncu")) ncu = true;
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--trace-dir") && i + 1 < argc) trace_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "bench_model_vs_ncu: unknown argument '%s'\nusage: bench_model_vs_ncu [--ncu | --trace-dir DIR] "
                   "[--gpu-preset FILE.json] [--ms 256,512] [--quick] [--only ffn|gemm|SHAPE]\n", argv[i]);
      return 2;
    }
  }
  const bool tracing = !trace_dir.empty();
  if (tracing && ncu) {
    std::fprintf(stderr, "bench_model_vs_ncu: --trace-dir and --ncu are separate runs (a traced launch stores its times)\n");
    return 2;
  }
  if (!only.empty() && only != "ffn" && only != "gemm") {
    try {
      find_validation_shape(only);
    } catch (const InvalidArgument& e) {
      std::fprintf(stderr, "bench_model_vs_ncu: --only '%s': %s\n", only.c_str(), e.what());
      return 2;
    }
  }
  if (tracing && (only == "ffn" || (!only.empty() && only != "gemm" && find_validation_shape(only).op != "gemm"))) {
    std::fprintf(stderr, "bench_model_vs_ncu: --trace-dir records the plain GEMM cases; --only '%s' has none "
                 "(the FFN's timelines: bench_ffn --trace 'mainloop=sm90,order=<order>')\n", only.c_str());
    return 2;
  }
  try {
    const Gpu gpu = current_gpu();
    const GpuPreset preset = preset_file.empty() ? find_gpu_preset(gpu.slug == "h100" ? "h100" : "h200")
                                                 : find_gpu_preset(preset_file);
    const Floor floor = ncu ? Floor{} : measure_floor(gpu);
    ResultFile rf("model_vs_ncu_timing", gpu, floor);
    rf.doc["preset"] = preset.name;
    rf.doc["method"] = "model: simulate() of the executor's own graph and schedule, cache = the L2, in flight = the grid; "
                       "measured_us: median of 5 launches, each after a memset of 4x the L2";
    const size_t flush_bytes = size_t(gpu.prop.l2CacheSize) * 4;
    char* flush;
    TW_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
    int case_id = 0;
    for (const Shape& s : validation_shapes())
      for (int m : parse_counts(ms_arg, "--ms")) {
        if (!only.empty() && only != s.op && only != s.name) continue;
        if (tracing && s.op != "gemm") continue;  // bench_ffn --trace records the FFN's timelines
        std::vector<std::string> traced;  // the orders whose timeline this shape and M have
        // Operands for the largest use of this shape and M.
        const int64_t n1 = s.op == "ffn" ? 2 * s.f : s.f;
        bf16 *w0, *w1 = nullptr, *x, *y;
        TW_CUDA_CHECK(cudaMalloc(&w0, n1 * s.d * sizeof(bf16)));
        if (s.op == "ffn") TW_CUDA_CHECK(cudaMalloc(&w1, s.d * s.f * sizeof(bf16)));
        TW_CUDA_CHECK(cudaMalloc(&x, m * s.d * sizeof(bf16)));
        TW_CUDA_CHECK(cudaMalloc(&y, m * std::max(s.d, s.f) * sizeof(bf16)));
        fill_noise_bf16(w0, n1 * s.d, 17, 0.02f);
        if (w1) fill_noise_bf16(w1, s.d * s.f, 18, 0.02f);
        fill_noise_bf16(x, m * s.d, 19, 1.f);
        for (const std::string& order : validation_orders()) {
          if (quick && order != "col_major" && order != "kslices/col_major") continue;
          Runner r;
          auto make = [&](const std::string& spec, const Schedule* sched) {
            Runner q;
            if (s.op == "ffn") {
              FfnOptions o;
              o.order = spec;
              auto ffn = sched ? std::make_shared<FusedFfn>(FfnShape{m, s.d, s.f, true}, o, *sched)
                               : std::make_shared<FusedFfn>(FfnShape{m, s.d, s.f, true}, o);
              q.run = [ffn, x, w0, w1, y](cudaStream_t st) { ffn->run(x, w0, w1, y, st); };
              q.graph = &ffn->graph().graph, q.schedule = ffn->schedule(), q.grid = ffn->grid(), q.keep = ffn;
            } else {
              DecodeGemmOptions o;
              o.order = spec;
              o.trace = tracing;
              auto g = std::make_shared<DecodeGemm>(m, s.f, s.d, o);
              q.run = [g, x, w0, y](cudaStream_t st) { g->run(y, x, w0, st); };
              q.graph = &g->graph(), q.schedule = g->schedule(), q.grid = g->grid(), q.plan = &g->plan(), q.keep = g;
            }
            return q;
          };
          CacheConfig cc;
          cc.capacity_bytes = gpu.prop.l2CacheSize;
          cc.line_bytes = 32;
          if (order != "search") {
            r = make(order, nullptr);
          } else {
            // The search's best order on the simple model (a fixed number of evaluations: the same
            // order every run), saved for the --ncu run. DecodeGemm takes specs only: its search
            // result is used when it is a spec (the parameter sweep's), else the case is skipped.
            const std::string file = order_file(gpu, s, m);
            Runner base = make("kslices/col_major", nullptr);
            cc.in_flight = base.grid;
            Schedule found;
            if (ncu || (tracing && std::filesystem::exists(file))) {
              found = load_order_file(*base.graph, file);
            } else {
              HeuristicOptions ho;
              ho.time_limit_s = 600;
              ho.max_evaluations = 60;
              found = heuristic_search(*base.graph, cc, ho).best;
              std::ofstream(file) << schedule_to_json(*base.graph, found) << "\n";
            }
            if (s.op == "ffn") {
              r = make("kslices/col_major", &found);
            } else {
              try {
                r = make(found.name, nullptr);
              } catch (const InvalidArgument&) {
                std::printf("skip %s M=%d search: its order '%s' is not a spec\n", s.name.c_str(), m, found.name.c_str());
                continue;
              }
            }
          }
          const std::string label = r.schedule.name;
          if (tracing && std::find(traced.begin(), traced.end(), label) != traced.end()) {
            std::printf("%s M=%d %s: its order '%s' was traced above\n", s.name.c_str(), m, order.c_str(), label.c_str());
            continue;
          }
          if (ncu) {
            for (int i = 0; i < 2; ++i) r.run(0);
            TW_CUDA_CHECK(cudaMemsetAsync(flush, case_id & 0xff, flush_bytes, 0));
            TW_CUDA_CHECK(cudaDeviceSynchronize());
            TW_CUDA_CHECK(cudaProfilerStart());
            r.run(0);
            TW_CUDA_CHECK(cudaDeviceSynchronize());
            TW_CUDA_CHECK(cudaProfilerStop());
            std::printf("CASE %d %s %s m=%d %s\n", case_id++, s.op.c_str(), s.name.c_str(), m, order.c_str());
            continue;
          }
          // The host's rebuild of this case (what `tileweave validate` models) must be the graph the
          // executor runs; say so where it is not.
          std::string why;
          try {
            const ValidationCase host = make_validation_case(s, m, label, gpu.prop.multiProcessorCount);
            if (!validation_graphs_match(*r.graph, host.graph, &why) || host.schedule.order != r.schedule.order)
              std::printf("warning: %s M=%d %s: the host rebuild differs from the executor's graph or schedule (%s)\n",
                          s.name.c_str(), m, label.c_str(), why.empty() ? "schedule" : why.c_str());
          } catch (const InvalidArgument&) {  // an annealed search order ("search") is no spec to rebuild
            std::printf("note: %s M=%d: order '%s' cannot be rebuilt on the host\n", s.name.c_str(), m, label.c_str());
          }
          if (tracing) {
            // One format for every recorded timeline (tile_trace.cuh); the header names the case as
            // `tileweave validate` finds it: the shape's N and K, M and the schedule's spec.
            const TracedLaunch tl = trace_cold_launch(gpu, *r.plan, r.run);
            const nlohmann::json header = {{"benchmark", "gemm_trace"}, {"shape", s.name}, {"n", s.f}, {"k", s.d},
                                           {"m", m}, {"order", label}};
            const std::string name = s.name + " M=" + std::to_string(m) + " " + label;
            write_tile_timeline(tile_timeline_json(header, name, gpu, floor, *r.graph, r.grid, tl, double(s.f) * s.d * 2),
                                trace_dir, "gemm_trace_" + s.name + "_m" + std::to_string(m) + "_" + file_part(label));
            traced.push_back(label);
            continue;
          }
          GpuPreset model_gpu = preset;
          model_gpu.l2_bytes = gpu.prop.l2CacheSize;
          const ValidationModel vm = model_validation_case(*r.graph, r.schedule, r.grid, model_gpu);
          const TrafficReport& simple = vm.simple;
          const TrafficReport& part = vm.partitioned;
          const TimePrediction& t = vm.time;
          // Measured: 5 cold launches, median.
          cudaEvent_t e0, e1;
          TW_CUDA_CHECK(cudaEventCreate(&e0));
          TW_CUDA_CHECK(cudaEventCreate(&e1));
          r.run(0);
          std::vector<double> us;
          for (int i = 0; i < 5; ++i) {
            TW_CUDA_CHECK(cudaMemsetAsync(flush, i, flush_bytes, 0));
            TW_CUDA_CHECK(cudaEventRecord(e0, 0));
            r.run(0);
            TW_CUDA_CHECK(cudaEventRecord(e1, 0));
            TW_CUDA_CHECK(cudaEventSynchronize(e1));
            float ms;
            TW_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            us.push_back(ms * 1e3);
          }
          std::sort(us.begin(), us.end());
          rf.add({{"case", case_id++}, {"op", s.op}, {"shape", s.name}, {"m", m}, {"order", order}, {"schedule", label},
                  {"grid", r.grid}, {"model_read_bytes", part.dram_read}, {"model_write_bytes", part.dram_write},
                  {"simple_model_read_bytes", simple.dram_read}, {"model_us", t.fused_us}, {"measured_us", us[2]}});
          std::printf("%-5s %-12s M=%-5d %-18s model %.1f MB (simple %.1f MB), %.1f us predicted, %.1f us measured\n",
                      s.op.c_str(), s.name.c_str(), m, order.c_str(), part.dram_read / 1e6, simple.dram_read / 1e6,
                      t.fused_us, us[2]);
          TW_CUDA_CHECK(cudaEventDestroy(e0));
          TW_CUDA_CHECK(cudaEventDestroy(e1));
        }
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        for (void* p : {(void*)w0, (void*)w1, (void*)x, (void*)y})
          if (p) TW_CUDA_CHECK(cudaFree(p));
      }
    if (!ncu && !tracing) std::printf("wrote %s\n", rf.write(gpu).c_str());
    TW_CUDA_CHECK(cudaFree(flush));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model_vs_ncu: %s\n", e.what());
    return 1;
  }
  return 0;
}
