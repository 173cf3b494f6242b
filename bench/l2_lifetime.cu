// How long an evict-first line lives in L2 beside other lines (issue 17; docs/model.md, "How long a
// weight line lives"): the L2 model's room for evict-first weights (L2Params::evict_first = Room)
// says the other lines never leave and a weight line survives only while fewer than the ways the
// others leave of its set have been allocated since its last use. Two GEMMs of the validation grid
// want different lifetimes from it; the difference the model lacks may be whether the other lines
// are still being read. This probe asks the L2 directly.
//
// A case: the L2 is emptied (a 2 C stream, then `discard.global.L2` over it), `A` bytes are read with
// `a_policy` (the kernels' activations are evict-last; evict-normal beside it), W (1 MiB) is read
// evict-first, then X bytes of other evict-first lines (the allocations between two readers of a
// weight panel), in quarters; where A is `live`, it is read again after each quarter. Then W is read
// again and then A, each kernel alone under ncu: its DRAM bytes say how much of it had survived. All
// reads are 16 KiB bulk copies with the kernels' L2 cache hints, one CTA per SM.
//
//   scripts/l2_lifetime.sh    ncu around `l2_lifetime --run FLOOR.json` (the cases, and the read floor
//     measured first, outside the profiled range), then `l2_lifetime --report NCU.csv FLOOR.json`: the
//     measured survival of W and A beside the model's (this GPU's preset: room, ways, fringe), written to
//     $TW_RESULTS_DIR/<gpu>/l2_lifetime.json
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.cuh"
#include "tileweave/kernels/sm90/arch.cuh"
#include "tileweave/kernels/sm90/tma.cuh"
#include "tileweave/model/l2_model.hpp"
#include "tileweave/model/presets.hpp"

namespace {

constexpr int64_t kMiB = 1 << 20;

enum Policy : int { kEvictFirst, kEvictNormal, kEvictLast };
const char* const kPolicyNames[] = {"evict_first", "evict_normal", "evict_last"};

// One CTA per SM: thread 0 streams 16 KiB chunks blockIdx.x, blockIdx.x + grid, ... of [src, src + bytes)
// into a ring of shared-memory slots with the policy's L2 hint.
__global__ void stream(const char* src, int64_t bytes, int policy) {
#if TW_SM90_ENABLED
  using namespace tw::sm90;
  namespace ptx = cuda::ptx;
  constexpr uint32_t kChunk = 16u << 10;
  constexpr int kSlots = 2;  // 32 KiB of static shared memory
  __shared__ alignas(128) char slot[kSlots][kChunk];
  __shared__ uint64_t bar[kSlots];
  if (threadIdx.x != 0) return;
  for (int s = 0; s < kSlots; ++s) mbar_init(&bar[s], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  const uint64_t hint = policy == kEvictFirst ? l2_evict_first() : policy == kEvictLast ? l2_evict_last() : l2_evict_normal();
  const int64_t chunks = bytes / kChunk;
  int n = 0;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x, ++n) {
    const int s = n % kSlots;
    if (n >= kSlots) mbar_wait(&bar[s], uint32_t((n / kSlots - 1) & 1), "slot");
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bar[s], uint32_t{kChunk});
    bulk_load(slot[s], src + c * kChunk, kChunk, &bar[s], hint);
  }
  for (int k = n - kSlots < 0 ? 0 : n - kSlots; k < n; ++k) mbar_wait(&bar[k % kSlots], uint32_t((k / kSlots) & 1), "drain");
#endif
}
// Invalidates every L2 line of [p, p + bytes) (its contents become undefined: only the flush region).
__global__ void discard(char* p, int64_t bytes) {
  for (int64_t o = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 128; o < bytes; o += int64_t(gridDim.x) * blockDim.x * 128)
    asm volatile("discard.global.L2 [%0], 128;\n" ::"l"(p + o) : "memory");
}

struct Case {
  int64_t a = 0, x = 0;
  int a_policy = kEvictLast;
  bool live = false;
};

std::vector<Case> cases() {
  std::vector<Case> v;
  for (int64_t x_mib : {0, 1, 2, 4, 8, 16, 32}) {
    v.push_back({0, x_mib * kMiB, kEvictLast, false});
    for (int64_t a_mib : {12, 24, 36})
      for (int pol : {kEvictLast, kEvictNormal})
        for (bool live : {false, true}) v.push_back({a_mib * kMiB, x_mib * kMiB, pol, live});
  }
  return v;
}

// ncu's CSV (--csv --print-units base): dram__bytes_read.sum of each profiled kernel, in launch order
// (one metric a kernel: one row each; the value is the row's last field).
std::vector<double> ncu_dram_reads(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw tw::InvalidArgument("l2_lifetime: cannot read " + path);
  std::vector<double> v;
  std::string line;
  while (std::getline(f, line)) {
    if (line.find("\"dram__bytes_read.sum\"") == std::string::npos) continue;
    const size_t e = line.rfind('"'), b = line.rfind('"', e - 1);
    std::string val = line.substr(b + 1, e - b - 1);
    val.erase(std::remove(val.begin(), val.end(), ','), val.end());
    v.push_back(std::stod(val));
  }
  return v;
}

int run(const std::string& floor_out) {
  using namespace tw::bench;
  const Gpu gpu = current_gpu();
  if (!has_bulk_copies(gpu, "l2_lifetime")) return 0;
  const Floor floor = measure_floor(gpu);
  std::ofstream(floor_out) << nlohmann::json{{"bulk_tbps", floor.bulk_tbps}, {"vec_tbps", floor.vec_tbps}}.dump() << "\n";
  const int sms = gpu.prop.multiProcessorCount;
  const int64_t cap = gpu.prop.l2CacheSize, flush = 2 * cap, w = kMiB;
  const std::vector<Case> cs = cases();
  int64_t a_max = 0, x_total = 0;
  for (const Case& c : cs) a_max = std::max(a_max, c.a), x_total += c.x;
  // Every case's W and X and A are new addresses, so nothing of them is in L2 from an earlier case.
  const int64_t bytes = flush + int64_t(cs.size()) * (w + a_max) + x_total;
  char* buf = dev_alloc<char>(bytes);
  TW_CUDA_CHECK(cudaMemset(buf, 1, bytes));
  char* fresh = buf + flush;
  auto read = [&](const char* p, int64_t n, int policy) { stream<<<sms, 32>>>(p, n, policy); };
  for (const Case& c : cs) {
    read(buf, flush, kEvictNormal);
    discard<<<sms, 256>>>(buf, flush);
    char* a = fresh;
    char* wp = a + a_max;
    char* x = wp + w;
    fresh = x + c.x;
    if (c.a) read(a, c.a, c.a_policy);
    read(wp, w, kEvictFirst);
    for (int q = 0; q < 4; ++q) {
      if (c.x) read(x + q * (c.x / 4), c.x / 4, kEvictFirst);
      if (c.live && c.a) read(a, c.a, c.a_policy);
    }
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    TW_CUDA_CHECK(cudaProfilerStart());
    read(wp, w, kEvictFirst);                        // profiled: W's re-read
    if (c.a) read(a, c.a, c.a_policy);               // profiled: A's re-read
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    TW_CUDA_CHECK(cudaProfilerStop());
  }
  TW_CUDA_CHECK(cudaGetLastError());
  TW_CUDA_CHECK(cudaFree(buf));
  std::printf("l2_lifetime: %zu cases run (profile under ncu: scripts/l2_lifetime.sh)\n", cs.size());
  return 0;
}

// The measured survival beside the room model's: in a partition (capacity C / 2) a stream of S bytes
// read once by one SM a line allocates 3/4 S (its home half, and a far copy of the other half for the
// reading SM's side), so W's lines see 3/4 X (and half of W's own) allocated since their read, with
// 3/4 A of other lines held.
int report(const std::string& csv, const std::string& floor_file) {
  using namespace tw::bench;
  const Gpu gpu = current_gpu();
  std::ifstream ff(floor_file);
  if (!ff) throw tw::InvalidArgument("l2_lifetime: cannot read " + floor_file + " (written by l2_lifetime --run)");
  const nlohmann::json fj = nlohmann::json::parse(ff);
  const Floor floor{fj.at("bulk_tbps").get<double>(), fj.at("vec_tbps").get<double>()};
  const std::vector<Case> cs = cases();
  const std::vector<double> r = ncu_dram_reads(csv);
  size_t want = 0;
  for (const Case& c : cs) want += c.a ? 2 : 1;
  if (r.size() != want)
    throw tw::InvalidArgument("l2_lifetime: " + csv + " holds " + std::to_string(r.size()) + " profiled kernels, expected " +
                              std::to_string(want));
  const tw::GpuPreset preset =
      tw::gpu_preset_for_device(gpu.prop.name, gpu.prop.multiProcessorCount, gpu.prop.l2CacheSize);
  const double part = double(preset.l2_bytes) / preset.l2.partitions;
  const tw::L2Params& l2 = preset.l2;
  ResultFile res("l2_lifetime", gpu, floor);
  res.doc["method"] = "ncu dram__bytes_read.sum of each re-read kernel alone (--cache-control none); survival = 1 - read / bytes";
  res.doc["model"] = {{"preset", preset.name}, {"ways", l2.ways}, {"set_fringe", l2.set_fringe}, {"partition_bytes", part}};
  size_t k = 0;
  std::printf("%8s %8s %-12s %5s | %8s %8s | %8s\n", "A MiB", "X MiB", "A policy", "live", "W surv", "model", "A surv");
  for (const Case& c : cs) {
    const double w = double(kMiB), w_read = r[k++], a_read = c.a ? r[k++] : 0.0;
    const double sw = 1 - w_read / w, sa = c.a ? 1 - a_read / double(c.a) : 1.0;
    const double model = tw::l2_room_survival(0.75 * double(c.x) + 0.375 * w, 0.75 * w, 0.75 * double(c.a), part, l2.ways,
                                              l2.set_fringe);
    std::printf("%8.0f %8.0f %-12s %5s | %8.3f %8.3f | %8.3f\n", double(c.a) / kMiB, double(c.x) / kMiB,
                kPolicyNames[c.a_policy], c.live ? "yes" : "no", sw, model, sa);
    res.add({{"a_bytes", c.a}, {"x_bytes", c.x}, {"w_bytes", kMiB}, {"a_policy", kPolicyNames[c.a_policy]},
                            {"a_live", c.live}, {"w_dram_read", w_read}, {"a_dram_read", a_read}, {"w_survival", sw},
                            {"a_survival", sa}, {"model_room_w_survival", model}});
  }
  std::printf("-> %s\n", res.write(gpu).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && !std::strcmp(argv[1], "--run")) return run(argv[2]);
    if (argc == 4 && !std::strcmp(argv[1], "--report")) return report(argv[2], argv[3]);
    std::fprintf(stderr, "usage: l2_lifetime --run FLOOR.json               (the cases; under ncu: scripts/l2_lifetime.sh)\n"
                         "       l2_lifetime --report NCU.csv FLOOR.json\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
