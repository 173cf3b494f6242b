// Attention -> o_proj in one executor launch: validation, the attention plan for the executor's
// grid, graph, schedule and counters, and the launch of attention_oproj_kernel.cuh.
#include "tileweave/ops/attention_oproj.hpp"

#include <algorithm>
#include <string>

#include "attention_oproj_kernel.cuh"
#include "tileweave/order/orders.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace tw {

namespace {

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("attention+o_proj: " + what); }

void check_ptr(const void* p, const char* name) {
  if (!p) bad(std::string(name) + " is null");
  if (reinterpret_cast<uintptr_t>(p) % 16) bad(std::string(name) + " is not 16-byte aligned");
}

bool small_batch(const Tiling& t) { return t.bn == 16; }  // attention_oproj_tiling's two shapes

detail::AttentionOprojKernel pick_kernel(const DecodeAttentionShape& s, const Tiling& t) {
  const int g = s.num_q_heads / s.num_kv_heads;
  const bool paged = s.layout == KvLayout::Paged;
  return s.head_dim == 64 ? detail::attention_oproj_kernel_d64(g, paged, small_batch(t))
                          : detail::attention_oproj_kernel_d128(g, paged, small_batch(t));
}

}  // namespace

AttentionOproj::AttentionOproj(const DecodeAttentionShape& shape, int64_t hidden, std::vector<int> seq_lens,
                               std::vector<int> page_table, const AttentionOprojOptions& opt)
    : shape_(shape), hidden_(hidden), residual_(opt.residual), spin_limit_(opt.spin_limit), delay_ns_(opt.delay_ns) {
  // Host checks first: nothing touches the GPU before the shape, lengths and options are valid.
  validate_decode_attention(shape_, seq_lens, page_table);
  const int group = shape_.num_q_heads / shape_.num_kv_heads;
  if (group != 1 && group != 2 && group != 4 && group != 8)
    bad("GQA group " + std::to_string(group) + " (num_q_heads / num_kv_heads) is not 1, 2, 4 or 8 (the instantiated kernels)");
  if (shape_.head_dim != 64 && shape_.head_dim != 128)
    bad("head_dim " + std::to_string(shape_.head_dim) + " is not 64 or 128 (the instantiated kernels)");
  if (shape_.kv_load == KvLoad::Bulk) bad("kv_load Bulk is not instantiated here (the tiles stream K/V with cp.async)");
  if (shape_.overlap_previous) bad("overlap_previous is a DecodeAttention launch option, not one of this kernel's");
  shape_.kv_load = KvLoad::CpAsync;
  if (opt.blocks_per_sm < 0 || opt.blocks_per_sm > 2)
    bad("blocks_per_sm " + std::to_string(opt.blocks_per_sm) + " is outside [0, 2]");
  blocks_per_sm_ = opt.blocks_per_sm ? opt.blocks_per_sm : 2;
  if (shape_.tiles_per_sm == 0) shape_.tiles_per_sm = blocks_per_sm_;
  const Tiling tiling = attention_oproj_tiling(shape_, hidden_, opt.split_k);

  attn_ = std::make_unique<DecodeAttention>(shape_, std::move(seq_lens), std::move(page_table));
  g_ = build_attention_oproj_graph(shape_, attn_->seq_lens(), attn_->page_table(), attn_->plan(), hidden_, tiling,
                                   residual_);
  const TileGraph& G = g_.graph;
  sched_ = make_order(G, opt.order);
  const ExecPlan plan = make_exec_plan(G, sched_);  // validates the schedule (a topological order)

  // One block shape for both tile bodies: the larger shared memory of the two, and the grid no
  // larger than what is resident at once (the no-deadlock argument needs every block running).
  const detail::AttentionOprojKernel k = pick_kernel(shape_, tiling);
  smem_ = std::max(attn_->smem_bytes(), k.gemm_smem);
  int dev = 0, sms = 0, fit = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TW_CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_));
  TW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k.fn, kernels::sm80::kThreads, smem_));
  if (fit < blocks_per_sm_)
    bad("blocks_per_sm " + std::to_string(blocks_per_sm_) + " does not fit: " + std::to_string(fit) +
        " blocks of " + std::to_string(smem_) + " B shared memory are resident per SM");
  grid_ = sms * blocks_per_sm_;

  plan_ = std::make_unique<runtime::DevicePlan>(plan);
  const int64_t qd = int64_t(shape_.num_q_heads) * shape_.head_dim;
  TW_CUDA_CHECK(cudaMalloc(&o_, sizeof(__nv_bfloat16) * shape_.batch * qd));
  // Zeroed once: each launch's last slice leaves its part zero again.
  ws_bytes_ = tiling.split_k > 1 ? sizeof(float) * shape_.batch * hidden_ : 0;
  if (ws_bytes_) {
    TW_CUDA_CHECK(cudaMalloc(&ws_, ws_bytes_));
    TW_CUDA_CHECK(cudaMemset(ws_, 0, ws_bytes_));
  }
}

AttentionOproj::~AttentionOproj() {
  cudaFree(o_);
  cudaFree(ws_);
}

int64_t AttentionOproj::weight_bytes() const {
  return hidden_ * shape_.num_q_heads * shape_.head_dim * int64_t(sizeof(__nv_bfloat16));
}

void AttentionOproj::reset() {
  plan_->reset();
  attn_->reset_merge_counts();
  if (ws_bytes_) TW_CUDA_CHECK(cudaMemset(ws_, 0, ws_bytes_));
}

void AttentionOproj::run(const AttentionOprojTensors& t, cudaStream_t stream) const {
  check_ptr(t.w_o, "w_o");
  check_ptr(t.y, "y");
  if (residual_) check_ptr(t.residual, "residual");
  if (!residual_ && t.residual) bad("a residual was given, but the op was built without one (options.residual)");
  // Checks q, k_new, v_new and the caches (null, misaligned) before the launch.
  const kernels::DecodeParams ap = attn_->device_params({t.q, t.k_new, t.v_new, t.k_cache, t.v_cache, o_});
  const Op& op = g_.graph.op(g_.op_oproj);
  const Tile& first = g_.graph.tile(op.first_tile);
  const detail::OprojArgs args{o_,   t.w_o, t.residual, t.y, ws_, op.m, op.n, op.k, first.k1 - first.k0,
                               static_cast<int32_t>(op.tiling.split_k)};
  const detail::AttentionOprojKernel k = pick_kernel(shape_, op.tiling);
  k.fn<<<grid_, kernels::sm80::kThreads, smem_, stream>>>(plan_->params(spin_limit_, delay_ns_), ap, args);
  TW_CUDA_CHECK_LAUNCH();
}

}  // namespace tw
