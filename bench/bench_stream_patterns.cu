// How the order in which SMs read memory changes the streaming-read rate on this GPU. The floor
// kernel's chunks are dealt round-robin (every SM reads next to the others); a tile body that
// gives each SM its own tile reads 132 regions a tile apart. Both read every byte once with the
// same copies in flight; only the address each SM reads next differs:
//   tile_chunks = 1        chunk c goes to SM c % G (the floor kernel's order)
//   tile_chunks = T        tiles of T consecutive chunks go round-robin, each read front to back
//   tile_chunks = n / G    each SM reads one contiguous 1/G of the buffer
// and, last, how much a subset of the SMs reads on its own (a launch's last wave).
// Each is timed one launch per graph replay and back to back (harness.cuh).
//   bench_stream_patterns   JSON -> $TW_RESULTS_DIR/<gpu>/stream_patterns.json
#include <cuda/ptx>

#include <cstdio>
#include <string>
#include <vector>

#include "harness.cuh"

namespace {

// One thread per block keeps `stages` bulk copies of `chunk` bytes in flight. Block b's i-th chunk
// is chunk (tile * T + i % T) with tile = b + (i / T) * G.
// extra > 0: each stage also copies `extra` bytes of a small L2-resident buffer (as a tile body's
// activation copies do beside its weight copy) on the same barrier.
__global__ void stream_tiles(const char* src, uint64_t nchunks, int chunk, int stages, uint64_t tile_chunks,
                             const char* extra_src = nullptr, int extra = 0, int extra_copies = 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char smem[];
  __shared__ uint64_t bar[16];
  __shared__ __align__(128) char extra_dst[4][4096];
  if (threadIdx.x != 0) return;
  namespace ptx = cuda::ptx;
  for (int s = 0; s < stages; ++s) ptx::mbarrier_init(&bar[s], 1);
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
  auto chunk_of = [&](uint64_t i) { return (blockIdx.x + (i / tile_chunks) * gridDim.x) * tile_chunks + i % tile_chunks; };
  auto issue = [&](int s, uint64_t c) {
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &bar[s],
                                   uint32_t(chunk + extra * extra_copies));
    ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, smem + s * chunk, src + c * chunk, uint32_t(chunk), &bar[s]);
    for (int e = 0; e < extra_copies; ++e)  // the same smem for every stage: only the copy's cost matters
      ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global, extra_dst[e], extra_src + e * extra, uint32_t(extra), &bar[s]);
  };
  for (int s = 0; s < stages; ++s)
    if (chunk_of(s) < nchunks) issue(s, chunk_of(s));
  for (uint64_t it = 0;; ++it) {
    if (chunk_of(it) >= nchunks) break;
    const int s = int(it % stages);
    while (!ptx::mbarrier_try_wait_parity(&bar[s], uint32_t((it / stages) & 1))) {
    }
    if (chunk_of(it + stages) < nchunks) issue(s, chunk_of(it + stages));
  }
#endif
}

}  // namespace

int main() {
  using namespace tw::bench;
  const Gpu gpu = current_gpu();
  if (!has_bulk_copies(gpu, "bench_stream_patterns")) return 0;
  const Floor floor = measure_floor(gpu);
  const int sms = gpu.prop.multiProcessorCount;
  const size_t pool = size_t(2) << 30;
  char* buf;
  TW_CUDA_CHECK(cudaMalloc(&buf, pool));
  TW_CUDA_CHECK(cudaMemset(buf, 0x5a, pool));
  TW_CUDA_CHECK(cudaFuncSetAttribute(stream_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, 196 * 1024));
  ResultFile rf("stream_patterns", gpu, floor);
  std::printf("floor %.3f TB/s (8 GiB, round-robin 16 KiB chunks)\n", floor.tbps());
  std::printf("%10s %7s %6s %12s %9s %8s %9s %8s\n", "bytes", "chunk", "stages", "tile", "TB/s", "% floor", "seq TB/s",
              "% floor");
  // 235 MB and 117 MB: the Llama-3-8B gate_up and down weights; 1 GB: long-run rate.
  for (size_t bytes : {size_t(234881024), size_t(117440512), size_t(1) << 30})
    for (int chunk : {32768})
      for (int stages : {4, 6}) {
        const uint64_t n = bytes / chunk;
        for (uint64_t tile_bytes : {uint64_t(0), uint64_t(131072), uint64_t(524288), uint64_t(1) << 20, uint64_t(0) - 1}) {
          const uint64_t t = tile_bytes == 0 ? 1 : tile_bytes == uint64_t(0) - 1 ? (n + sms - 1) / sms : tile_bytes / chunk;
          const int sets = int(pool / bytes);
          auto run = [&](int s, cudaStream_t st) {
            stream_tiles<<<sms, 32, stages * chunk, st>>>(buf + size_t(s) * bytes, n, chunk, stages, t);
          };
          const double us = time_us(run, sets, 10, 60), seq_us = time_us_seq(run, sets);
          const double tbps = bytes / us * 1e-6, seq_tbps = bytes / seq_us * 1e-6;
          const std::string tile = tile_bytes == 0 ? "round-robin" : tile_bytes == uint64_t(0) - 1 ? "1/G" : std::to_string(tile_bytes / 1024) + " KiB";
          std::printf("%10zu %7d %6d %12s %9.3f %8.1f %9.3f %8.1f\n", bytes, chunk, stages, tile.c_str(), tbps,
                      100 * tbps / floor.tbps(), seq_tbps, 100 * seq_tbps / floor.tbps());
          rf.add({{"bytes", bytes}, {"chunk", chunk}, {"stages", stages}, {"tile", tile}, {"tile_chunks", t},
                  {"us", us}, {"tbps", tbps}, {"pct_floor", 100 * tbps / floor.tbps()}, {"seq_us", seq_us},
                  {"seq_tbps", seq_tbps}, {"seq_pct_floor", 100 * seq_tbps / floor.tbps()}});
        }
      }
  // How fast can fewer SMs read? When only some SMs have work left (a launch's last wave), the
  // rate is theirs alone: G blocks, one per SM, round-robin 32 KiB chunks, 6 in flight, 1 GB.
  std::printf("\n%6s %7s %6s %12s %9s %12s\n", "SMs", "chunk", "stages", "+ copies", "TB/s", "GB/s per SM");
  nlohmann::json per_sm = nlohmann::json::array();
  struct Sub {
    int g, chunk, stages, extra = 0, extra_copies = 0;
  };
  // The last rows: a quarter of the SMs with half / twice the bytes in flight (latency- or rate-bound?).
  for (auto [g, chunk, stages, extra, extra_copies] : {Sub{sms, 32768, 6}, Sub{sms * 3 / 4, 32768, 6}, Sub{sms / 2, 32768, 6},
                                  Sub{sms / 4, 32768, 6}, Sub{sms / 8, 32768, 6}, Sub{sms / 4, 32768, 3},
                                  Sub{sms / 4, 16384, 12}, Sub{sms / 4, 65536, 3}, Sub{sms / 4, 32768, 6, 2048, 2},
                                  Sub{sms, 32768, 6, 2048, 2}}) {
    const size_t bytes = size_t(1) << 30;
    const double us = time_us_seq([&](int s, cudaStream_t st) {
      stream_tiles<<<g, 32, stages * chunk, st>>>(buf + size_t(s) * bytes, bytes / chunk, chunk, stages, 1, buf, extra,
                                                  extra_copies);
    }, int(pool / bytes));
    const double tbps = bytes / us * 1e-6;
    const std::string plus = extra_copies ? std::to_string(extra_copies) + "x" + std::to_string(extra) : "-";
    std::printf("%6d %7d %6d %12s %9.3f %12.1f\n", g, chunk, stages, plus.c_str(), tbps, tbps * 1e3 / g);
    per_sm.push_back({{"sms", g}, {"chunk", chunk}, {"stages", stages}, {"extra_copies", extra_copies},
                      {"extra_bytes", extra}, {"seq_us", us}, {"tbps", tbps},
                      {"gbps_per_sm", tbps * 1e3 / g}});
  }
  rf.doc["fewer_sms"] = per_sm;
  std::printf("wrote %s\n", rf.write(gpu).c_str());
  TW_CUDA_CHECK(cudaFree(buf));
  return 0;
}
