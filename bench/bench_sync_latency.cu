// What one synchronising instruction costs a thread while its SM's bulk copies are in flight. The
// decode step's latency chain (a tile's producers polled, a partial published, a pair counted) runs on
// SMs whose producer warp keeps weight copies in flight for the next tiles; if a fence waits for those,
// every hop of the chain pays for them. One CTA per SM: warp 0's lane 0 issues `copies` bulk copies of
// 64 KiB from DRAM (all SMs at once, as in the step), then one thread -- the issuer itself or a lane of
// warp 1 -- times one operation with the SM clock; then the copies are waited for and timed too.
// `quiet` SMs (the first quarter, in rows marked so) issue no copies while the others do: whether an SM
// off the stream sees its own operations at the unloaded cost, or the DRAM traffic of the others slows
// them too.
//   bench_sync_latency   JSON -> $TW_RESULTS_DIR/<gpu>/sync_latency.json
#include <cuda/atomic>
#include <cuda/ptx>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "harness.cuh"

namespace {

enum Op : int {
  kNothing,
  kFenceAcqRelGpu,    // cuda::atomic_thread_fence(acquire, device): the step's acquire after a poll
  kFenceProxyAsync,   // fence.proxy.async.global: before produced data is read by bulk copies
  kLoadAcquireGpu,    // ld.acquire.gpu of a counter
  kLoadRelaxedGpu,    // ld.relaxed.gpu of a counter (a poll without the acquire)
  kFetchAddAcqRel,    // the pair count / split arrival
  kFetchAddRelease,   // release_signal
  kFetchAddRelaxed,   // a count whose readers acquire elsewhere
  kStoreThenFetchAddRelease,  // 4 KiB of partials stored by the warp, then the release count
  kOps
};
const char* const kOpNames[kOps] = {"nothing",          "fence_acq_rel_gpu", "fence_proxy_async_global",
                                    "ld_acquire_gpu",   "ld_relaxed_gpu",    "fetch_add_acq_rel",
                                    "fetch_add_release", "fetch_add_relaxed", "store_4k_then_fetch_add_release"};

constexpr int kCopyBytes = 64 << 10;
constexpr int kMaxCopies = 3;

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[size_t(q * double(v.size() - 1))];
}

// out[block] = {cycles of the op, cycles from the copies' issue to their completion}.
__global__ void sync_probe(const char* src, uint64_t src_chunks, uint64_t round, int copies, int quiet, int actor_warp,
                           int op, uint32_t* counters, float* partials, long long* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bar;
  namespace ptx = cuda::ptx;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&bar, 1);
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  }
  __syncthreads();
  if (int(blockIdx.x) < quiet) copies = 0;
  long long issued = 0;
  if (threadIdx.x == 0) {
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bar,
                                   uint32_t(copies * kCopyBytes));
    issued = clock64();
    for (int c = 0; c < copies; ++c) {  // chunks no earlier round read: every copy comes from DRAM
      const uint64_t chunk = ((round * gridDim.x + blockIdx.x) * kMaxCopies + c) % src_chunks;
      ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + c * kCopyBytes, src + chunk * kCopyBytes,
                         uint32_t(kCopyBytes), &bar);
    }
  }
  __syncthreads();
  long long op_cycles = 0;
  if (warp == actor_warp) {
    float* mine = partials + int64_t(blockIdx.x) * 1024;
    if (op == kStoreThenFetchAddRelease)
      for (int i = lane; i < 1024; i += 32) mine[i] = float(i + round);
    __syncwarp();
    if (lane == 0) {
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device> cnt(counters[blockIdx.x]);
      uint32_t sink = 0;
      const long long t0 = clock64();
      switch (op) {
        case kFenceAcqRelGpu: cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device); break;
        case kFenceProxyAsync: ptx::fence_proxy_async(ptx::space_global); break;
        case kLoadAcquireGpu: sink = cnt.load(cuda::memory_order_acquire); break;
        case kLoadRelaxedGpu: sink = cnt.load(cuda::memory_order_relaxed); break;
        case kFetchAddAcqRel: sink = cnt.fetch_add(1u, cuda::memory_order_acq_rel); break;
        case kFetchAddRelease:
        case kStoreThenFetchAddRelease: sink = cnt.fetch_add(1u, cuda::memory_order_release); break;
        case kFetchAddRelaxed: sink = cnt.fetch_add(1u, cuda::memory_order_relaxed); break;
        default: break;
      }
      // The result used before the clock is read again: a load's or RMW's round trip is counted.
      if (sink == 0xffffffffu) counters[gridDim.x] = sink;
      op_cycles = clock64() - t0;
    }
  }
  if (threadIdx.x == 0) {
    while (!ptx::mbarrier_try_wait_parity(&bar, 0u)) {
    }
    out[2 * blockIdx.x + 1] = clock64() - issued;
  }
  if (warp == actor_warp && lane == 0) out[2 * blockIdx.x] = op_cycles;
#endif
}

}  // namespace

int main() {
  using namespace tw::bench;
  const Gpu gpu = current_gpu();
  if (!has_bulk_copies(gpu, "bench_sync_latency")) return 0;
  const Floor floor = measure_floor(gpu);
  const int P = gpu.prop.multiProcessorCount;
  const uint64_t src_bytes = 2ull << 30, chunks = src_bytes / kCopyBytes;
  char* src = dev_alloc<char>(int64_t(src_bytes));
  uint32_t* counters = dev_alloc<uint32_t>(P + 1);
  float* partials = dev_alloc<float>(int64_t(P) * 1024);
  long long* out = dev_alloc<long long>(2 * P);
  TW_CUDA_CHECK(cudaMemset(src, 1, src_bytes));
  TW_CUDA_CHECK(cudaMemset(counters, 0, (P + 1) * sizeof(uint32_t)));
  const int smem = kMaxCopies * kCopyBytes;
  TW_CUDA_CHECK(cudaFuncSetAttribute(sync_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int clock_khz = 0;
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const double ns_per_cycle = 1e6 / clock_khz;
  std::printf("%s: floor %.3f TB/s; SM clock %.0f MHz (max), ns = cycles x %.3f\n", gpu.prop.name, floor.tbps(),
              clock_khz / 1e3, ns_per_cycle);
  std::printf("%-34s %6s %6s %6s %10s %10s %12s\n", "op", "copies", "actor", "sms", "op_cyc", "op_ns", "copies_us");
  ResultFile res("sync_latency", gpu, floor);
  res.doc["copy_bytes"] = kCopyBytes;
  res.doc["sm_clock_mhz_max"] = clock_khz / 1e3;
  uint64_t round = 0;
  const int reps = 20;
  const int quarter = P / 4;
  for (int op = 0; op < kOps; ++op)
    for (int copies : {0, 1, 3})
      for (int actor : {0, 1})
        for (int quiet : {0, quarter}) {
          if (quiet && (copies == 0 || actor == 0)) continue;
          std::vector<double> op_c, copy_c;
          std::vector<long long> host(2 * P);
          for (int r = 0; r < reps; ++r) {
            sync_probe<<<P, 64, smem>>>(src, chunks, round++, copies, quiet, actor, op, counters, partials, out);
            TW_CUDA_CHECK(cudaGetLastError());
            TW_CUDA_CHECK(cudaMemcpy(host.data(), out, host.size() * sizeof(long long), cudaMemcpyDeviceToHost));
            if (r == 0) continue;  // warm-up
            for (int b = 0; b < (quiet ? quiet : P); ++b) op_c.push_back(double(host[2 * b]));
            for (int b = quiet; b < P; ++b) copy_c.push_back(double(host[2 * b + 1]));
          }
          const double oc = quantile(op_c, 0.5), cc = quantile(copy_c, 0.5), p90 = quantile(op_c, 0.9);
          const char* sms = quiet ? "quiet" : "all";  // quiet: timed on the SMs that copy nothing
          std::printf("%-34s %6d %6s %6s %10.0f %10.0f %12.2f\n", kOpNames[op], copies, actor ? "other" : "issuer", sms,
                      oc, oc * ns_per_cycle, copies ? cc * ns_per_cycle / 1e3 : 0.0);
          res.add({{"op", kOpNames[op]}, {"copies", copies}, {"actor", actor ? "other_warp" : "issuing_thread"},
                   {"timed_on", quiet ? "quiet_sms" : "every_sm"}, {"quiet_sms", quiet},
                   {"op_cycles_median", oc}, {"op_cycles_p90", p90}, {"op_ns_median", oc * ns_per_cycle},
                   {"copies_cycles_median", copies ? cc : 0.0}});
        }
  std::printf("-> %s\n", res.write(gpu).c_str());
  for (void* q : {static_cast<void*>(src), static_cast<void*>(counters), static_cast<void*>(partials), static_cast<void*>(out)})
    TW_CUDA_CHECK(cudaFree(q));
  return 0;
}
