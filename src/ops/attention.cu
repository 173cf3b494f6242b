// The standalone decode-attention op: host-side validation, split planning and the launch of the
// kernel in attention_kernel.cuh.
#include "tileweave/ops/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_kernel.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw {

using kernels::DecodeParams;

namespace {

// KvLoad::Auto on sm_90: bulk copies (true) or cp.async (false). Measured on the H200 (2026-11-22,
// bench_attention variants): bulk copies 3-8% faster on every case, paged too.
constexpr bool kAutoBulk = true;
// SplitLayout::Auto: interleaved (true) or contiguous splits, likewise.
constexpr bool kAutoInterleave = false;

// The kernel for a shape (instantiated in attention_d64.cu / attention_d128.cu).
detail::DecodeKernel pick_kernel(int d, int g, bool paged, bool bulk) {
  return d == 64 ? detail::decode_kernel_d64(g, paged, bulk) : detail::decode_kernel_d128(g, paged, bulk);
}

int smem_bytes(int d) { return d == 64 ? kernels::decode_smem_bytes<64>() : kernels::decode_smem_bytes<128>(); }

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("decode attention: " + what); }

void validate(const DecodeAttentionShape& s, const std::vector<int>& lens, const std::vector<int>& table) {
  if (s.batch < 1) bad("batch " + std::to_string(s.batch) + " must be >= 1");
  if (s.num_kv_heads < 1) bad("num_kv_heads " + std::to_string(s.num_kv_heads) + " must be >= 1");
  if (s.num_q_heads < 1 || s.num_q_heads % s.num_kv_heads != 0)
    bad("num_q_heads " + std::to_string(s.num_q_heads) + " is not a multiple of num_kv_heads " +
        std::to_string(s.num_kv_heads));
  const int group = s.num_q_heads / s.num_kv_heads;
  if (group > kernels::kDecodeMaxGroup)
    bad("group size " + std::to_string(group) + " (num_q_heads / num_kv_heads) exceeds 8");
  if (s.head_dim != 64 && s.head_dim != 128) bad("head_dim " + std::to_string(s.head_dim) + " is not 64 or 128");
  constexpr int kUnit = kernels::kDecodeStageTokens * kernels::kDecodeWarps;
  if (s.split_tokens < 0 || s.split_tokens % kUnit != 0)
    bad("split_tokens " + std::to_string(s.split_tokens) + " is not a multiple of " + std::to_string(kUnit));
  if (int64_t(lens.size()) != s.batch)
    bad("seq_lens has " + std::to_string(lens.size()) + " entries for batch " + std::to_string(s.batch));
  for (int b = 0; b < s.batch; ++b)
    if (lens[b] < 1)
      bad("seq_lens[" + std::to_string(b) + "] = " + std::to_string(lens[b]) +
          ": a sequence holds at least the new token");
  const int max_len = *std::max_element(lens.begin(), lens.end());
  if (s.split_tokens > 0 && kernels::decode_num_splits(max_len, s.split_tokens) > kernels::kDecodeMaxSplits)
    bad("split_tokens " + std::to_string(s.split_tokens) + " cuts seq_lens up to " + std::to_string(max_len) +
        " into more than " + std::to_string(kernels::kDecodeMaxSplits) + " splits");
  if (s.layout == KvLayout::Contiguous) {
    if (max_len > s.max_seq_len)
      bad("seq_lens up to " + std::to_string(max_len) + " exceed max_seq_len " + std::to_string(s.max_seq_len));
    if (!table.empty()) bad("a page table was given for a contiguous cache");
    return;
  }
  if (s.page_size < 16 || s.page_size % 16 != 0)
    bad("page_size " + std::to_string(s.page_size) + " is not a positive multiple of 16");
  if (s.num_pages < 1) bad("num_pages " + std::to_string(s.num_pages) + " must be >= 1");
  if (s.pages_per_seq < 1) bad("pages_per_seq " + std::to_string(s.pages_per_seq) + " must be >= 1");
  if (int64_t(table.size()) != int64_t(s.batch) * s.pages_per_seq)
    bad("page table has " + std::to_string(table.size()) + " entries, expected batch * pages_per_seq = " +
        std::to_string(int64_t(s.batch) * s.pages_per_seq));
  for (int b = 0; b < s.batch; ++b) {
    const int pages = (lens[b] + s.page_size - 1) / s.page_size;
    if (pages > s.pages_per_seq)
      bad("seq_lens[" + std::to_string(b) + "] = " + std::to_string(lens[b]) + " needs " + std::to_string(pages) +
          " pages, the page table has " + std::to_string(s.pages_per_seq) + " per sequence");
    for (int i = 0; i < pages; ++i) {
      const int page = table[int64_t(b) * s.pages_per_seq + i];
      if (page < 0 || page >= s.num_pages)
        bad("page_table[" + std::to_string(b) + "][" + std::to_string(i) + "] = " + std::to_string(page) +
            " is outside [0, " + std::to_string(s.num_pages) + ")");
    }
  }
}

template <class T>
T* device_copy(const std::vector<T>& h) {
  T* d = nullptr;
  TW_CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
  if (!h.empty()) TW_CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

std::vector<float> rope_inv_freq(int head_dim, float theta) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) f[i] = static_cast<float>(1.0 / std::pow(double(theta), 2.0 * i / head_dim));
  return f;
}

int plan_split_tokens(const std::vector<int>& seq_lens, int num_kv_heads, int slots) {
  constexpr int kUnit = kernels::kDecodeStageTokens * kernels::kDecodeWarps;
  // Measured on the H200 (bench_attention's split sweep): a tile costs ~64 tokens' worth beyond its
  // tokens, and each split of the longest sequence ~12 more on the merge's critical path.
  constexpr int64_t kTileOverhead = 64, kMergePerSplit = 12;
  const int max_len = *std::max_element(seq_lens.begin(), seq_lens.end());
  const int top = (max_len + kUnit - 1) / kUnit * kUnit;
  int lo = (kernels::decode_num_splits(max_len, kernels::kDecodeMaxSplits) + kUnit - 1) / kUnit * kUnit;
  lo = std::max(lo, kUnit);
  int best = top;
  int64_t best_cost = INT64_MAX;
  for (int chunk = lo; chunk <= std::max(lo, top); chunk += kUnit) {
    int64_t tiles = 0;
    for (int len : seq_lens) tiles += kernels::decode_num_splits(len, chunk);
    tiles *= num_kv_heads;
    const int64_t waves = (tiles + slots - 1) / slots;
    const int64_t cost = waves * (chunk + kTileOverhead) + kMergePerSplit * kernels::decode_num_splits(max_len, chunk);
    if (cost <= best_cost) {  // ties: the larger chunk (fewer merges)
      best_cost = cost;
      best = chunk;
    }
  }
  return best;
}

DecodeAttention::DecodeAttention(const DecodeAttentionShape& shape, std::vector<int> seq_lens,
                                 std::vector<int> page_table)
    : shape_(shape), seq_lens_(std::move(seq_lens)), page_table_(std::move(page_table)) {
  validate(shape_, seq_lens_, page_table_);
  group_ = shape_.num_q_heads / shape_.num_kv_heads;
  if (shape_.rope_theta > 0) inv_freq_ = rope_inv_freq(shape_.head_dim, shape_.rope_theta);

  int dev = 0, sms = 0, per_sm = 0, major = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (shape_.kv_load == KvLoad::Bulk && major < 9)
    bad("kv_load Bulk needs sm_90 (Hopper); this device is sm_" + std::to_string(major) + "x");
  bulk_ = shape_.kv_load == KvLoad::Bulk || (shape_.kv_load == KvLoad::Auto && major >= 9 && kAutoBulk);
  interleave_ = shape_.split_layout == SplitLayout::Interleaved ||
                (shape_.split_layout == SplitLayout::Auto && kAutoInterleave);
  const detail::DecodeKernel fn = pick_kernel(shape_.head_dim, group_, shape_.layout == KvLayout::Paged, bulk_);
  const int smem = smem_bytes(shape_.head_dim);
  TW_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  TW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, kernels::kDecodeThreads, smem));
  split_tokens_ = shape_.split_tokens > 0 ? shape_.split_tokens
                                          : plan_split_tokens(seq_lens_, shape_.num_kv_heads, sms * std::max(per_sm, 1));
  max_splits_ = kernels::decode_num_splits(*std::max_element(seq_lens_.begin(), seq_lens_.end()), split_tokens_);

  d_seq_lens_ = device_copy(seq_lens_);
  if (!page_table_.empty()) d_page_table_ = device_copy(page_table_);
  const int64_t slots = int64_t(shape_.batch) * shape_.num_kv_heads * max_splits_ * group_;
  TW_CUDA_CHECK(cudaMalloc(&d_o_part_, slots * shape_.head_dim * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&d_lse_part_, slots * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&d_merge_count_, int64_t(shape_.batch) * shape_.num_kv_heads * sizeof(int)));
  TW_CUDA_CHECK(cudaMemset(d_merge_count_, 0, int64_t(shape_.batch) * shape_.num_kv_heads * sizeof(int)));
}

DecodeAttention::~DecodeAttention() {
  cudaFree(d_seq_lens_);
  cudaFree(d_page_table_);
  cudaFree(d_o_part_);
  cudaFree(d_lse_part_);
  cudaFree(d_merge_count_);
}

int64_t DecodeAttention::kv_bytes() const {
  int64_t tokens = 0;
  for (int len : seq_lens_) tokens += len;
  return tokens * shape_.num_kv_heads * shape_.head_dim * 2 /*bytes*/ * 2 /*K and V*/;
}

kernels::DecodeParams DecodeAttention::device_params(const DecodeAttentionTensors& t) const {
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (!t.q || !t.k_cache || !t.v_cache || !t.out) bad("q, k_cache, v_cache and out must be device pointers");
  if (shape_.append && (!t.k_new || !t.v_new)) bad("append needs k_new and v_new");
  if (misaligned(t.k_cache) || misaligned(t.v_cache)) bad("k_cache and v_cache must be 16-byte aligned");
  if (misaligned(t.out) || misaligned(t.q)) bad("q and out must be 16-byte aligned");
  DecodeParams p;
  p.q = t.q;
  p.k_new = shape_.append ? t.k_new : nullptr;
  p.v_new = shape_.append ? t.v_new : nullptr;
  p.k_cache = t.k_cache;
  p.v_cache = t.v_cache;
  p.page_table = d_page_table_;
  p.max_seq_len = shape_.max_seq_len;
  p.page_size = shape_.page_size;
  p.pages_per_seq = shape_.pages_per_seq;
  p.seq_lens = d_seq_lens_;
  p.out = t.out;
  p.o_part = d_o_part_;
  p.lse_part = d_lse_part_;
  p.merge_count = d_merge_count_;
  p.batch = shape_.batch;
  p.num_kv_heads = shape_.num_kv_heads;
  p.split_tokens = split_tokens_;
  p.max_splits = max_splits_;
  p.interleave = interleave_;
  const float scale = shape_.scale > 0 ? shape_.scale : 1.f / std::sqrt(float(shape_.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.rope = shape_.rope_theta > 0;
  for (size_t i = 0; i < inv_freq_.size(); ++i) p.inv_freq[i] = inv_freq_[i];
  return p;
}

void DecodeAttention::run(const DecodeAttentionTensors& t, cudaStream_t stream) const {
  const DecodeParams p = device_params(t);
  const detail::DecodeKernel fn = pick_kernel(shape_.head_dim, group_, shape_.layout == KvLayout::Paged, bulk_);
  const dim3 grid(max_splits_, shape_.num_kv_heads, shape_.batch);
  fn<<<grid, kernels::kDecodeThreads, smem_bytes(shape_.head_dim), stream>>>(p);
  TW_CUDA_CHECK_LAUNCH();
}

std::vector<DecodeTileDesc> DecodeAttention::tiles() const {
  std::vector<DecodeTileDesc> out;
  for (int b = 0; b < shape_.batch; ++b)
    for (int h = 0; h < shape_.num_kv_heads; ++h) {
      const int n = num_splits(b);
      DecodeTileDesc merge{true, b, h, 0, {}};
      for (int s = 0; s < n; ++s) {
        merge.deps.push_back(static_cast<int>(out.size()));
        out.push_back({false, b, h, s, {}});
      }
      if (n > 1) out.push_back(std::move(merge));
    }
  return out;
}

}  // namespace tw
