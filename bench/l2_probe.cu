// Calibration probe for the partitioned L2 model (include/tileweave/model/l2_model.hpp): measures on
// the GPU what the model assumes and writes a preset JSON that `tileweave --gpu FILE.json` reads.
//   l2_probe [--out bench/results/<gpu>/l2_preset.json] [--quick]
//
// 1. Capacity and far copies. One CTA per SM re-reads a working set of W bytes, pass after pass,
//    each CTA its own slice. "fixed": an SM reads the same slice every pass, so a line is only ever
//    requested from one side; "rotate": slices move to other SMs every pass, so every line is
//    requested from both sides. The hit rate of a pass (from its time, between the all-hit and the
//    all-miss rate) falls to 1/2 at the working set that fills the cache. The model predicts the
//    fall at W = C (no far copies), or W = 2C/3 (fixed) and W = C/2 (rotate) with far copies
//    (docs/model.md works the footprints out). The ratio of the two decides far_copies.
// 2. Associativity. The shape of the fall: the model's survival P(Poisson(ways x) <= ways - 1)
//    against the measured hit rates, ways fitted by least squares (0 = a sharp edge).
// 3. Drift. Every CTA streams its own region in 256 KiB chunks and times each one (SM clock): the
//    spread of a chunk's time within an SM gives step_jitter, the spread of the SMs' mean times gives
//    sm_skew (a uniform +-j has standard deviation j / sqrt(3)).
// 4. One SM's streaming rate: 16 CTAs on 16 SMs, each reading its own 64 MiB.
//
// The time-based hit rate needs no profiler; under ncu (`ncu --metrics lts__t_sector_hit_rate.pct
// l2_probe --quick`) the same passes can be checked against the L2's own counters.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tileweave/model/l2_model.hpp"

namespace {

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "l2_probe: %s failed: %s\n", #x, cudaGetErrorString(e_));             \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

constexpr int kThreads = 1024;
constexpr int kPinSmem = 120 * 1024;  // more than half an SM's shared memory: one CTA per SM

__device__ unsigned sm_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// Records which SM each CTA of a one-CTA-per-SM launch landed on.
__global__ void where(unsigned* smid_of_block) {
  if (threadIdx.x == 0) smid_of_block[blockIdx.x] = sm_id();
}

// One pass over the working set: the CTA on SM s reads slice (slot_of_sm[s] + shift) % slices,
// 16 B per load through L2 only (ld.global.cg: L1 would hide re-reads).
// (Launched with kPinSmem of dynamic shared memory that it never touches: it only keeps a second
// CTA off the SM.)
__global__ void pass(const int4* buf, size_t slice_int4, const int* slot_of_sm, int slices, int shift, int* sink) {
  const int slice = (slot_of_sm[sm_id()] + shift) % slices;
  const int4* p = buf + slice * slice_int4;
  int acc = 0;
  for (size_t i = threadIdx.x; i < slice_int4; i += 4 * kThreads) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = i + u * kThreads < slice_int4 ? __ldcg(p + i + u * kThreads) : make_int4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x7fffffff) *sink = acc;  // (almost) never true; keeps the loads
}

// Every CTA streams its own region in chunks and records the SM clock after each chunk.
__global__ void drift(const int4* buf, size_t chunk_int4, int chunks, long long* stamps, int* sink) {
  const int4* p = buf + size_t(blockIdx.x) * chunk_int4 * chunks;
  int acc = 0;
  if (threadIdx.x == 0) stamps[blockIdx.x * (chunks + 1)] = clock64();
  for (int c = 0; c < chunks; ++c) {
    for (size_t i = threadIdx.x; i < chunk_int4; i += kThreads) {
      const int4 v = __ldcg(p + c * chunk_int4 + i);
      acc ^= v.x ^ v.w;
    }
    __syncthreads();
    if (threadIdx.x == 0) stamps[blockIdx.x * (chunks + 1) + c + 1] = clock64();
  }
  if (acc == 0x7fffffff) *sink = acc;
}

struct Point {
  double w_bytes, hit_fixed, hit_rotate;
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}
double stddev(const std::vector<double>& v) {
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return v.size() > 1 ? std::sqrt(s / (v.size() - 1)) : 0;
}

// The working set where the hit rate falls through 1/2 (linear between the points around it).
double half_point(const std::vector<Point>& pts, bool rotate) {
  for (size_t i = 1; i < pts.size(); ++i) {
    const double a = rotate ? pts[i - 1].hit_rotate : pts[i - 1].hit_fixed, b = rotate ? pts[i].hit_rotate : pts[i].hit_fixed;
    if (a >= 0.5 && b < 0.5) return pts[i - 1].w_bytes + (a - 0.5) / (a - b) * (pts[i].w_bytes - pts[i - 1].w_bytes);
  }
  return pts.back().w_bytes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else {
      std::fprintf(stderr, "usage: l2_probe [--out FILE.json] [--quick]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const double l2 = prop.l2CacheSize;
  std::string base = "h200";
  for (const char* n : {"H100", "A100"})
    if (std::strstr(prop.name, n)) base = n[0] == 'H' ? "h100" : "a100";
  if (out.empty()) out = "bench/results/" + base + "/l2_preset.json";
  std::printf("l2_probe on %s: %d SMs, L2 %.1f MiB\n", prop.name, sms, l2 / 1048576);

  for (auto k : {(const void*)where, (const void*)pass, (const void*)drift})
    CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kPinSmem));
  // Which SM each CTA lands on; a CTA then finds its slot through the SM it runs on, so "fixed"
  // really keeps a slice on one SM across launches.
  unsigned* d_smid;
  int *d_slot, *sink;
  CHECK(cudaMalloc(&d_smid, sms * sizeof(unsigned)));
  CHECK(cudaMalloc(&sink, sizeof(int)));
  where<<<sms, 32, kPinSmem>>>(d_smid);
  std::vector<unsigned> smid(sms);
  CHECK(cudaMemcpy(smid.data(), d_smid, sms * sizeof(unsigned), cudaMemcpyDeviceToHost));
  const unsigned max_id = *std::max_element(smid.begin(), smid.end());
  std::vector<int> slot(max_id + 1, 0);
  for (int b = 0; b < sms; ++b) slot[smid[b]] = b;
  CHECK(cudaMalloc(&d_slot, slot.size() * sizeof(int)));
  CHECK(cudaMemcpy(d_slot, slot.data(), slot.size() * sizeof(int), cudaMemcpyHostToDevice));

  const size_t max_bytes = size_t(4 * l2);
  int4* buf;
  CHECK(cudaMalloc(&buf, max_bytes + (size_t(1) << 20)));
  CHECK(cudaMemset(buf, 1, max_bytes));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const int passes = quick ? 4 : 10;
  // Seconds per byte of one timed pass (after one warm pass), fixed or rotating slices.
  auto seconds_per_byte = [&](double w, bool rotate) {
    const size_t slice = size_t(w / sms / 16);
    pass<<<sms, kThreads, kPinSmem>>>(buf, slice, d_slot, sms, 0, sink);
    CHECK(cudaEventRecord(e0));
    for (int p = 1; p <= passes; ++p) pass<<<sms, kThreads, kPinSmem>>>(buf, slice, d_slot, sms, rotate ? p * 37 : 0, sink);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e-3 / passes / (double(slice) * 16 * sms);
  };

  // 1. The sweep, W from L2/8 to 4 L2; the ends give the all-hit and all-miss costs per byte.
  std::vector<double> ws;
  for (double f = 0.125; f <= 4.0 + 1e-9; f += (f < 1.5 ? (quick ? 0.125 : 0.0625) : 0.5)) ws.push_back(f * l2);
  std::vector<double> tf, tr;
  for (double w : ws) tf.push_back(seconds_per_byte(w, false)), tr.push_back(seconds_per_byte(w, true));
  const double hit_cost = std::min(tf.front(), tr.front()), miss_cost = std::max(tf.back(), tr.back());
  std::vector<Point> pts;
  auto hit_of = [&](double t) { return std::clamp((miss_cost - t) / (miss_cost - hit_cost), 0.0, 1.0); };
  for (size_t i = 0; i < ws.size(); ++i) {
    pts.push_back({ws[i], hit_of(tf[i]), hit_of(tr[i])});
    std::printf("  W %6.1f MiB  hit fixed %5.1f%%  rotate %5.1f%%\n", ws[i] / 1048576, 100 * pts.back().hit_fixed,
                100 * pts.back().hit_rotate);
  }
  const double knee_fixed = half_point(pts, false), knee_rotate = half_point(pts, true);
  // Far copies: rotate / fixed is 3/4 with copies, 1 without; decide at the middle.
  const bool far_copies = knee_rotate / knee_fixed < 0.875;
  // 2. ways: the model's footprint per partition over its capacity is x = f W / (L2 / 2) with f = 1
  // (rotate) or 3/4 (fixed) with far copies, and x = W / L2 without.
  int best_ways = 0;
  double best_err = 1e300;
  for (int ways : {0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64}) {
    double err = 0;
    for (const Point& p : pts) {
      const double xf = far_copies ? 0.75 * p.w_bytes / (l2 / 2) : p.w_bytes / l2;
      const double xr = far_copies ? p.w_bytes / (l2 / 2) : p.w_bytes / l2;
      err += std::pow(tw::l2_survival(xf, ways) - p.hit_fixed, 2) + std::pow(tw::l2_survival(xr, ways) - p.hit_rotate, 2);
    }
    if (err < best_err) best_err = err, best_ways = ways;
  }
  std::printf("  half-hit working set: fixed %.1f MiB, rotate %.1f MiB -> far copies %s; ways %d (rms %.3f)\n",
              knee_fixed / 1048576, knee_rotate / 1048576, far_copies ? "yes" : "no", best_ways,
              std::sqrt(best_err / (2 * pts.size())));

  // 3. Drift: 64 chunks of 256 KiB per SM (all SMs streaming, as in a memory-bound op).
  const int chunks = 64;
  const size_t chunk_int4 = (size_t(256) << 10) / 16;
  long long* d_stamps;
  CHECK(cudaMalloc(&d_stamps, size_t(sms) * (chunks + 1) * sizeof(long long)));
  int4* region;
  CHECK(cudaMalloc(&region, size_t(sms) * chunks * chunk_int4 * 16));
  CHECK(cudaMemset(region, 2, size_t(sms) * chunks * chunk_int4 * 16));
  drift<<<sms, kThreads, kPinSmem>>>(region, chunk_int4, chunks, d_stamps, sink);
  CHECK(cudaMemset(buf, 3, max_bytes));  // evict the region: the timed run streams from DRAM
  drift<<<sms, kThreads, kPinSmem>>>(region, chunk_int4, chunks, d_stamps, sink);
  std::vector<long long> stamps(size_t(sms) * (chunks + 1));
  CHECK(cudaMemcpy(stamps.data(), d_stamps, stamps.size() * sizeof(long long), cudaMemcpyDeviceToHost));
  std::vector<double> within, sm_means;
  for (int b = 0; b < sms; ++b) {
    std::vector<double> d;
    for (int c = 1; c < chunks; ++c)  // the first chunk includes the launch ramp
      d.push_back(double(stamps[b * (chunks + 1) + c + 1] - stamps[b * (chunks + 1) + c]));
    const double m = mean(d);
    sm_means.push_back(m);
    within.push_back(stddev(d) / m);
  }
  const double jitter = std::min(0.9, std::sqrt(3.0) * mean(within));
  const double skew = std::min(0.9, std::sqrt(3.0) * stddev(sm_means) / mean(sm_means));
  std::printf("  drift: chunk time spread within an SM %.1f%% -> step_jitter %.3f; between SMs %.1f%% -> sm_skew %.3f\n",
              100 * mean(within), jitter, 100 * stddev(sm_means) / mean(sm_means), skew);

  // 4. One SM's streaming rate: 16 SMs, each its own 64 MiB, cold.
  const int few = std::min(16, sms);
  const size_t per = size_t(64) << 20;
  CHECK(cudaMemset(buf, 4, max_bytes));
  CHECK(cudaEventRecord(e0));
  drift<<<few, kThreads, kPinSmem>>>(region, per / 16 / 64, 64, d_stamps, sink);
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const double sm_gbps = double(per) / (ms * 1e-3) / 1e9;
  std::printf("  one SM streams %.1f GB/s (%d SMs, 64 MiB each)\n", sm_gbps, few);

  std::string json = "{\n  \"base\": \"" + base + "\",\n  \"name\": \"" + base + "-probed\",\n";
  char line[512];
  std::snprintf(line, sizeof line, "  \"l2_bytes\": %.0f,\n  \"sms\": %d,\n  \"sm_stream_gbps\": %.1f,\n", l2, sms, sm_gbps);
  json += line;
  std::snprintf(line, sizeof line,
                "  \"l2\": {\"partitions\": 2, \"far_copies\": %s, \"line_bytes\": 128, \"ways\": %d, \"step_jitter\": %.3f, "
                "\"sm_skew\": %.3f},\n",
                far_copies ? "true" : "false", best_ways, jitter, skew);
  json += line;
  std::snprintf(line, sizeof line, "  \"probe\": {\"gpu\": \"%s\", \"half_hit_fixed_bytes\": %.0f, \"half_hit_rotate_bytes\": %.0f, "
                "\"passes\": %d, \"sweep\": [", prop.name, knee_fixed, knee_rotate, passes);
  json += line;
  for (size_t i = 0; i < pts.size(); ++i) {
    std::snprintf(line, sizeof line, "%s\n    {\"w_bytes\": %.0f, \"hit_fixed\": %.4f, \"hit_rotate\": %.4f}", i ? "," : "",
                  pts[i].w_bytes, pts[i].hit_fixed, pts[i].hit_rotate);
    json += line;
  }
  json += "]}\n}\n";
  std::filesystem::create_directories(std::filesystem::path(out).parent_path());
  std::ofstream(out) << json;
  std::printf("wrote %s (use it as: tileweave sim --gpu %s --l2-model partitioned ...)\n", out.c_str(), out.c_str());
  return 0;
}
