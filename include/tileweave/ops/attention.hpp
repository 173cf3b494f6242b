// Decode attention: one query token per sequence against its KV cache, split-KV (flash-decoding)
// with the KV bytes cut evenly over the GPU (stream-K), GQA, fused RoPE on q and the new k, and the
// append of the new k/v into the cache, all in one launch. Contiguous [B, Hkv, S, D] or paged
// [num_pages, Hkv, page_size, D] caches, a length per sequence. The device tiles live in
// kernels/attention/decode.cuh; docs/attention.md has the design.
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
  // Overrides of the plan (0: planned): work tiles (blocks of one launch, <= kDecodeMaxTiles),
  // tiles per SM the plan aims for, and 16-token stages in flight per warp (1..kDecodeMaxSlots).
  int num_tiles = 0;
  int tiles_per_sm = 0;
  int ring_slots = 0;
  KvLoad kv_load = KvLoad::Auto;
};

struct DecodeAttentionTensors {
  const __nv_bfloat16* q = nullptr;      // [B, Hq, D], before RoPE
  const __nv_bfloat16* k_new = nullptr;  // [B, Hkv, D], before RoPE (only with append)
  const __nv_bfloat16* v_new = nullptr;  // [B, Hkv, D] (only with append)
  __nv_bfloat16* k_cache = nullptr;      // 16-byte aligned
  __nv_bfloat16* v_cache = nullptr;
  __nv_bfloat16* out = nullptr;          // [B, Hq, D]
};

// A unit of executor work: work tile `tile` (kernels::decode_work_tile). Tiles depend on nothing
// and never wait for each other. The output rows of pair i = b * Hkv + h (query heads h * G ..
// h * G + G - 1 of sequence b) are written by the tile that holds the pair whole, or by whichever
// of the tiles holding a part of it finishes last: a consumer of those rows depends on every tile
// with pair_begin <= i < pair_end.
struct DecodeTileDesc {
  int tile = 0;
  int pair_begin = 0, pair_end = 0;
};

// The stream-K plan (kernels/attention/decode_params.hpp): pair_info [npairs + 1] and
// tile_first [num_tiles] as the kernel reads them.
struct DecodePlan {
  int num_tiles = 0, total_units = 0;
  std::vector<int> pair_info;   // {first unit, sequence length} per pair, flattened int2
  std::vector<int> tile_first;  // {pair, its first unit, its end unit, its length} per tile, flattened int4
};
DecodePlan plan_decode(const std::vector<int>& seq_lens, int num_kv_heads, int num_tiles);

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
  ~DecodeAttention();
  DecodeAttention(const DecodeAttention&) = delete;
  DecodeAttention& operator=(const DecodeAttention&) = delete;

  // One launch (merges included). Capturable in a CUDA graph; runs on one stream at a time (the
  // workspace is shared).
  void run(const DecodeAttentionTensors& t, cudaStream_t stream) const;

  // For the executor: the device parameters, the tile list and the shared memory a tile needs.
  kernels::DecodeParams device_params(const DecodeAttentionTensors& t) const;
  std::vector<DecodeTileDesc> tiles() const;
  int smem_bytes() const { return smem_; }

  int num_tiles() const { return plan_.num_tiles; }
  int ring_slots() const { return slots_; }
  int64_t kv_bytes() const;  // K and V bytes the launch reads
  bool bulk_copy() const { return bulk_; }  // the KvLoad chosen
  const DecodeAttentionShape& shape() const { return shape_; }

 private:
  DecodeAttentionShape shape_;
  std::vector<int> seq_lens_, page_table_;
  DecodePlan plan_;
  int group_ = 1, slots_ = 0, smem_ = 0;
  bool bulk_ = false;
  int* d_page_table_ = nullptr;
  int* d_pair_info_ = nullptr;
  int* d_tile_first_ = nullptr;
  float* d_o_part_ = nullptr;
  float* d_lse_part_ = nullptr;
  int* d_merge_count_ = nullptr;
  std::vector<float> inv_freq_;
};

}  // namespace tw
