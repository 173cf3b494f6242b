// The attention half of a diffusion transformer block in one launch of the tile executor (issue 20
// item 4): x -> QKV projection, whose epilogue adds the bias, normalizes q and k per head (RMSNorm
// over the head dim) and rotates them (RoPE from a table of each token's frequencies) -> prefill
// attention over the whole sequence -> output projection. The tile graph is
// build_dit_attention_graph's (graph/dit_graph.hpp); one persistent kernel (src/ops/dit_chain.cu)
// takes its tickets in schedule order and runs each tile by its op kind: a GEMM tile (128 tokens x one
// head, TMA + wgmma) or an attention item (the prefill kernel's tile body,
// kernels/attention/prefill_sm90.cuh), with tile counters in place of kernel boundaries. K is
// normalized and rotated once, by the QKV tile that computes it. docs/prefill_attention.md, "The DiT
// chain on the executor".
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "tileweave/graph/dit_graph.hpp"
#include "tileweave/order/schedule.hpp"

namespace tw {

namespace runtime {
class DevicePlan;
}

struct DitChainOptions {
  float eps = 1e-6f;              // the q / k RMSNorm's epsilon
  // RoPE pairs: false, rotate-half (dimension i with i + D/2, as Llama and SD3); true, adjacent
  // pairs (2i, 2i + 1: the complex form of FLUX and Qwen-Image). Either way the table row of a token
  // holds the cosines of its D/2 frequencies, then their sines.
  bool rope_interleaved = false;
  std::string order;              // a make_order spec; empty: dit_chain_order (graph/dit_graph.hpp)
  int order_lag = -1;             // dit_chain_order's lag in tickets; -1: one wave (the SMs)
  uint32_t spin_limit = 0;        // > 0: a dependency wait gives up after this many polls (tests)
};

struct DitChainTensors {
  const __nv_bfloat16* x = nullptr;         // [L, W] the block's (normalized, modulated) input
  const __nv_bfloat16* w_qkv = nullptr;     // [3W, W] rows: q heads, k heads, v heads
  const __nv_bfloat16* qkv_bias = nullptr;  // optional [3W]
  const __nv_bfloat16* q_norm = nullptr;    // [D] RMSNorm weight of q (every head)
  const __nv_bfloat16* k_norm = nullptr;    // [D]
  const float* rope = nullptr;              // [L, D]: cos of the token's D/2 frequencies, then their sin
  const __nv_bfloat16* w_o = nullptr;       // [W, W]
  const __nv_bfloat16* o_bias = nullptr;    // optional [W]
  __nv_bfloat16* y = nullptr;               // [L, W]
};

class DitAttentionChain {
 public:
  // Plans the graph and the schedule and uploads them; allocates the intermediates q|k|v [L, 3W] and
  // the attention's output [L, W]. InvalidArgument names a bad shape (head_dim other than 128, causal
  // or fp8: the chain runs the bf16 non-causal attention of DiTs) or order; CudaError without sm_90a.
  DitAttentionChain(const DitAttentionShape& shape, const DitChainOptions& opt = {});
  ~DitAttentionChain();
  DitAttentionChain(const DitAttentionChain&) = delete;
  DitAttentionChain& operator=(const DitAttentionChain&) = delete;

  // One launch on `stream`; capturable in a CUDA graph. Launches of one object run on one stream at a
  // time (they share the counters and intermediates). InvalidArgument on a null or misaligned tensor.
  void run(const DitChainTensors& t, cudaStream_t stream) const;

  const DitAttentionShape& shape() const { return shape_; }
  const DitAttentionGraph& graph() const { return g_; }
  const Schedule& schedule() const { return sched_; }
  // The intermediates of the last run: q (normalized, rotated) | k (the same) | v, and the attention.
  const __nv_bfloat16* qkv() const { return qkv_; }
  const __nv_bfloat16* attention_out() const { return attn_; }
  double flops() const;  // the two GEMMs' and the attention's (4 L^2 D H)
  // Tile timelines (DevicePlan::enable_trace): each later launch records every tile's; plan().read_trace().
  void enable_trace();
  const runtime::DevicePlan& plan() const { return *plan_; }
  uint32_t error() const;  // synchronises; nonzero if a bounded wait expired (spin_limit)

 private:
  DitAttentionShape shape_;
  DitChainOptions opt_;
  DitAttentionGraph g_;
  Schedule sched_;
  std::unique_ptr<runtime::DevicePlan> plan_;
  int sms_ = 0;
  __nv_bfloat16* qkv_ = nullptr;
  __nv_bfloat16* attn_ = nullptr;
  int* d_cu_ = nullptr;     // {0, L}
  int* d_tiles_ = nullptr;  // the attention's items {seq, q_tile, kv_tiles}
  int num_attn_tiles_ = 0;
};

}  // namespace tw
