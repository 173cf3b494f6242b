// FusedFfn's K slices chosen by the traffic model (issue 16): what the op runs where the caller sets
// none, and what `tileweave plan ffn` shows as the executor's plan. C++17 (the CUDA sources include
// it); defined in src/model/planner.cpp.
#pragma once

#include <cstdint>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/presets.hpp"

namespace tw {

// FusedFfn's K slices where the caller sets none, on the sm90 body. At M <= kFfnModelSplitMaxM the
// weights' stream is the time, and how many SMs stream each op decides it: the rules' tiling
// (sm90_ffn_tiling with no splits) and the candidates gate/up in 1, 2, 3, 4, 6 or 8 slices (down at
// its rule) and down in 1, 2, 4 or 8 (gate/up at its rule), within 8 waves, are replayed (simple L2
// model, the tile replay, kslices/col_major) and the fastest is taken if it beats the rules' by at
// least kFfnModelSplitGain (below that the model's ranking is not sure: measured on the H200,
// 2026-11-25). Up to kFfnModelSplitWideM only gate/up splits finer than the rules': where the rules
// leave a gate/up GEMM of fewer output tiles than SMs in one or a few slices, the model's finer splits
// ran 8-18% faster (H200, 2026-11-27: 4 of 4 such picks among 30 shapes at M = 100-512,
// bench/results/h200/sweep_mid_m_splits_ab.json). Its other picks there were mixed or worse: coarser
// gate/up splits 1 faster, 4 of 5 slower by 3-12% (small shapes, d <= 2048, bench_ffn in the same
// session), down splits coarser than the rules' fill 4-16% slower on 3 of 5 (the replay misses what a
// few long K slices on an under-filled grid cost). Above that M, or if none wins, {0, 0}: the rules.
constexpr int64_t kFfnModelSplitMaxM = 64;
constexpr int64_t kFfnModelSplitWideM = 512;
constexpr double kFfnModelSplitGain = 0.05;
struct FfnSplits {
  int split_gate_up = 0, split_down = 0;  // 0: the rule's
  double rules_us = 0, us = 0;            // predicted: the rules' plan, the chosen one (0 above kFfnModelSplitWideM)
};
FfnSplits choose_ffn_splits(const FfnShape& s, const GpuPreset& preset);

}  // namespace tw
