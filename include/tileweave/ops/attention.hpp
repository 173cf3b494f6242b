// Decode attention: one query token per sequence against its KV cache, split-KV (flash-decoding)
// with the KV bytes cut evenly over the GPU (stream-K), GQA, fused RoPE on q and the new k, and the
// append of the new k/v into the cache, all in one launch. Contiguous [B, Hkv, S, D] or paged
// [num_pages, Hkv, page_size, D] caches, a length per sequence. The device tiles live in
// kernels/attention/decode.cuh; docs/attention.md has the design.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tileweave/graph/attention_graph.hpp"  // shape, plan, tile list (host); tw::InvalidArgument
#include "tileweave/kernels/attention/decode_params.hpp"

namespace tw {

struct DecodeAttentionTensors {
  const __nv_bfloat16* q = nullptr;      // [B, Hq, D], before RoPE
  const __nv_bfloat16* k_new = nullptr;  // [B, Hkv, D], before RoPE (only with append)
  const __nv_bfloat16* v_new = nullptr;  // [B, Hkv, D] (only with append)
  __nv_bfloat16* k_cache = nullptr;      // 16-byte aligned
  __nv_bfloat16* v_cache = nullptr;
  __nv_bfloat16* out = nullptr;          // [B, Hq, D]
  // Only for a plan made without lengths (DecodeAttention(shape)): int32 on the device, read at run
  // time -- seq_lens [B] (each cache after the append), page_table [B, pages_per_seq] when paged.
  const int* seq_lens = nullptr;
  const int* page_table = nullptr;
};

// RoPE frequencies as the kernel uses them: inv_freq[i] = float(theta^(-2i/D)), i < D/2; the angle
// is float(pos) * inv_freq[i] in fp32 (HF Llama's convention).
std::vector<float> rope_inv_freq(int head_dim, float theta);

class DecodeAttention {
 public:
  // Validates the shape, lengths and page table (tw::InvalidArgument naming the bad value, before
  // anything touches the GPU), plans the tiles for the current device, uploads the plan and the
  // page table and allocates the workspace. seq_lens[b] counts the cache after the append: the new
  // token sits at position seq_lens[b] - 1.
  DecodeAttention(const DecodeAttentionShape& shape, std::vector<int> seq_lens, std::vector<int> page_table = {});
  // Lengths (and the page table) on the device, given to each run (DecodeAttentionTensors): one plan
  // for every length, and CUDA-graph replays see the lengths of the moment. Planned as if every cache
  // were full (the kernel's warps, ring and grid); each launch starts with a one-block kernel that
  // checks the lengths and the page ids in use and cuts the work for them (decode_cut). Bad values
  // there cannot throw: the launch writes NaN to out, leaves the caches alone and keeps the first bad
  // value for take_device_error().
  explicit DecodeAttention(const DecodeAttentionShape& shape);
  ~DecodeAttention();
  DecodeAttention(const DecodeAttention&) = delete;
  DecodeAttention& operator=(const DecodeAttention&) = delete;

  // One launch (merges included). Capturable in a CUDA graph; runs on one stream at a time (the
  // workspace is shared).
  void run(const DecodeAttentionTensors& t, cudaStream_t stream) const;

  // The few-token path (plan().few_tokens, decode_few_tokens): run launches one block per (sequence,
  // KV head) pair (kernels/attention/decode_short.cuh) instead of the stream-K tiles. Never with
  // lengths on the device. The members below that describe tiles (tiles(), smem_bytes(),
  // ring_slots(), warps_per_tile(), device_params) describe the stream-K plan either way.
  bool few_tokens() const { return few_; }

  // For the executor: the device parameters, the tile list and the shared memory a tile needs.
  kernels::DecodeParams device_params(const DecodeAttentionTensors& t) const;
  std::vector<DecodeTileDesc> tiles() const;
  int smem_bytes() const { return smem_; }
  // Zeroes the merge counters (each launch leaves them zero; an executor launch that aborted
  // before running every tile may not).
  void reset_merge_counts();
  // Every later launch stamps its tiles' timeline into trace [num_tiles][kDecodeTraceWords] (device
  // memory; decode_params.hpp names the words); nullptr turns it off. For bench_attention_trace.
  void set_trace(unsigned long long* trace) { trace_ = trace; }

  bool device_lengths() const { return device_lengths_; }
  // Lengths on the device: what the launches since the last call found wrong, naming the first bad
  // value ("" if nothing), and clears it. Synchronises the device.
  std::string take_device_error();

  const DecodePlan& plan() const { return plan_; }  // with device lengths: the plan for full caches
  const std::vector<int>& seq_lens() const { return seq_lens_; }
  const std::vector<int>& page_table() const { return page_table_; }
  int num_tiles() const { return few_ ? shape_.batch * shape_.num_kv_heads : plan_.num_tiles; }  // blocks of run's launch
  int ring_slots() const { return slots_; }
  int warps_per_tile() const { return warps_; }  // 8 at one tile per SM (cp.async), else 4
  int64_t kv_bytes() const;  // K and V bytes the launch reads (device lengths: of full caches)
  bool bulk_copy() const { return bulk_; }  // the KvLoad chosen
  const DecodeAttentionShape& shape() const { return shape_; }

 private:
  DecodeAttention(const DecodeAttentionShape& shape, std::vector<int> seq_lens, std::vector<int> page_table,
                  bool device_lengths);
  kernels::DecodeShortParams short_params(const kernels::DecodeParams& p) const;

  DecodeAttentionShape shape_;
  std::vector<int> seq_lens_, page_table_;
  DecodePlan plan_;
  int group_ = 1, slots_ = 0, smem_ = 0, warps_ = 4, merge_stage_ = 0;
  bool bulk_ = false, device_lengths_ = false, hopper_ = false, few_ = false;
  int short_smem_ = 0;  // the few-token kernel's shared memory (its longest pair)
  int* d_page_table_ = nullptr;
  float* d_inv_freq_ = nullptr;  // RoPE frequencies (rope_theta > 0)
  int* d_pair_info_ = nullptr;
  int* d_tile_first_ = nullptr;
  float* d_o_part_ = nullptr;
  float* d_lse_part_ = nullptr;
  int* d_merge_count_ = nullptr;
  int* d_cut_ = nullptr;  // device lengths: {tiles, units} of the launch, then {kind, index, value} of a bad input
  unsigned long long* trace_ = nullptr;
  std::vector<float> inv_freq_;
};

}  // namespace tw
