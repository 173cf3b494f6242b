// Decode attention followed by the attention output projection, in one persistent launch of the
// tile executor:
//   O = attention(q, K, V)   [B, Hq*D]   (RoPE, KV append, GQA, stream-K split-KV: DecodeAttention)
//   Y = O . Wo^T (+ R)       [B, hidden] (Wo a PyTorch Linear weight [hidden, Hq*D])
// The graph (graph/attention_graph.hpp) cuts o_proj's K = Hq*D into slices (split-K), so a slice is
// a range of heads; an o_proj tile streams its first weight stages, then waits only for the attention
// tiles that hold its rows and heads (per-tile counters from make_exec_plan). Attention tiles run
// kernels/attention/decode.cuh, o_proj tiles the sm80 weight tile (kernels/sm80/weight_tile.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tileweave/graph/attention_graph.hpp"
#include "tileweave/ops/attention.hpp"
#include "tileweave/order/schedule.hpp"
#include "tileweave/runtime/device_plan.hpp"

namespace tw {

struct AttentionOprojOptions {
  int split_k = 0;        // K slices of o_proj; 0: attention_oproj_tiling's (whole KV-head groups, ~128 KiB tiles)
  int blocks_per_sm = 0;  // executor blocks per SM, 1 or 2 (0: 2; one was slower in every H200 case).
                          // Attention is planned for as many tiles per SM (unless the shape sets
                          // tiles_per_sm), so every block's first ticket is an attention tile: blocks
                          // reach the ticket counter in no set order, and fewer attention tiles would
                          // land unevenly on SMs (measured: up to 1.2x slower).
  bool residual = false;  // Y = O . Wo^T + R (run() then needs R)
  // Any make_order spec; every one puts each o_proj tile after the attention tiles it reads.
  std::string order = "kslices/col_major";
  uint32_t spin_limit = 0;  // > 0: waits abort after this many polls (tests)
  uint32_t delay_ns = 0;    // > 0: tiles sleep up to this long before signalling (stress)
};

struct AttentionOprojTensors {
  const __nv_bfloat16* q = nullptr;      // [B, Hq, D], before RoPE
  const __nv_bfloat16* k_new = nullptr;  // [B, Hkv, D], before RoPE (only with append)
  const __nv_bfloat16* v_new = nullptr;  // [B, Hkv, D] (only with append)
  __nv_bfloat16* k_cache = nullptr;      // layout as DecodeAttentionShape says
  __nv_bfloat16* v_cache = nullptr;
  const __nv_bfloat16* w_o = nullptr;    // [hidden, Hq*D]
  const __nv_bfloat16* residual = nullptr;  // [B, hidden], with options.residual (may alias y)
  __nv_bfloat16* y = nullptr;            // [B, hidden]
};

class AttentionOproj {
 public:
  // Validates everything (tw::InvalidArgument naming the bad value) before touching the GPU, plans
  // the attention for the executor's grid, builds the graph and schedule, uploads the plan and
  // allocates O and the split-K accumulator. Head dim 64 or 128; GQA groups 1, 2, 4 or 8 (the
  // instantiated kernels); K/V stream with cp.async.
  AttentionOproj(const DecodeAttentionShape& shape, int64_t hidden, std::vector<int> seq_lens,
                 std::vector<int> page_table = {}, const AttentionOprojOptions& opt = {});
  ~AttentionOproj();
  AttentionOproj(const AttentionOproj&) = delete;
  AttentionOproj& operator=(const AttentionOproj&) = delete;

  // One launch; capturable in a CUDA graph (no per-launch host state). One stream at a time.
  void run(const AttentionOprojTensors& t, cudaStream_t stream) const;
  // After a launch that aborted on a bounded wait (plan().error() != 0): zero counters,
  // accumulators and the attention's merge counters.
  void reset();

  const AttentionOprojGraph& graph() const { return g_; }
  const Schedule& schedule() const { return sched_; }
  const runtime::DevicePlan& plan() const { return *plan_; }
  const DecodeAttention& attention() const { return *attn_; }
  const __nv_bfloat16* attention_output() const { return o_; }  // O of the last launch [B, Hq*D]
  int grid() const { return grid_; }
  int blocks_per_sm() const { return blocks_per_sm_; }
  int smem_bytes() const { return smem_; }
  int64_t weight_bytes() const;  // Wo's bytes

 private:
  DecodeAttentionShape shape_;
  int64_t hidden_ = 0;
  std::unique_ptr<DecodeAttention> attn_;
  AttentionOprojGraph g_;
  Schedule sched_;
  std::unique_ptr<runtime::DevicePlan> plan_;
  __nv_bfloat16* o_ = nullptr;
  float* ws_ = nullptr;  // split-K accumulator [B, hidden], zero between launches
  size_t ws_bytes_ = 0;
  int grid_ = 0, blocks_per_sm_ = 0, smem_ = 0;
  bool residual_ = false;
  uint32_t spin_limit_ = 0, delay_ns_ = 0;
};

}  // namespace tw
