// Decode attention: one query token per sequence against its KV cache, split-KV (flash-decoding)
// with GQA, fused RoPE on q and the new k, and the append of the new k/v into the cache, all in one
// launch. Contiguous [B, Hkv, S, D] or paged [num_pages, Hkv, page_size, D] caches, a length per
// sequence. The device tiles live in kernels/attention/decode.cuh; docs/attention.md has the design.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "tileweave/graph/tile_graph.hpp"  // tw::InvalidArgument
#include "tileweave/kernels/attention/decode_params.hpp"

namespace tw {

enum class KvLayout { Contiguous, Paged };
// How K/V stream into shared memory: 16-byte cp.async (sm_80+) or Hopper bulk copies (sm_90).
enum class KvLoad { Auto, CpAsync, Bulk };
// Which tokens a split reads: a contiguous range, or every n-th 64-token block (n = splits of the
// sequence), so that all splits of a sequence stream one dense window of the cache together.
enum class SplitLayout { Auto, Contiguous, Interleaved };

struct DecodeAttentionShape {
  int batch = 1;
  int num_q_heads = 32, num_kv_heads = 8;  // num_q_heads / num_kv_heads in 1..8 (GQA group)
  int head_dim = 128;                      // 64 or 128
  KvLayout layout = KvLayout::Contiguous;
  int64_t max_seq_len = 0;                 // contiguous: S of [B, Hkv, S, D]
  int page_size = 0;                       // paged: a multiple of 16 (16..256 typical)
  int num_pages = 0;                       // paged: pages in the pool
  int pages_per_seq = 0;                   // paged: row length of the page table [B, pages_per_seq]
  float scale = 0.f;                       // softmax scale; 0: 1/sqrt(head_dim)
  float rope_theta = 10000.f;              // rotate-half RoPE base; <= 0: no RoPE
  bool append = true;                      // false: the cache already holds all seq_lens[b] tokens
  int split_tokens = 0;                    // tokens per split (a multiple of 64); 0: planned
  KvLoad kv_load = KvLoad::Auto;
  SplitLayout split_layout = SplitLayout::Auto;
};

struct DecodeAttentionTensors {
  const __nv_bfloat16* q = nullptr;      // [B, Hq, D], before RoPE
  const __nv_bfloat16* k_new = nullptr;  // [B, Hkv, D], before RoPE (only with append)
  const __nv_bfloat16* v_new = nullptr;  // [B, Hkv, D] (only with append)
  __nv_bfloat16* k_cache = nullptr;      // 16-byte aligned
  __nv_bfloat16* v_cache = nullptr;
  __nv_bfloat16* out = nullptr;          // [B, Hq, D]
};

// A unit of executor work. Partial tiles depend on nothing (the one holding the new token appends
// it before reading); the merge tile of (b, hkv) depends on that pair's partial tiles. A sequence
// with a single split has no merge tile: its partial tile writes the output.
struct DecodeTileDesc {
  bool merge = false;
  int b = 0, hkv = 0, split = 0;
  std::vector<int> deps;  // indices into the same tile list
};

// RoPE frequencies as the kernel uses them: inv_freq[i] = float(theta^(-2i/D)), i < D/2; the angle
// is float(pos) * inv_freq[i] in fp32 (HF Llama's convention).
std::vector<float> rope_inv_freq(int head_dim, float theta);

// Tokens per split: the multiple of 64 minimising (waves of tiles) x (tokens per tile + overhead)
// over `slots` co-resident tiles, so 1 x 128k and 64 x 512 both fill the GPU.
int plan_split_tokens(const std::vector<int>& seq_lens, int num_kv_heads, int slots);

class DecodeAttention {
 public:
  // Validates the shape, lengths and page table (tw::InvalidArgument naming the bad value, before
  // anything touches the GPU), plans the splits for the current device, uploads lengths and page
  // table and allocates the split workspace. seq_lens[b] counts the cache after the append: the new
  // token sits at position seq_lens[b] - 1.
  DecodeAttention(const DecodeAttentionShape& shape, std::vector<int> seq_lens, std::vector<int> page_table = {});
  ~DecodeAttention();
  DecodeAttention(const DecodeAttention&) = delete;
  DecodeAttention& operator=(const DecodeAttention&) = delete;

  // One launch: partial tiles, and the last partial tile of each split sequence merges. Capturable
  // in a CUDA graph; runs on one stream at a time (the workspace is shared).
  void run(const DecodeAttentionTensors& t, cudaStream_t stream) const;

  // For the executor: the device parameters and the tile list (partial + merge tiles).
  kernels::DecodeParams device_params(const DecodeAttentionTensors& t) const;
  std::vector<DecodeTileDesc> tiles() const;

  int split_tokens() const { return split_tokens_; }
  int max_splits() const { return max_splits_; }
  int num_splits(int b) const { return kernels::decode_num_splits(seq_lens_.at(b), split_tokens_); }
  int64_t kv_bytes() const;  // K and V bytes the launch reads
  bool bulk_copy() const { return bulk_; }  // the KvLoad chosen
  bool interleaved() const { return interleave_; }  // the SplitLayout chosen
  const DecodeAttentionShape& shape() const { return shape_; }

 private:
  DecodeAttentionShape shape_;
  std::vector<int> seq_lens_, page_table_;
  int group_ = 1, split_tokens_ = 0, max_splits_ = 0;
  bool bulk_ = false, interleave_ = false;
  int* d_seq_lens_ = nullptr;
  int* d_page_table_ = nullptr;
  float* d_o_part_ = nullptr;
  float* d_lse_part_ = nullptr;
  int* d_merge_count_ = nullptr;
  std::vector<float> inv_freq_;
};

}  // namespace tw
