// Prefill attention for diffusion transformers (issue 20): tw::PrefillAttention on full self-attention
// over one (or a few packed) sequences, bf16, against the bf16 GEMM peak measured in the same run
// (cuBLASLt 8192^3, fp32 accumulate). TFLOP/s = flops() / time: 4 L^2 d H non-causal, the exact
// masked count causal. bench/dit_attention_torch.py times the peers (torch SDPA backends,
// FlashInfer fa2/fa3) on the same cases and merges them into the same file.
//   bench_dit_attention [--cases H:d:L[:c][:bN],...] [--dtypes bf16,bf16_whole,fp8,bf16_sm80] [--reps N] [--out DIR]
//                       [--quick]
//     c: causal; bN: N packed sequences of length L (default 1)
//     bf16_whole: the sm90 kernel with every item whole (shape.split_tail = false), the A/B of the
//     tail's key-range splits: the bf16 row then has split_gain = its us / bf16's. --ab-rounds N: the
//     two timed N times per case in alternating order, each row's us the median (us_rounds: all).
//     fp8 (d = 128 cases): us is the e4m3 attention on inputs quantized beforehand, quant_us the
//     quantization, us_with_quant the op's run() (both); its accuracy against this project's bf16
//     output on Gaussian inputs with four channels 4x larger (cosine, max error / max|bf16|).
//     JSON -> DIR/dit_attention.json (DIR: $TW_RESULTS_DIR/<gpu> or bench/results/<gpu>); a re-run
//     replaces the measured fields of a matching case and keeps the rest (the peers' fields).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "cublas_baseline.cuh"
#include "harness.cuh"
#include "tileweave/ops/prefill_attention.hpp"

namespace {

using bf16 = __nv_bfloat16;
using json = nlohmann::ordered_json;  // keeps the fields in the order written (and the peer script's order)

struct Case {
  int H, d, L;
  bool causal = false;
  int batch = 1;
};

// The issue's peer table and bars first, then the spread of H, d and odd L the bars ask for.
const std::vector<Case> kDefaultCases = {{24, 128, 4608},  {24, 128, 8704},       {24, 128, 14034},    {24, 64, 4429},
                                         {40, 128, 32760}, {8, 128, 1024},        {48, 128, 8192},     {24, 64, 16384},
                                         {16, 128, 4097},  {24, 128, 8704, true}, {24, 64, 4429, true}};
const std::vector<Case> kQuickCases = {{24, 128, 4608}, {24, 64, 4429}, {24, 128, 8704, true}};

// "H:d:L[:c][:bN]" -> Case; anything else is an error naming the field.
Case parse_case(const std::string& s) {
  const auto f = tw::bench::split_list(s, ':');
  if (f.size() < 3) throw std::invalid_argument("--cases: '" + s + "' is not H:d:L[:c][:bN]");
  const auto hdl = tw::bench::parse_counts(f[0] + "," + f[1] + "," + f[2], "--cases");
  if (hdl.size() != 3) throw std::invalid_argument("--cases: '" + s + "' is not H:d:L[:c][:bN]");
  Case c{hdl[0], hdl[1], hdl[2]};
  for (size_t i = 3; i < f.size(); ++i) {
    if (f[i] == "c")
      c.causal = true;
    else if (f[i][0] == 'b')
      c.batch = tw::bench::parse_counts(f[i].substr(1), "--cases batch")[0];
    else
      throw std::invalid_argument("--cases: '" + f[i] + "' in '" + s + "' is neither c nor bN");
  }
  return c;
}

// The identity of a case across runs and across the two scripts (batch 1 when absent).
bool same_case(const json& a, const json& b) {
  for (const char* k : {"op", "dtype"})
    if (a.value(k, std::string()) != b.value(k, std::string())) return false;
  for (const char* k : {"H", "d", "L"})
    if (a.value(k, 0) != b.value(k, 0)) return false;
  return a.value("causal", false) == b.value("causal", false) && a.value("batch", 1) == b.value("batch", 1);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tw::bench;
  bool quick = false;
  int reps = 0;
  int ab_rounds = 1;
  std::string out_dir, cases_arg, dtypes_arg = "bf16,fp8";
  try {
    for (int i = 1; i < argc; ++i) {
      const bool has_value = i + 1 < argc;
      if (!std::strcmp(argv[i], "--quick"))
        quick = true;
      else if (!std::strcmp(argv[i], "--cases") && has_value)
        cases_arg = argv[++i];
      else if (!std::strcmp(argv[i], "--dtypes") && has_value)
        dtypes_arg = argv[++i];
      else if (!std::strcmp(argv[i], "--ab-rounds") && has_value)
        ab_rounds = parse_counts(argv[++i], "--ab-rounds")[0];
      else if (!std::strcmp(argv[i], "--reps") && has_value)
        reps = parse_counts(argv[++i], "--reps")[0];
      else if (!std::strcmp(argv[i], "--out") && has_value)
        out_dir = argv[++i];
      else
        throw std::invalid_argument(std::string("unknown or incomplete argument '") + argv[i] + "'");
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr,
                 "bench_dit_attention: %s\nusage: %s [--cases H:d:L[:c][:bN],...] [--dtypes bf16,fp8] [--reps N] "
                 "[--ab-rounds N] [--out DIR] [--quick]\n",
                 e.what(), argv[0]);
    return 2;
  }
  std::vector<Case> cases = quick ? kQuickCases : kDefaultCases;
  if (!cases_arg.empty()) {
    cases.clear();
    try {
      for (const auto& s : split_list(cases_arg)) cases.push_back(parse_case(s));
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "bench_dit_attention: %s\n", e.what());
      return 2;
    }
  }
  if (reps == 0) reps = quick ? 10 : 50;
  bool run_bf16 = false, run_fp8 = false, run_sm80 = false, run_whole = false;
  for (const auto& d : split_list(dtypes_arg)) {
    if (d == "bf16")
      run_bf16 = true;
    else if (d == "fp8")
      run_fp8 = true;
    else if (d == "bf16_sm80")
      run_sm80 = true;
    else if (d == "bf16_whole")
      run_whole = true;
    else {
      std::fprintf(stderr, "bench_dit_attention: --dtypes: '%s' is not bf16, bf16_whole, fp8 or bf16_sm80\n",
                   d.c_str());
      return 2;
    }
  }

  const Gpu gpu = current_gpu();
  if (gpu.prop.major != 9 || gpu.prop.minor != 0) {
    std::printf("bench_dit_attention: needs an sm_90 GPU, found %s: skipped\n", gpu.prop.name);
    return 0;
  }
  if (out_dir.empty()) {
    const char* dir = std::getenv("TW_RESULTS_DIR");
    out_dir = (std::filesystem::path(dir ? dir : "bench/results") / gpu.slug).string();
  }
  // The cases first, the GEMM peak last (each in its steady state); the ratios are filled in after.

  std::vector<json> rows;
  auto print_row = [](const Case& c, const json& row) {
    const std::string dt = row["dtype"].get<std::string>();
    if (row.contains("us"))
      std::printf("H=%2d d=%3d L=%6d %-6s b=%d %-8s: %9.1f us %6.0f TFLOP/s\n", c.H, c.d, c.L,
                  c.causal ? "causal" : "full", c.batch, dt.c_str(), row["us"].get<double>(),
                  row["tflops"].get<double>());
    else
      std::printf("H=%2d d=%3d L=%6d %-6s b=%d %-8s: skipped (%s)\n", c.H, c.d, c.L, c.causal ? "causal" : "full",
                  c.batch, dt.c_str(), row["skipped"].get<std::string>().c_str());
    std::fflush(stdout);
  };
  for (const Case& c : cases) {
    const int total = c.batch * c.L;
    tw::PrefillAttentionShape shape;
    shape.num_q_heads = shape.num_kv_heads = c.H;
    shape.head_dim = c.d;
    shape.causal = c.causal;
    std::vector<int> cu(c.batch + 1);
    for (int b = 0; b <= c.batch; ++b) cu[b] = b * c.L;
    const json key = {{"op", "attention"}, {"H", c.H},         {"d", c.d}, {"L", c.L}, {"causal", c.causal},
                      {"batch", c.batch},  {"dtype", "bf16"}};
    const size_t elems = size_t(total) * c.H * c.d;
    bf16 *q, *k, *v, *o, *o_ref;
    for (bf16** p : {&q, &k, &v, &o, &o_ref}) TW_CUDA_CHECK(cudaMalloc(p, elems * sizeof(bf16)));
    // Once outside capture: the first run sets the kernel's shared-memory attribute, which a
    // capture must not see, and surfaces a bad launch here rather than inside the graph. One input
    // set, no rotation: the kernel is compute-bound (each K/V tile is read by every query tile of
    // its head, from L2), so whether a replay starts with its inputs in L2 moves the time by
    // little; the peers are timed the same way.
    auto time_op = [&](const std::function<void(cudaStream_t)>& run) {
      run(nullptr);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      const auto make = [&](int, cudaStream_t st) { run(st); };
      return time_us(make, 1, steady_warmup(time_us(make, 1, 1, 3)), reps);
    };
    // A bf16 row: the sm90 kernel, or (bf16_sm80) the mma.sync one on this GPU.
    auto bf16_row = [&](const std::string& dtype, const char* mainloop, bool split_tail = true) -> json {
      json row = key;
      row["dtype"] = dtype;
      fill_noise_bf16(q, elems, 1);
      fill_noise_bf16(k, elems, 2);
      fill_noise_bf16(v, elems, 3);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      tw::PrefillAttentionShape s = shape;
      s.mainloop = mainloop;
      s.split_tail = split_tail;
      try {
        const tw::PrefillAttention op(s, cu);
        const tw::PrefillAttentionTensors t{q, k, v, o};
        const double us = time_op([&](cudaStream_t st) { op.run(t, st); });
        const tw::PrefillWork& w = op.work();
        row.update({{"flops", op.flops()}, {"us", us}, {"tflops", op.flops() / us * 1e-6}, {"work_items", w.items},
                    {"tail_items", w.items - w.whole}, {"tail_units", w.units()}, {"split_items", w.groups},
                    {"planned_gain", w.makespan_whole / w.makespan}});
      } catch (const tw::InvalidArgument& e) {  // a shape the op does not take yet: recorded, not fatal
        row["skipped"] = e.what();
      }
      print_row(c, row);
      return row;
    };
    if (run_bf16 && run_whole) {  // the A/B, interleaved: the clocks drift by a few % from case to case
      std::vector<json> ab[2];
      for (int r = 0; r < ab_rounds; ++r)
        for (int k = 0; k < 2; ++k) {
          const int which = (r + k) % 2;  // split first in even rounds
          ab[which].push_back(which == 0 ? bf16_row("bf16", "auto") : bf16_row("bf16_whole", "auto", false));
        }
      for (auto& runs : ab) {
        json row = runs[0];
        if (row.contains("us")) {
          std::vector<double> us;
          for (const json& x : runs) us.push_back(x["us"].get<double>());
          row["us_rounds"] = us;
          row["us"] = median_of(us);
          row["tflops"] = row["flops"].get<double>() / row["us"].get<double>() * 1e-6;
        }
        rows.push_back(std::move(row));
      }
    } else {
      if (run_bf16) rows.push_back(bf16_row("bf16", "auto"));
      if (run_whole) rows.push_back(bf16_row("bf16_whole", "auto", false));
    }
    if (run_sm80) rows.push_back(bf16_row("bf16_sm80", "sm80"));
    if (run_fp8 && c.d == 128) {
      json row = key;
      row["dtype"] = "fp8_e4m3";
      fill_outliers_bf16(q, elems, 11, c.d, 4.f);
      fill_outliers_bf16(k, elems, 12, c.d, 4.f);
      fill_outliers_bf16(v, elems, 13, c.d, 4.f);
      tw::PrefillAttentionShape s8 = shape;
      s8.fp8 = true;
      try {
        const tw::PrefillAttention ref(shape, cu), op(s8, cu);
        const tw::PrefillAttentionTensors t_ref{q, k, v, o_ref}, t{q, k, v, o};
        ref.run(t_ref, nullptr);
        op.run(t, nullptr);
        TW_CUDA_CHECK(cudaDeviceSynchronize());
        // Accuracy against the bf16 kernel's output on the same inputs.
        std::vector<bf16> a(elems), r(elems);
        TW_CUDA_CHECK(cudaMemcpy(a.data(), o, elems * sizeof(bf16), cudaMemcpyDeviceToHost));
        TW_CUDA_CHECK(cudaMemcpy(r.data(), o_ref, elems * sizeof(bf16), cudaMemcpyDeviceToHost));
        double dot = 0, na = 0, nr = 0, max_err = 0, max_ref = 0;
        for (size_t i = 0; i < elems; ++i) {
          const double x = __bfloat162float(a[i]), y = __bfloat162float(r[i]);
          dot += x * y;
          na += x * x;
          nr += y * y;
          max_err = std::max(max_err, std::isfinite(x) ? std::fabs(x - y) : INFINITY);
          max_ref = std::max(max_ref, std::fabs(y));
        }
        const double quant_us = time_op([&](cudaStream_t st) { op.quantize(t, st); });
        double us = time_op([&](cudaStream_t st) { op.run_quantized(t, st); });
        const double both_us = time_op([&](cudaStream_t st) { op.run(t, st); });
        if (run_whole) {  // the tail's A/B at e4m3: the same op with every item whole, rounds interleaved
          tw::PrefillAttentionShape s8w = s8;
          s8w.split_tail = false;
          const tw::PrefillAttention op_w(s8w, cu);
          op_w.quantize(t, nullptr);
          std::vector<double> split_us{us}, whole_us;
          for (int r = 0; r < ab_rounds; ++r) {
            whole_us.push_back(time_op([&](cudaStream_t st) { op_w.run_quantized(t, st); }));
            if (r + 1 < ab_rounds) split_us.push_back(time_op([&](cudaStream_t st) { op.run_quantized(t, st); }));
          }
          us = median_of(split_us);
          const double whole = median_of(whole_us);
          row.update({{"whole_us", whole}, {"split_gain", whole / us},
                      {"split_items", op.work().groups}, {"work_items", op.work().items},
                      {"planned_gain", op.work().makespan_whole / op.work().makespan}});
        }
        row.update({{"flops", op.flops()},
                    {"us", us},
                    {"tflops", op.flops() / us * 1e-6},
                    {"quant_us", quant_us},
                    {"us_with_quant", both_us},
                    {"cosine_vs_bf16", dot / std::sqrt(std::max(na * nr, 1e-300))},
                    {"max_err_vs_bf16", max_err / std::max(max_ref, 1e-30)}});
      } catch (const tw::InvalidArgument& e) {
        row["skipped"] = e.what();
      }
      print_row(c, row);
      rows.push_back(std::move(row));
    }
    for (bf16* p : {q, k, v, o, o_ref}) TW_CUDA_CHECK(cudaFree(p));
  }
  // bf16 rows: the tail splits' gain over every item whole (bf16_whole), this run.
  for (json& r : rows) {
    if (r["dtype"] != "bf16" || !r.contains("us")) continue;
    for (const json& b : rows)
      if (b["dtype"] == "bf16_whole" && b.contains("us") && b["H"] == r["H"] && b["d"] == r["d"] && b["L"] == r["L"] &&
          b["causal"] == r["causal"] && b["batch"] == r["batch"])
        r["split_gain"] = b["us"].get<double>() / r["us"].get<double>();
  }
  // fp8 rows: the speedup over this project's bf16 kernel on the same case, this run.
  for (json& r : rows) {
    if (r["dtype"] != "fp8_e4m3" || !r.contains("us")) continue;
    for (const json& b : rows)
      if (b["dtype"] == "bf16" && b.contains("us") && b["H"] == r["H"] && b["d"] == r["d"] && b["L"] == r["L"] &&
          b["causal"] == r["causal"] && b["batch"] == r["batch"]) {
        r["speedup_vs_bf16"] = b["us"].get<double>() / r["us"].get<double>();
        r["speedup_vs_bf16_with_quant"] = b["us"].get<double>() / r["us_with_quant"].get<double>();
      }
  }
  const double peak = gemm_peak_tflops();
  // The read floor too (DESIGN.md: a machine under 4.6 TB/s is degraded): attention at these sizes is
  // compute-bound, its ratios are to the GEMM peak, but a slow machine should show in the file.
  const double floor_tbps = measure_floor(gpu).tbps();
  std::printf("%s: bf16 GEMM peak (cuBLASLt 8192^3) %.0f TFLOP/s, read floor %.3f TB/s\n", gpu.prop.name, peak,
              floor_tbps);
  for (json& r : rows)
    if (r.contains("tflops")) r["pct_gemm_peak"] = 100.0 * r["tflops"].get<double>() / peak;

  // Merge into the existing file: a matching case keeps its other fields (the peers' from
  // dit_attention_torch.py, whose speedup is recomputed against the new time), other cases stay.
  std::filesystem::create_directories(out_dir);
  const std::filesystem::path path = std::filesystem::path(out_dir) / "dit_attention.json";
  json doc = read_result_doc(path);
  doc["gpu"] = gpu.prop.name;
  doc["date"] = utc_now();
  doc["gemm_peak_tflops"] = peak;
  doc["floor_read_tbps"] = floor_tbps;
  doc["method"] =
      "tw::PrefillAttention, bf16 q/k/v uniform noise (unit variance), packed THD layout, Hkv = H; one "
      "launch per CUDA-graph replay, median of " +
      std::to_string(reps) + " per-replay event pairs after " + std::to_string(int(kSteadyMs)) +
      " ms of warm-up replays (the steady state of the GPU's clocks at "
      "its power limit), one input set (compute-bound: not rotated); tflops = flops / us (4 L^2 d H, exact masked "
      "count when causal); gemm_peak_tflops: cuBLASLt bf16 8192^3, fp32 accumulate, same run. dtype fp8_e4m3: "
      "Gaussian q/k/v with channels 3, 40, 77, 101 4x larger; us = the e4m3 attention on inputs quantized before, "
      "quant_us = the quantization, us_with_quant = both (the op's run()); cosine_vs_bf16 and max_err_vs_bf16 "
      "(max |fp8 - bf16| / max |bf16|) against the bf16 kernel's output on the same inputs";
  for (json& r : rows) {
    json* hit = nullptr;
    for (json& c : doc["cases"])
      if (same_case(c, r)) hit = &c;
    if (!hit) {
      doc["cases"].push_back(json::object());
      hit = &doc["cases"].back();
    }
    for (const char* stale : {"us", "tflops", "pct_gemm_peak", "flops", "speedup", "skipped", "quant_us", "us_with_quant",
                              "split_gain", "us_rounds",
                              "cosine_vs_bf16", "max_err_vs_bf16", "speedup_vs_bf16", "speedup_vs_bf16_with_quant"})
      hit->erase(stale);
    hit->update(r);
    json& c = *hit;
    const json best = c.value("peers", json()).is_object() && c.value("peer_best", json()).is_string()
                          ? c["peers"].value(c["peer_best"].get<std::string>(), json())
                          : json();
    if (c.contains("us") && best.is_object() && best.value("us", json()).is_number())
      c["speedup"] = best["us"].get<double>() / c["us"].get<double>();
    r = c;  // the table shows the merged row
  }
  std::ofstream(path) << doc.dump(2) << "\n";

  std::printf("\n%s, %s: GEMM peak %.0f TFLOP/s -> %s\n", gpu.prop.name, doc["date"].get<std::string>().c_str(), peak,
              path.string().c_str());
  std::printf("%3s %4s %6s %-6s %2s %-9s %10s %7s %6s | %-16s %7s %7s\n", "H", "d", "L", "mask", "b", "dtype", "us",
              "TFLOP/s", "%peak", "peer_best", "TFLOP/s", "speedup");
  for (const json& r : rows) {
    std::printf("%3d %4d %6d %-6s %2d %-9s ", r["H"].get<int>(), r["d"].get<int>(), r["L"].get<int>(),
                r["causal"].get<bool>() ? "causal" : "full", r["batch"].get<int>(),
                r["dtype"] == "fp8_e4m3" ? "fp8" : r["dtype"].get<std::string>().c_str());
    if (r.contains("us"))
      std::printf("%10.1f %7.0f %5.1f%% | ", r["us"].get<double>(), r["tflops"].get<double>(),
                  r["pct_gemm_peak"].get<double>());
    else
      std::printf("%10s %7s %6s | ", "skipped", "-", "-");
    if (r.contains("peer_best_tflops") && r["peer_best_tflops"].is_number())
      std::printf("%-16s %7.0f ", r.value("peer_best", std::string("?")).c_str(), r["peer_best_tflops"].get<double>());
    else
      std::printf("%-16s %7s ", "-", "-");
    if (r.contains("speedup"))
      std::printf("%6.2fx", r["speedup"].get<double>());
    else
      std::printf("%7s", "-");
    if (r.contains("split_gain"))
      std::printf("  split tail %.3fx (planned %.3fx, %d of %d items split)", r["split_gain"].get<double>(),
                  r["planned_gain"].get<double>(), r["split_items"].get<int>(), r["work_items"].get<int>());
    if (r.contains("speedup_vs_bf16"))
      std::printf("  %.2fx bf16 (%.2fx with quant %.1f us), cos %.5f, max err %.3f", r["speedup_vs_bf16"].get<double>(),
                  r["speedup_vs_bf16_with_quant"].get<double>(), r["quant_us"].get<double>(),
                  r["cosine_vs_bf16"].get<double>(), r["max_err_vs_bf16"].get<double>());
    std::printf("\n");
  }
  return 0;
}
