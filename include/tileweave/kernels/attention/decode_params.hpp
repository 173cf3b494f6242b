// Parameters of split-KV decode attention, shared by the host op (ops/attention.hpp), the device
// tiles (kernels/attention/decode.cuh) and the executor. Plain C++17: pointers and sizes only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace tw::kernels {

constexpr int kDecodeMaxGroup = 8;     // query heads per KV head: the 8 rows of an mma tile that hold heads
constexpr int kDecodeStageTokens = 16; // tokens per smem stage = the k extent of one P.V mma
constexpr int kDecodeWarps = 4;        // warps per tile; each streams its own stages
constexpr int kDecodeThreads = kDecodeWarps * 32;
constexpr int kDecodeMaxSplits = 512;  // bounds the merge tile's smem (weights [splits][group])

struct DecodeParams {
  // The new token: q [B, Hq, D], k_new / v_new [B, Hkv, D] (k_new == nullptr: no append, no RoPE on k).
  const __nv_bfloat16* q = nullptr;
  const __nv_bfloat16* k_new = nullptr;
  const __nv_bfloat16* v_new = nullptr;
  // KV cache. Contiguous: [B, Hkv, max_seq_len, D]. Paged: [num_pages, Hkv, page_size, D] with
  // page_table [B, pages_per_seq] (the HND layout: one page of one head is contiguous).
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  const int* page_table = nullptr;  // nullptr: contiguous
  int64_t max_seq_len = 0;
  int page_size = 0, pages_per_seq = 0;
  // seq_lens[b] counts the cache after the append: the new token sits at position seq_lens[b] - 1.
  const int* seq_lens = nullptr;
  __nv_bfloat16* out = nullptr;  // [B, Hq, D]
  // Workspace for split sequences: o_part [B, Hkv, max_splits, group, D] (normalised partial
  // outputs), lse_part [B, Hkv, max_splits, group] (log2-domain), merge_count [B, Hkv] (zero between
  // launches; the standalone kernel's last split block resets it).
  float* o_part = nullptr;
  float* lse_part = nullptr;
  int* merge_count = nullptr;
  int batch = 0, num_kv_heads = 0;
  int split_tokens = 0;  // tokens per split, a multiple of kDecodeStageTokens * kDecodeWarps
  int max_splits = 0;    // splits of the longest sequence (workspace stride)
  bool interleave = false;  // splits take every n-th 64-token block instead of a contiguous range
  float scale_log2 = 0;    // softmax scale * log2(e)
  bool rope = false;
  float inv_freq[64] = {};  // RoPE (rotate-half): angle_i = float(pos) * inv_freq[i], i < D/2
};

#ifdef __CUDACC__
#define TW_DECODE_HD __host__ __device__
#else
#define TW_DECODE_HD
#endif
TW_DECODE_HD inline int decode_num_splits(int seq_len, int split_tokens) {
  return (seq_len + split_tokens - 1) / split_tokens;
}
#undef TW_DECODE_HD

}  // namespace tw::kernels
