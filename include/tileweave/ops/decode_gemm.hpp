// Decode GEMM on the tile executor: Y[M, N] = X[M, K] W[N, K]^T (bf16, fp32 accumulation; W a
// PyTorch Linear weight) as a one-op tile graph run by the fused FFN's sm90 tile body -- a TMA (or
// bulk-copy, for packed weights) producer warp taking the tickets, wgmma consumers, split-K
// reduced in the launch, K slices that end short. The standalone GEMM and the fused ops thus share
// one mainloop, one tiling rule and one weight layout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/order/schedule.hpp"
#include "tileweave/runtime/device_plan.hpp"

namespace tw {

struct DecodeGemmOptions {
  bool packed_weights = false;   // run() takes W as written by pack() (one contiguous copy per stage)
  // Any make_order spec, or "streamk": stream-K, even K slices (stream_k_split) cut into one ticket
  // of equal K work per SM (streamk:<SMs>/row_major; k_slices does not apply).
  std::string order = "kslices/col_major";
  int split_k = 0;               // K slices; 0 = as many as bring the tiles to one wave of SMs
  std::string k_slices = "even";    // "even", or "tail:<n>": the last waves of tiles shorter
  std::string tile_rows = "fit";    // activation rows per tile: "fit", "pow2" or a height (FfnOptions::tile_rows)
  uint32_t spin_limit = 0;       // tests: bounded waits
  bool trace = false;            // record every tile's timeline (plan().read_trace()), as FfnOptions::trace
  // Start on the SMs the previous kernel in the stream leaves and stream the first tiles' weights
  // while it finishes (programmatic dependent launch; FfnOptions::overlap_previous says more).
  bool overlap_previous = false;
};

class DecodeGemm {
 public:
  // Needs an sm_90 GPU; M >= 1, N >= 1, K >= 8 with K % 8 == 0 (InvalidArgument otherwise).
  DecodeGemm(int64_t m, int64_t n, int64_t k, const DecodeGemmOptions& opt = {});
  ~DecodeGemm();
  DecodeGemm(const DecodeGemm&) = delete;
  DecodeGemm& operator=(const DecodeGemm&) = delete;

  // One launch; graph-capturable. Pointers: device, 16-byte aligned.
  void run(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* w, cudaStream_t stream) const;
  // W [N, K] into `packed` (packed_size() elements), for objects built with packed_weights.
  void pack(const __nv_bfloat16* w, __nv_bfloat16* packed, cudaStream_t stream) const;
  int64_t packed_size() const;

  const TileGraph& graph() const { return g_; }
  const Schedule& schedule() const { return sched_; }
  const runtime::DevicePlan& plan() const { return *plan_; }
  int grid() const { return grid_; }

 private:
  int64_t m_, n_, k_;
  bool packed_, overlap_;
  bool split_finisher_ = false;  // FfnOptions::split_finisher where the schedule allows it
  TileGraph g_;
  int op_ = -1;
  Schedule sched_;
  std::unique_ptr<runtime::DevicePlan> plan_;
  float* ws_ = nullptr;  // split-K accumulators, zero between launches
  int grid_ = 0, act_rows_ = 0;
  uint32_t spin_limit_ = 0;
};

}  // namespace tw
