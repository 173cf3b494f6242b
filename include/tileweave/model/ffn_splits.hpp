// FusedFfn's K slices chosen by the traffic model (issue 16): what the op runs where the caller sets
// none, and what `tileweave plan ffn` shows as the executor's plan. C++17 (the CUDA sources include
// it); defined in src/model/planner.cpp.
#pragma once

#include <cstdint>
#include <string>

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
//
// At any M, an op with more output tiles than SMs and a partial last wave may instead run its whole
// waves unsplit and only the last wave's tiles in K slices (whole_waves: order
// "waves:<SMs>/kslices/col_major", even slices): per op the slice counts that spread that wave over at
// most two rounds of the grid are replayed with the other op at its rule, the best of each op and both
// together are compared with the choice above, and the fastest is taken if it beats the rules' by
// kFfnModelSplitGain.
constexpr int64_t kFfnModelSplitMaxM = 64;
constexpr int64_t kFfnModelSplitWideM = 512;
constexpr double kFfnModelSplitGain = 0.05;
struct FfnSplits {
  int split_gate_up = 0, split_down = 0;  // 0: the rule's
  bool whole_waves = false;               // the splits are the last waves' (order waves:<SMs>/...)
  double rules_us = 0, us = 0;            // predicted: the rules' plan, the chosen one (0 above kFfnModelSplitWideM)
};
// whole_waves = false: the splits of every tile only (the choice before whole waves, for A/Bs).
FfnSplits choose_ffn_splits(const FfnShape& s, const GpuPreset& preset, bool whole_waves = true);
// FusedFfn's order where FfnSplits::whole_waves: "waves:<sms>/kslices/col_major".
std::string ffn_whole_waves_order(int sms);

}  // namespace tw
