// Diagnostic build of the decode step (-DTW_STAGE_TRACE=<block>): the SM cycle counter at each step of
// every attention stage of one block -- the producer's wait for a free slot, its copies' issue, and per
// consumer warp the wait for the stage's data and the slot's release -- for each attention op of the
// launch (the block's last tile of it). `bench_decode_step --trace` then writes them next to its
// results (stage_<model>_<batch>_<kv>.bin) and scripts/stage_trace.py prints where a stage's time goes.
// It found the producer's own instructions, not the memory, setting the attention's pace (session 27).
// Off (the default), the marks compile to nothing.
#pragma once

#ifdef TW_STAGE_TRACE
#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "tileweave/util/cuda_check.hpp"

namespace tw::step {

// [op][stage][word]: words 0-3 the producer (before the slot wait, after it, copies issued, the stage
// armed before its copies), 4 + 3w .. 6 + 3w consumer warp w (before its data wait, after it, before
// the release). Stage kStageTraceStages - 1 holds the tile: 0 ready, 1 the producer's last stage
// issued, 2 stages, 3 tile index, 4 consumers' start, 5 their last stage done.
constexpr int kStageTraceOps = 256, kStageTraceStages = 192, kStageTraceWords = 28;
static __device__ unsigned long long g_stage_trace[kStageTraceOps][kStageTraceStages][kStageTraceWords];

__device__ __forceinline__ void stage_trace_put(int op, int j, int w, unsigned long long v) {
  if (blockIdx.x == TW_STAGE_TRACE && op < kStageTraceOps && j < kStageTraceStages) g_stage_trace[op][j][w] = v;
}
// Writes this translation unit's stamps (one per head dim) and clears them for the next case.
static inline void dump_stage_trace(const char* path) {
  std::vector<unsigned long long> h(size_t(kStageTraceOps) * kStageTraceStages * kStageTraceWords);
  TW_CUDA_CHECK(cudaMemcpyFromSymbol(h.data(), g_stage_trace, h.size() * sizeof(h[0])));
  FILE* f = std::fopen(path, "wb");
  if (!f) throw std::runtime_error(std::string("stage trace: cannot write ") + path);
  std::fwrite(h.data(), sizeof(h[0]), h.size(), f);
  std::fclose(f);
  std::fill(h.begin(), h.end(), 0ull);
  TW_CUDA_CHECK(cudaMemcpyToSymbol(g_stage_trace, h.data(), h.size() * sizeof(h[0])));
}

}  // namespace tw::step

#define TW_STAGE_MARK(op, j, w) ::tw::step::stage_trace_put(op, j, w, clock64())
#define TW_STAGE_PUT(op, j, w, v) ::tw::step::stage_trace_put(op, j, w, v)
#define TW_STAGE_TILE (::tw::step::kStageTraceStages - 1)
#else
#define TW_STAGE_MARK(op, j, w) ((void)0)
#define TW_STAGE_PUT(op, j, w, v) ((void)0)
#endif
