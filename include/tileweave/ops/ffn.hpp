// The fused FFN: gate/up GEMM -> SiLU * mul -> down GEMM in one persistent launch of the tile
// executor (or the research notes' plain two-GEMM chain when shape.gated is false).
//   h = silu(x W_gate^T) * (x W_up^T)   W_gate_up = [W_gate; W_up]  [2F, d]   (chain: h = x W0^T, W0 [F, d])
//   y = h W_down^T                      W_down [d, F]
// All tensors bf16 row-major, fp32 accumulation; split-K partial sums are reduced inside the launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/order/schedule.hpp"
#include "tileweave/runtime/device_plan.hpp"

namespace tw {

// Defaults are the fastest measured on the H200 (bench/results/h200/ffn.json): both GEMMs are
// weight streams of their own, so finishing the first before the second beat interleaving them
// (dataflow) at decode sizes; running each op's split-K slices one after another (kslices/) beat
// running a tile's slices together (same-address reductions); and with that order, per-tile
// waits let the first down tiles start while the last gate/up tiles finish (tile beat row sync).
struct FfnOptions {
  // Tile body: "sm90" (Hopper: a TMA producer warp that also takes the tickets, wgmma consumer
  // warpgroups, one CTA per SM), "sm80" (cp.async + mma.sync, several blocks per SM), or "auto"
  // (sm90 on sm_90 devices).
  std::string mainloop = "auto";
  // Any make_order spec ("op_by_op_column" and "op_by_op" name col_major and row_major; "dataflow"
  // is col_major with consumers moved after their producers, lagged by the grid; "streamk" is
  // stream-K: each op in even K slices (model/validation.hpp, stream_k_split, unless the splits
  // are given) cut into one ticket of equal K work per block, streamk:<grid>/row_major); or pass a
  // Schedule to the constructor.
  std::string order = "kslices/col_major";
  SyncSpec sync{SyncPolicy::Tile, 1};     // how down tiles wait for gate/up tiles
  int split_gate_up = 0;           // K slices of the first GEMM; 0 = from the shape
  int split_down = 0;              // K slices of the down GEMM; 0 = from the shape
  // sm90, both splits 0: "model" (the traffic model's replay chooses them at M <= 64, on this GPU's
  // preset: model/planner.hpp, choose_ffn_splits; `tileweave plan ffn` prints its choice), "model:P"
  // (the same on preset P, a name or a preset JSON file: to measure a recalibration's plans) or
  // "rules" (the size rules alone: model/validation.hpp, sm90_ffn_tiling).
  std::string splits = "model";
  // sm90, with splits "model..." and the default order: the model may split only the last, partial
  // wave of an op of more output tiles than SMs and run its whole waves unsplit, one ticket of all
  // its K slices per tile (model/ffn_splits.hpp; order "waves:<SMs>/kslices/col_major").
  // false: every tile of a split op is split (the plans before, for A/Bs).
  bool whole_waves = true;
  // sm90: activation rows per tile (wgmma N; model/validation.hpp, sm90_tile_rows): "fit" (above
  // 64 rows the smallest multiple of 32 that holds each row block's share: M = 200 in one tile of
  // 224, M = 300 in two of 160; sm90::fit_act_rows), "pow2" (8, 16, ..., 256 from M), or a height.
  // "fit" is the default because the body computes whole tiles: padding rows cost as much as real
  // ones (docs/executor.md, "Tile heights fitted to M", has the measured A/B). Up to 64 rows and at
  // multiples of 256 the two agree.
  std::string tile_rows = "fit";
  // sm90: how the down GEMM's K slices are sized. "even", or "tail:<n>": the last n waves of tiles
  // (a wave = one tile per SM) in slices of 1/2, 1/4, ... 1/2^n the size of the others, so the
  // launch ends on short tiles (with split_down, the others' size is K / split_down).
  std::string down_slices = "tail:1";
  int blocks_per_sm = 0;           // 0 = as many as fit (sm90: one)
  int bk = 0;                      // sm80: K per warp per pipeline stage: 64 or 128; 0 = by M
  int k_split_warps = 0;           // sm80: warps per 16-row group: 4 (16-row tiles) or 2 (32-row), M <= 16; 1: 64-row tiles; 0 = by shape
  uint32_t spin_limit = 0;         // > 0: waits abort after this many polls (tests)
  uint32_t delay_ns = 0;           // > 0: producers sleep up to this long before signalling (stress)
  bool trace = false;              // sm90: record every tile's timeline (plan().read_trace())
  // sm90: run() takes the weights in the packed streaming layout written by FusedFfn::pack (once,
  // at model load): each pipeline stage is one contiguous copy. ~3% faster on the H200.
  bool packed_weights = false;
  // sm90: launch to overlap the previous kernel in the stream (programmatic dependent launch). The
  // launch's blocks start on the SMs that kernel's blocks leave and stream their first tile's
  // weights -- which no kernel writes -- before they wait for it to finish; x, h, y and the
  // counters are touched only after. Pays off when the kernel before lets the next one start early
  // (ours do at their start; after any other kernel, only as its last blocks exit). The caller
  // promises that the kernel before does not write the weights (pack() them, then synchronise).
  bool overlap_previous = false;
  // sm90: a block's next ticket is drawn (by its ticket warp) when its current tile has this many
  // K stages left to issue, 0..64 (0: once all are issued, as the producer drew it before the
  // ticket warp). 8: a draw's round trips take up to ~6 us from an SM with copies in flight, ~8
  // stages of 32 KiB at one SM's share of the floor; 0 / 16 / 64 measured slower (docs/executor.md,
  // "The ticket warp"). Also DecodeGemm's.
  int ticket_lead = 8;
  // sm90, split-K ops on tiles of more than 64 activation rows (M > 64): each output tile's slice of
  // the last K range sums the tile (it waits for the others' arrivals, which a warp of their block
  // makes while its consumers go on to their next tile), where the schedule puts that slice after
  // the tile's others; false, smaller tiles or another schedule: the last slice to arrive sums
  // (every slice's consumers wait for their own arrival). Also DecodeGemm's. docs/executor.md,
  // "The split finisher".
  bool split_finisher = true;
};

// Elements of the packed W_gate_up and W_down (FusedFfn::pack) for a shape.
struct FfnPackedSize {
  int64_t gate_up = 0, down = 0;
};

class FusedFfn {
 public:
  FusedFfn(const FfnShape& shape, const FfnOptions& opt = {});
  // With a schedule of this object's graph (e.g. read from JSON); validated before any upload.
  FusedFfn(const FfnShape& shape, const FfnOptions& opt, const Schedule& order);
  ~FusedFfn();

  // y = FFN(x). x [M, d], w_gate_up [2F, d] (chain: [F, d]), w_down [d, F], y [M, d]. Pointers must
  // be device pointers aligned to 16 bytes. The intermediate h lives in this object.
  void run(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, const __nv_bfloat16* w_down, __nv_bfloat16* y,
           cudaStream_t stream) const;

  // Writes W_gate_up and W_down (PyTorch layout, as for run()) in the packed layout into
  // packed_gate_up / packed_down (packed_size() elements, 16-byte aligned), on `stream`. For
  // objects built with packed_weights; their run() then takes the packed pointers.
  void pack(const __nv_bfloat16* w_gate_up, const __nv_bfloat16* w_down, __nv_bfloat16* packed_gate_up,
            __nv_bfloat16* packed_down, cudaStream_t stream) const;
  FfnPackedSize packed_size() const;

  // The CuSync-style baseline: the gate/up tiles and the down tiles as two kernels on two streams
  // (forked from and joined back to `stream`), synchronised by the same per-tile counters, with
  // CuSync's wait kernel before the consumer. Needs a schedule with every gate/up tile first.
  void run_two_kernels(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, const __nv_bfloat16* w_down,
                       __nv_bfloat16* y, cudaStream_t stream, cudaStream_t consumer_stream) const;

  // After a launch that aborted on a bounded wait (plan().error() != 0): zero counters and accumulators.
  void reset();

  const FfnGraph& graph() const { return g_; }
  const Schedule& schedule() const { return sched_; }
  const runtime::DevicePlan& plan() const { return *plan_; }
  int grid() const { return grid_; }
  bool uses_sm90() const { return sm90_; }
  bool uses_packed_weights() const { return packed_; }
  bool uses_split_finisher() const { return split_finisher_; }  // FfnOptions::split_finisher, where it applies
  int act_rows_per_tile() const { return act_rows_; }
  // Graph tiling used for a shape (same rule as the constructor): for the model and the CLI.
  static FfnTiling tiling_for(const FfnShape& shape, const FfnOptions& opt);

 private:
  void init(const FfnOptions& opt, const Schedule* order);
  struct Launch;
  Launch prepare(const __nv_bfloat16* x, const __nv_bfloat16* w_gate_up, const __nv_bfloat16* w_down,
                 __nv_bfloat16* y) const;
  void launch(const Launch& l, const runtime::ExecParams& ep, int grid, cudaStream_t stream) const;
  FfnShape shape_;
  FfnGraph g_;
  Schedule sched_;
  std::unique_ptr<runtime::DevicePlan> plan_;
  __nv_bfloat16* h_ = nullptr;
  float* ws_ = nullptr;  // split-K accumulators of both GEMMs
  size_t ws_down_offset_ = 0, ws_bytes_ = 0;
  bool sm90_ = false;
  int grid_ = 0, act_rows_ = 0, bk_ = 64, ks_ = 1, smem_ = 0;
  int fit_per_sm_ = 0, sms_ = 0;
  uint32_t spin_limit_ = 0, delay_ns_ = 0;
  bool packed_ = false, overlap_ = false;
  int ticket_lead_ = 0;  // FfnOptions::ticket_lead, set by init
  bool split_finisher_ = false;  // FfnOptions::split_finisher where the schedule allows it
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  // Counters count launches: one object runs either fused or as two kernels, never both.
  mutable int mode_ = 0;  // 0 unused, 1 fused, 2 two kernels
};

}  // namespace tw
