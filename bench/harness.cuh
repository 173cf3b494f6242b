// Shared benchmark harness: the streaming-read floor measured in the same run, graph-replay timing
// with rotated input sets (so L2 holds none of what is timed), and the JSON result file.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tileweave/kernels/stream_read.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw::bench {

struct Gpu {
  cudaDeviceProp prop{};
  std::string slug;  // "h200", "h100", ... : the folder under bench/results/
};

inline Gpu current_gpu() {
  Gpu g;
  int dev = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaGetDeviceProperties(&g.prop, dev));
  std::string name = g.prop.name;
  for (const char* s : {"H200", "H100", "A100", "L40S", "A40", "B200"})
    if (name.find(s) != std::string::npos) {
      g.slug = s;
      break;
    }
  if (g.slug.empty()) g.slug = "other";
  std::transform(g.slug.begin(), g.slug.end(), g.slug.begin(), ::tolower);
  return g;
}

// Benchmarks of Hopper's bulk copies: false (with a message naming the bench and the GPU) below sm_90.
inline bool has_bulk_copies(const Gpu& gpu, const char* bench) {
  if (gpu.prop.major >= 9) return true;
  std::printf("%s: needs sm_90 (bulk copies); skipped on %s\n", bench, gpu.prop.name);
  return false;
}

namespace detail {
// Median device time (µs) of one replay of execs[i % size], each replay timed alone (an event pair
// around it, the queue kept full): the median is robust to the odd slow replay, and no replay
// overlaps the next within a stream.
inline double median_replay_us(const std::vector<cudaGraphExec_t>& execs, cudaStream_t st, int warmup, int reps) {
  const size_t n = execs.size();
  for (int i = 0; i < warmup; ++i) TW_CUDA_CHECK(cudaGraphLaunch(execs[i % n], st));
  std::vector<cudaEvent_t> ev(reps + 1);
  for (auto& e : ev) TW_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    TW_CUDA_CHECK(cudaEventRecord(ev[i], st));
    TW_CUDA_CHECK(cudaGraphLaunch(execs[(warmup + i) % n], st));
  }
  TW_CUDA_CHECK(cudaEventRecord(ev[reps], st));
  TW_CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    float ms;
    TW_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
    t[i] = ms * 1e3;
  }
  for (auto& e : ev) TW_CUDA_CHECK(cudaEventDestroy(e));
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}
// Captures make(s, st) for s in sets (in order) into one graph.
inline cudaGraphExec_t capture(const std::function<void(int, cudaStream_t)>& make, const std::vector<int>& sets,
                               cudaStream_t st) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  TW_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int s : sets) make(s, st);
  TW_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  TW_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  TW_CUDA_CHECK(cudaGraphDestroy(g));
  return e;
}
}  // namespace detail

// One launch per replay: the median device time (µs) of `reps` replays, after `warmup`. `make(i,
// stream)` enqueues the work for input set i (0 <= i < sets); each set is captured into its own
// CUDA graph, and the replays cycle through the sets so that consecutive replays read different
// buffers. Each time includes starting the graph (~3 us on the H200, bench_attention's empty
// launch), which a kernel inside a decode step's graph does not pay.
inline double time_us(const std::function<void(int, cudaStream_t)>& make, int sets, int warmup = 10, int reps = 100) {
  cudaStream_t st;
  TW_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<cudaGraphExec_t> execs;
  for (int s = 0; s < sets; ++s) execs.push_back(detail::capture(make, {s}, st));
  const double us = detail::median_replay_us(execs, st, warmup, reps);
  for (auto& x : execs) TW_CUDA_CHECK(cudaGraphExecDestroy(x));
  TW_CUDA_CHECK(cudaStreamDestroy(st));
  return us;
}

// Back to back, as inside a decode step: one graph holds `launches` launches (the sets in turn,
// at least `min_launches`), and the time per launch is the graph's median replay time divided by
// the launches. A launch still pays its own start and drain, but the graph's start is shared.
// Consecutive launches read different sets, so L2 still holds none of a launch's inputs (the sets
// total >= 1 GB, or one set does).
// SeqTimer holds that graph, so that several forms of one op can be timed in interleaved rounds
// (InterleavedTimes below).
class SeqTimer {
 public:
  SeqTimer(const std::function<void(int, cudaStream_t)>& make, int sets, int min_launches = 8) {
    TW_CUDA_CHECK(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    std::vector<int> order;
    while (int(order.size()) < std::max(sets, min_launches))
      for (int s = 0; s < sets; ++s) order.push_back(s);
    launches_ = int(order.size());
    exec_ = detail::capture(make, order, st_);
  }
  SeqTimer(const SeqTimer&) = delete;
  SeqTimer& operator=(const SeqTimer&) = delete;
  ~SeqTimer() {
    cudaGraphExecDestroy(exec_);
    cudaStreamDestroy(st_);
  }
  // Median time per launch (µs) of `reps` replays after `warmup`.
  double us(int warmup, int reps) const { return detail::median_replay_us({exec_}, st_, warmup, reps) / launches_; }

 private:
  cudaStream_t st_{};
  cudaGraphExec_t exec_{};
  int launches_ = 0;
};

inline double time_us_seq(const std::function<void(int, cudaStream_t)>& make, int sets, int warmup = 2, int reps = 15,
                          int min_launches = 8) {
  return SeqTimer(make, sets, min_launches).us(warmup, reps);
}

// Forms of one op timed in rounds, each round every form once (its own warm-up, then `reps`
// replays), the first form of round r being form r % n; a form's time is the median of its rounds.
// Timed one after another instead, the form that follows the peer read up to 16% slower than the
// same configuration timed later, on compute-bound shapes (M >= 512; H200, bench_sweep seed 16,
// 2026-11-27): position, not configuration. Rounds spread that over every form.
// The median of `v` (the upper one of an even count); v not empty.
inline double median_of(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

inline std::vector<double> interleaved_us(const std::vector<const SeqTimer*>& forms, int rounds = 3, int warmup = 2,
                                          int reps = 7) {
  const size_t n = forms.size();
  std::vector<std::vector<double>> t(n);
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < n; ++i) {
      const size_t f = (r + i) % n;
      if (forms[f]) t[f].push_back(forms[f]->us(warmup, reps));
    }
  std::vector<double> out(n, 0.0);
  for (size_t f = 0; f < n; ++f)
    if (!t[f].empty()) out[f] = median_of(t[f]);
  return out;
}

struct Floor {
  double bulk_tbps = 0, vec_tbps = 0;
  double tbps() const { return std::max(bulk_tbps, vec_tbps); }
};

// The floor kernel (bulk copies) reading `bytes` at `src` (rounded down to whole chunks) with
// `per_sm` blocks per SM; its shared memory attribute is set by measure_floor, which runs first.
inline void stream_read(const Gpu& gpu, const void* src, uint64_t bytes, cudaStream_t st, int per_sm = 1) {
  kernels::stream_read_bulk<<<gpu.prop.multiProcessorCount * per_sm, 32, kernels::kStreamStages * kernels::kStreamChunk,
                              st>>>(static_cast<const char*>(src), bytes / kernels::kStreamChunk);
}

// Streams an 8 GiB buffer with both floor kernels (bulk copies at 1 and 2 blocks per SM, and
// 16-byte loads); the best is the floor. Runs after a warm-up, so clocks have ramped up.
inline Floor measure_floor(const Gpu& gpu, size_t bytes = size_t(8) << 30) {
  bytes = bytes / kernels::kStreamChunk * kernels::kStreamChunk;
  char* buf;
  int* sink;
  TW_CUDA_CHECK(cudaMalloc(&buf, bytes));
  TW_CUDA_CHECK(cudaMalloc(&sink, sizeof(int)));
  TW_CUDA_CHECK(cudaMemset(buf, 0x5a, bytes));
  const int smem = kernels::kStreamStages * kernels::kStreamChunk;
  TW_CUDA_CHECK(cudaFuncSetAttribute(kernels::stream_read_bulk, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  Floor f;
  const int sms = gpu.prop.multiProcessorCount;
  if (gpu.prop.major >= 9)
    for (int per_sm : {1, 2}) {
      const double us = time_us([&](int, cudaStream_t st) { stream_read(gpu, buf, bytes, st, per_sm); }, 1, 5, 20);
      f.bulk_tbps = std::max(f.bulk_tbps, bytes / us * 1e-6);
    }
  const double us = time_us([&](int, cudaStream_t st) {
    kernels::stream_read_vec<<<sms * 2, 512, 0, st>>>(reinterpret_cast<const int4*>(buf), bytes / 16, sink);
  }, 1, 5, 20);
  f.vec_tbps = bytes / us * 1e-6;
  TW_CUDA_CHECK(cudaFree(buf));
  TW_CUDA_CHECK(cudaFree(sink));
  return f;
}

// Unit-variance uniform noise (times `scale`) from a hash of the index: never zeros (METHOD.md),
// cheap to make on the GPU for gigabytes of K/V.
static __global__ void fill_noise_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16((2.f * u - 1.f) * 1.7320508f * scale);
  }
}
inline void fill_noise_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float scale = 1.f) {
  fill_noise_bf16_kernel<<<1024, 256>>>(p, n, seed, scale);
  TW_CUDA_CHECK_LAUNCH();
}

// Gaussian noise (Box-Muller on the index's hash) times `scale`, with four channels of each row of
// `row` elements (3, 40, 77, 101) `outlier` times larger: activations with a few large channels.
static __global__ void fill_outliers_bf16_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale, int row,
                                                 float outlier) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u1 = (float(z >> 40) + 1.f) * (1.0f / 16777217.0f), u2 = float((z >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    const int c = int(i % size_t(row));
    const bool big = c == 3 || c == 40 || c == 77 || c == 101;
    p[i] = __float2bfloat16(sqrtf(-2.f * logf(u1)) * cospif(2.f * u2) * scale * (big ? outlier : 1.f));
  }
}
inline void fill_outliers_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, int row, float outlier, float scale = 1.f) {
  fill_outliers_bf16_kernel<<<1024, 256>>>(p, n, seed, scale, row, outlier);
  TW_CUDA_CHECK_LAUNCH();
}

// n elements of T on the device (at least one), uninitialised.
template <class T>
T* dev_alloc(int64_t n) {
  T* p = nullptr;
  TW_CUDA_CHECK(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
  return p;
}

// An FFN's weights in sets (gate|up, or the one first matrix, [n1, d]; down [d, f]), enough of them
// that L2 holds none of a launch's weights when launches take the sets in turn; noise scaled by
// 1 / sqrt(fan-in).
struct FfnWeightSets {
  int sets = 0;
  std::vector<__nv_bfloat16*> gate_up, down;
  FfnWeightSets(int64_t d, int64_t f, bool gated, size_t l2_bytes) {
    const int64_t n1 = (gated ? 2 : 1) * f;
    sets = std::max(2, int(std::ceil(3.0 * double(l2_bytes) / (double(n1 * d + d * f) * 2))) + 1);
    for (int s = 0; s < sets; ++s) {
      gate_up.push_back(nullptr);
      down.push_back(nullptr);
      TW_CUDA_CHECK(cudaMalloc(&gate_up.back(), size_t(n1 * d) * 2));
      TW_CUDA_CHECK(cudaMalloc(&down.back(), size_t(d * f) * 2));
      fill_noise_bf16(gate_up.back(), size_t(n1 * d), 17 + s, 1.f / std::sqrt(float(d)));
      fill_noise_bf16(down.back(), size_t(d * f), 1017 + s, 1.f / std::sqrt(float(f)));
    }
  }
  ~FfnWeightSets() {
    for (int s = 0; s < sets; ++s) cudaFree(gate_up[s]), cudaFree(down[s]);
  }
  FfnWeightSets(const FfnWeightSets&) = delete;
};

// ||a - b|| / ||b|| over two bf16 device arrays; infinite if a holds a non-finite value.
inline double rel_diff_bf16(const __nv_bfloat16* a_dev, const __nv_bfloat16* b_dev, size_t n) {
  std::vector<__nv_bfloat16> a(n), b(n);
  TW_CUDA_CHECK(cudaMemcpy(a.data(), a_dev, n * sizeof(a[0]), cudaMemcpyDeviceToHost));
  TW_CUDA_CHECK(cudaMemcpy(b.data(), b_dev, n * sizeof(b[0]), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    if (!std::isfinite(x)) return INFINITY;
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// "a,b,,c" -> {"a", "b", "c"} (command-line lists).
inline std::vector<std::string> split_list(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, sep);)
    if (!t.empty()) out.push_back(t);
  return out;
}

// "1,16,64" -> {1, 16, 64}; a value that is not a whole number >= 1 is an error naming it.
inline std::vector<int> parse_counts(const std::string& s, const char* what) {
  std::vector<int> out;
  for (const std::string& t : split_list(s)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != t.size() || v < 1) throw std::invalid_argument(std::string(what) + ": '" + t + "' is not a whole number >= 1");
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument(std::string(what) + ": empty list");
  return out;
}

// A result file to merge this run's cases into: its JSON object, with a "cases" array (an empty one
// where the file is missing or holds no object).
inline nlohmann::ordered_json read_result_doc(const std::filesystem::path& path) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (std::ifstream in(path); in) {
    doc = nlohmann::ordered_json::parse(in, nullptr, false);
    if (!doc.is_object()) doc = nlohmann::ordered_json::object();
  }
  if (!doc.contains("cases") || !doc["cases"].is_array()) doc["cases"] = nlohmann::ordered_json::array();
  return doc;
}

inline std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// One result file per benchmark family: bench/results/<gpu>/<name>.json (or under $TW_RESULTS_DIR).
struct ResultFile {
  nlohmann::json doc;
  std::string name;
  ResultFile(std::string n, const Gpu& gpu, const Floor& floor) : name(std::move(n)) {
    doc["benchmark"] = name;
    doc["gpu"] = gpu.prop.name;
    doc["sm_count"] = gpu.prop.multiProcessorCount;
    doc["l2_bytes"] = gpu.prop.l2CacheSize;
    doc["date_utc"] = utc_now();
    doc["floor_read_tbps"] = floor.tbps();
    doc["floor_bulk_tbps"] = floor.bulk_tbps;
    doc["floor_vec_tbps"] = floor.vec_tbps;
    doc["cases"] = nlohmann::json::array();
  }
  void add(nlohmann::json c) { doc["cases"].push_back(std::move(c)); }
  std::string write(const Gpu& gpu) const {
    const char* dir = std::getenv("TW_RESULTS_DIR");
    std::filesystem::path p = std::filesystem::path(dir ? dir : "bench/results") / gpu.slug;
    std::filesystem::create_directories(p);
    p /= name + ".json";
    std::ofstream(p) << doc.dump(2) << "\n";
    return p.string();
  }
};

}  // namespace tw::bench
