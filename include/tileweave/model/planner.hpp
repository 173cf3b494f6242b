// `tileweave plan` (issue 16, item 1): the executor's own plan for an op family and shape, and the
// candidate plans the model considers beside it, ranked by predicted time. Every candidate is a
// graph the executor can run: it is built by the host copy of the executor's sm90 tiling rules
// (model/validation.hpp) from the knobs the executor exposes (FfnOptions::split_gate_up /
// split_down / order, DecodeGemmOptions::split_k / order), and scored like the validation grid
// (simulate() at the GPU preset's L2, P = its SM count, then predict_time()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/model/ffn_splits.hpp"
#include "tileweave/model/presets.hpp"

namespace tw {

struct PlanRequest {
  std::string op;         // "ffn" (fused FFN; gated unless `gated` is false) or "gemm" (DecodeGemm)
  int64_t m = 0;          // activation rows (tokens)
  int64_t d = 0, f = 0;   // ffn: hidden and intermediate sizes
  int64_t n = 0, k = 0;   // gemm: Y[m, n] = X[m, k] W[n, k]^T
  bool gated = true;      // ffn: SiLU-gated (W_gate_up [2f, d]) or the plain two-GEMM MLP
  // How many of the simple model's best candidates are re-scored with the partitioned L2 model
  // (the executor's plan always is); < 0: all of them.
  int refine = 4;
  // K slices are tried while slices x output tiles <= max_split_waves x grid (split-K only fills
  // the GPU's waves; beyond that it adds reductions, and the replay of huge graphs is slow);
  // 0: every count the executor's rules allow.
  double max_split_waves = 8;
};

// The largest M the planner takes (the sm90 body has no explicit limit below int32; this keeps the
// replay of one candidate within about a second on one core).
constexpr int64_t kPlanMaxM = 65536;
// The largest d, f, n or k it takes.
constexpr int64_t kPlanMaxDim = int64_t{1} << 20;

// The executor's knobs that a candidate sets (0 = the executor's own rule).
struct PlanKnobs {
  int split_gate_up = 0, split_down = 0;  // ffn
  int split_k = 0;                        // gemm
  std::string order = "kslices/col_major";
  int tile_rows = 0;                      // activation rows per tile; 0: the executor's ("fit")
  bool operator==(const PlanKnobs&) const = default;
};

struct PlanOp {
  std::string name;
  int64_t bm = 0, bn = 0, bk = 0;  // activation rows, output columns (weight rows), K per stage
  int64_t split_k = 1;
  std::vector<int64_t> slice_steps;  // each K slice's length in K-steps (bk)
  int64_t tiles = 0;
};

struct PlanCandidate {
  PlanKnobs knobs;
  std::string label;  // the knobs as one line, e.g. "down=4 kslices/col_major"
  bool executor = false;  // the executor's default options for this shape
  std::vector<PlanOp> ops;
  int64_t tiles = 0;
  int64_t tickets = 0;  // the schedule's tickets (fewer than tiles where a ticket runs several, e.g. whole waves)
  double waves = 0;     // tickets / grid
  std::string order;    // the order spec the executor runs (the knobs', or FusedFfn's "waves:" order)
  int64_t simple_read = 0, simple_write = 0;
  double simple_us = 0;
  bool refined = false;  // also scored with the partitioned model
  int64_t part_read = 0, part_write = 0;
  double part_us = 0;
  double ratio = 0;  // predicted us / the executor's plan's, under the same model
  // The model's figures that rank it: the partitioned model's where refined, else the simple one's.
  double us() const { return refined ? part_us : simple_us; }
  int64_t read() const { return refined ? part_read : simple_read; }
};

struct PlanResult {
  PlanRequest request;
  std::string preset;
  int grid = 0;
  PlanCandidate executor;
  // Ranked: the refined candidates by the partitioned model's time, then the others by the simple
  // model's. candidates[0] is the model's best.
  std::vector<PlanCandidate> candidates;
  std::vector<std::string> rejected;  // knob values the executor's rules refuse, with the reason
  std::vector<std::string> skipped;   // K-slice counts not scored (over max_split_waves)
  std::vector<std::string> left_out;  // what the planner does not enumerate, and why
};

// InvalidArgument naming the first bad value.
void check_plan_request(const PlanRequest& r);
// The orders every candidate tiling is tried with (the validation grid's, less its search).
const std::vector<std::string>& plan_orders();
// K-slice counts tried for a K of `k` with the executor's stage width at M = m: 1, 2, 4, ... up to
// min(K-steps, 64 slices) and, with max_waves > 0, while s x out_tiles <= max_waves x grid (1 always).
std::vector<int> plan_splits(int64_t m, int64_t k, int64_t out_tiles = 1, int grid = 1, double max_waves = 0);
// The candidates' knobs, before scoring: the executor's own first, then every distinct tiling (two
// knob settings the rules turn into the same slices are one candidate) with every order. Knob
// values the rules refuse go to *rejected.
std::vector<PlanKnobs> plan_candidate_knobs(const PlanRequest& r, int sms, std::vector<std::string>* rejected = nullptr,
                                            std::vector<std::string>* skipped = nullptr);
// The graph a candidate's knobs give, as the executor builds it: with a preset, an FFN's default
// knobs take the K slices FusedFfn chooses on that GPU (choose_ffn_splits); without, the rules'.
// `order` (optional): the order spec the executor runs that graph with (FusedFfn's "waves:" order
// where its splits are the last waves').
TileGraph plan_graph(const PlanRequest& r, const PlanKnobs& k, int sms, const GpuPreset* preset = nullptr,
                     std::string* order = nullptr);
PlanResult make_plan(const PlanRequest& r, const GpuPreset& preset);


}  // namespace tw
