// The standalone decode-attention op: host-side validation, the stream-K plan and the launch of the
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

// The defaults, from the H200 variants of bench_attention (2026-11-22); the tile count is the
// host planner's (plan_decode_for in graph/attention_graph.cpp):
// - KvLoad::Auto: cp.async. Bulk copies tie with it on the large cases and lose up to 8% on the
//   small ones (copy latency, and bank conflicts in the unswizzled ring).
// - One tile per SM (small work): kSmallSlots stages per warp (at most the tile's); 4 warps with
//   2 stages in flight read 1.5-3 points of the floor lower (bench_attention_trace, H200 2026-11-22:
//   B = 1, L = 32768 warps end at 35.8 us with 2 slots, 33.3 with 4).
// - Two tiles per SM: kStreamSlots stages per warp (all of them when a tile has <= kDeepSlots).
// - Warps per tile: 8 at one tile per SM (cp.async), 4 at two (their registers allow no more).
//   With 4 warps alone on an SM each scheduler has one warp, and its math and copy issue show:
//   8 warps (fewer stages each, as smem allows) read faster in an A/B build on the H200, back to
//   back: B = 16, L = 4096 64.4 against 65.2 us (62.5 against 64.5 overlapped), B = 1, L = 32768
//   37.6 against 39.1, L = 131072 129.9 against 132.4, B = 16, L = 4096 in 128-token pages 66.4
//   against 76.4 (`bench_attention_warps_ab.json`).
constexpr bool kAutoBulk = false;
constexpr int kSmallSlots = 4;
constexpr int kStreamSlots = 3;
constexpr int kDeepSlots = 4;

// The kernel for a shape (instantiated in attention_d64.cu / attention_d128.cu / attention_d256.cu).
detail::DecodeKernel pick_kernel(int d, int g, bool paged, bool bulk, int warps) {
  if (d == 64) return detail::decode_kernel_d64(g, paged, bulk, warps);
  return d == 128 ? detail::decode_kernel_d128(g, paged, bulk, warps) : detail::decode_kernel_d256(g, paged, bulk, warps);
}

detail::DecodeShortKernel pick_short_kernel(int d, int g, bool paged) {
  if (d == 64) return detail::decode_short_kernel_d64(g, paged);
  return d == 128 ? detail::decode_short_kernel_d128(g, paged) : detail::decode_short_kernel_d256(g, paged);
}

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("decode attention: " + what); }

// Lengths on the device: a tile takes at least this many 16-token units (fewer tiles at short
// contexts, where partials and merges cost more than the spread gains; the decode step's measured
// choice, decode_step_sm90.hpp).
constexpr int kDeviceMinUnits = 8;
constexpr int kCutThreads = 1024;

// A plan for lengths on the device is made for full caches (and any valid page table): the most work
// any launch may get.
std::vector<int> full_lengths(const DecodeAttentionShape& s) {
  if (s.batch < 1) bad("batch " + std::to_string(s.batch) + " must be >= 1");
  const bool paged = s.layout == KvLayout::Paged;
  const int64_t cap = paged ? int64_t(s.pages_per_seq) * s.page_size : s.max_seq_len;
  if (cap < 1 || cap > INT32_MAX)
    bad(std::string(paged ? "pages_per_seq x page_size" : "max_seq_len") + " = " + std::to_string(cap) +
        " tokens per sequence is outside [1, 2^31)");
  return std::vector<int>(s.batch, int(cap));
}
std::vector<int> any_page_table(const DecodeAttentionShape& s) {
  if (s.layout != KvLayout::Paged) return {};
  if (s.num_pages < 1) bad("num_pages " + std::to_string(s.num_pages) + " must be >= 1");
  std::vector<int> t(size_t(s.batch) * s.pages_per_seq);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int(i % size_t(s.num_pages));
  return t;
}

// Launched to overlap the kernel before on Hopper (which may write the lengths: read after the wait);
// the attention kernel after it may be scheduled at once, and waits for this one to finish.
__global__ void __launch_bounds__(kCutThreads) decode_cut_kernel(const __grid_constant__ kernels::DecodeCutArgs a) {
  runtime::grid_dependency_wait();
  runtime::allow_next_launch();
  kernels::decode_cut<kCutThreads>(a);
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

DecodeAttention::DecodeAttention(const DecodeAttentionShape& shape, std::vector<int> seq_lens,
                                 std::vector<int> page_table)
    : DecodeAttention(shape, std::move(seq_lens), std::move(page_table), /*device_lengths=*/false) {}

DecodeAttention::DecodeAttention(const DecodeAttentionShape& shape)
    : DecodeAttention(shape, full_lengths(shape), any_page_table(shape), /*device_lengths=*/true) {}

DecodeAttention::DecodeAttention(const DecodeAttentionShape& shape, std::vector<int> seq_lens,
                                 std::vector<int> page_table, bool device_lengths)
    : shape_(shape), seq_lens_(std::move(seq_lens)), page_table_(std::move(page_table)), device_lengths_(device_lengths) {
  validate_decode_attention(shape_, seq_lens_, page_table_);
  group_ = shape_.num_q_heads / shape_.num_kv_heads;
  if (shape_.rope_theta > 0) inv_freq_ = rope_inv_freq(shape_.head_dim, shape_.rope_theta);

  int dev = 0, sms = 0, major = 0, smem_sm = 0, smem_block = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (shape_.kv_load == KvLoad::Bulk && major < 9)
    bad("kv_load Bulk needs sm_90 (Hopper); this device is sm_" + std::to_string(major) + "x");
  if (shape_.kv_load == KvLoad::Bulk && (shape_.head_dim > 128 || group_ > 8))
    bad("kv_load Bulk is built for head_dim 64 / 128 and up to 8 query heads per KV head (head_dim " +
        std::to_string(shape_.head_dim) + ", " + std::to_string(group_) + " heads); CpAsync or Auto takes every shape");
  if (shape_.overlap_previous && major < 9)
    bad("overlap_previous needs sm_90 (Hopper); this device is sm_" + std::to_string(major) + "x");
  bulk_ = shape_.kv_load == KvLoad::Bulk || (shape_.kv_load == KvLoad::Auto && major >= 9 && kAutoBulk);
  hopper_ = major >= 9;

  // Tiles: every SM streams (tiles_per_sm blocks each), decode_tile_warps warps each.
  const bool paged = shape_.layout == KvLayout::Paged;
  const int slot_bytes_per_warp = 2 * kernels::kDecodeStageTokens * shape_.head_dim * 2;
  plan_ = plan_decode_for(shape_, seq_lens_, sms, device_lengths_);
  few_ = plan_.few_tokens;
  auto kernel_for = [&](int tiles_per_sm) {
    return pick_kernel(shape_.head_dim, group_, paged, bulk_, decode_tile_warps(shape_.head_dim, tiles_per_sm));
  };
  auto smem_cap_for = [&](int tiles_per_sm) { return std::min(smem_block, smem_sm / tiles_per_sm - 1024); };
  if (plan_.tiles_per_sm == 2 && shape_.tiles_per_sm == 0) {
    // Two tiles per SM that cannot hold one stage per warp each (head_dim 256 with many heads): one.
    const detail::DecodeKernel k2 = kernel_for(2);
    if (smem_cap_for(2) - k2.ring_offset < k2.warps * slot_bytes_per_warp) {
      DecodeAttentionShape one = shape_;
      one.tiles_per_sm = 1;
      plan_ = plan_decode_for(one, seq_lens_, sms, device_lengths_);
      plan_.few_tokens = few_;  // the override above is the stream-K plan's, not the caller's
    }
  }
  const int tiles_per_sm = plan_.tiles_per_sm;
  const int64_t npairs = int64_t(shape_.batch) * shape_.num_kv_heads;

  // Ring depth, capped by the smem of tiles_per_sm blocks per SM.
  const detail::DecodeKernel k = kernel_for(tiles_per_sm);
  warps_ = k.warps;
  const int slot_bytes = warps_ * slot_bytes_per_warp;
  const int smem_cap = smem_cap_for(tiles_per_sm);
  if (smem_cap - k.ring_offset < slot_bytes)
    bad("head_dim " + std::to_string(shape_.head_dim) + " with " + std::to_string(group_) + " query heads per KV head at " +
        std::to_string(tiles_per_sm) + " tiles per SM needs " + std::to_string(k.ring_offset + slot_bytes) +
        " bytes of shared memory per block; the GPU gives " + std::to_string(smem_cap));
  const int fit = std::min((smem_cap - k.ring_offset) / slot_bytes, kernels::kDecodeMaxSlots);
  const int per_warp = std::max(1, (plan_.total_units + plan_.num_tiles * warps_ - 1) / (plan_.num_tiles * warps_));
  if (shape_.ring_slots > 0) {
    slots_ = shape_.ring_slots;
  } else if (tiles_per_sm == 1) {
    slots_ = std::min(per_warp, kSmallSlots);
  } else {
    slots_ = per_warp <= kDeepSlots ? per_warp : kStreamSlots;
  }
  slots_ = std::min(slots_, fit);
  if (shape_.ring_slots > 0 && slots_ < shape_.ring_slots)
    bad("ring_slots " + std::to_string(shape_.ring_slots) + " needs more shared memory than " +
        std::to_string(smem_cap) + " bytes per block");
  // A merging tile stages its pair's partials past the ring where the SM has room (one tile per SM,
  // where pairs are few and cut widest; two share the SM): all of them at once for the pair cut over
  // the most tiles. (A plan for lengths on the device is made for full caches; a launch's own cut may
  // spread a pair wider, which then merges in more chunks.)
  const DecodePlanSummary parts = summarize_decode_plan(shape_, seq_lens_, plan_);
  const int ring_bytes = slots_ * slot_bytes;
  merge_stage_ = parts.split_pairs > 0 && tiles_per_sm == 1
                     ? int(std::clamp<int64_t>(parts.widest_merge_bytes + 64, ring_bytes, smem_cap - k.ring_offset))
                     : ring_bytes;
  smem_ = k.ring_offset + merge_stage_;
  // The device's limit, not smem_: ops with deeper rings share this kernel.
  TW_CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_block));

  if (!page_table_.empty()) d_page_table_ = device_copy(page_table_);
  if (!inv_freq_.empty()) d_inv_freq_ = device_copy(inv_freq_);
  d_pair_info_ = device_copy(plan_.pair_info);
  d_tile_first_ = device_copy(plan_.tile_first);
  const int64_t slots = int64_t(2) * plan_.num_tiles * group_;
  TW_CUDA_CHECK(cudaMalloc(&d_o_part_, slots * shape_.head_dim * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&d_lse_part_, slots * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&d_merge_count_, npairs * sizeof(int)));
  TW_CUDA_CHECK(cudaMemset(d_merge_count_, 0, npairs * sizeof(int)));
  if (device_lengths_) {
    TW_CUDA_CHECK(cudaMalloc(&d_cut_, 5 * sizeof(int)));
    TW_CUDA_CHECK(cudaMemset(d_cut_, 0, 5 * sizeof(int)));
  }
  if (few_) {
    // K/V of the longest pair's units after the block's own smem (the planner's one wave assumes
    // the shared memory of decode_short_blocks_per_sm blocks at 64 tokens fits an SM).
    const detail::DecodeShortKernel ks = pick_short_kernel(shape_.head_dim, group_, paged);
    const int longest = *std::max_element(seq_lens_.begin(), seq_lens_.end());
    short_smem_ = ks.kv_offset + kernels::decode_units(longest) * slot_bytes_per_warp;
    TW_CUDA_CHECK(cudaFuncSetAttribute(ks.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_block));  // shared by ops
  }
}

std::string DecodeAttention::take_device_error() {
  if (!device_lengths_) return "";
  int e[3] = {0, 0, 0};
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  TW_CUDA_CHECK(cudaMemcpy(e, d_cut_ + 2, sizeof e, cudaMemcpyDeviceToHost));
  if (e[0] == kernels::kDecodeInputOk) return "";
  TW_CUDA_CHECK(cudaMemset(d_cut_ + 2, 0, 3 * sizeof(int)));
  const int cap = seq_lens_[0];  // the plan's lengths: every cache full
  if (e[0] == kernels::kDecodeBadLength)
    return "decode attention: seq_lens[" + std::to_string(e[1]) + "] = " + std::to_string(e[2]) + " is outside [1, " +
           std::to_string(cap) + "] (the new token and the cache's capacity); that launch wrote NaN";
  const int pps = std::max(1, shape_.pages_per_seq);
  return "decode attention: page_table[" + std::to_string(e[1] / pps) + "][" + std::to_string(e[1] % pps) +
         "] = " + std::to_string(e[2]) + " is outside [0, " + std::to_string(shape_.num_pages) +
         "); that launch wrote NaN";
}

DecodeAttention::~DecodeAttention() {
  cudaFree(d_page_table_);
  cudaFree(d_inv_freq_);
  cudaFree(d_pair_info_);
  cudaFree(d_tile_first_);
  cudaFree(d_o_part_);
  cudaFree(d_lse_part_);
  cudaFree(d_merge_count_);
  cudaFree(d_cut_);
}

void DecodeAttention::reset_merge_counts() {
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  TW_CUDA_CHECK(cudaMemset(d_merge_count_, 0, int64_t(shape_.batch) * shape_.num_kv_heads * sizeof(int)));
}

int64_t DecodeAttention::kv_bytes() const { return decode_kv_bytes(shape_, seq_lens_); }

kernels::DecodeParams DecodeAttention::device_params(const DecodeAttentionTensors& t) const {
  auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
  if (!t.q || !t.k_cache || !t.v_cache || !t.out) bad("q, k_cache, v_cache and out must be device pointers");
  if (shape_.append && (!t.k_new || !t.v_new)) bad("append needs k_new and v_new");
  if (misaligned(t.k_cache) || misaligned(t.v_cache)) bad("k_cache and v_cache must be 16-byte aligned");
  if (misaligned(t.out) || misaligned(t.q)) bad("q and out must be 16-byte aligned");
  if (shape_.append && (misaligned(t.k_new) || misaligned(t.v_new))) bad("k_new and v_new must be 16-byte aligned");
  if (device_lengths_) {
    if (!t.seq_lens) bad("this plan takes its lengths at run time: seq_lens (int32 on the device) must be given");
    if (shape_.layout == KvLayout::Paged && !t.page_table)
      bad("this plan takes its page table at run time: page_table (int32 on the device) must be given");
  } else if (t.seq_lens || t.page_table) {
    bad("seq_lens / page_table given to a plan made for fixed lengths (DecodeAttention(shape) takes them at run time)");
  }
  DecodeParams p;
  p.q = t.q;
  p.k_new = shape_.append ? t.k_new : nullptr;
  p.v_new = shape_.append ? t.v_new : nullptr;
  p.k_cache = t.k_cache;
  p.v_cache = t.v_cache;
  p.page_table = device_lengths_ ? t.page_table : d_page_table_;
  p.max_seq_len = shape_.max_seq_len;
  p.page_size = shape_.page_size;
  p.pages_per_seq = shape_.pages_per_seq;
  p.out = t.out;
  p.pair_info = reinterpret_cast<const int2*>(d_pair_info_);
  p.tile_first = reinterpret_cast<const int4*>(d_tile_first_);
  p.num_tiles = plan_.num_tiles;
  p.total_units = plan_.total_units;
  const bool uniform = std::all_of(seq_lens_.begin(), seq_lens_.end(), [&](int l) { return l == seq_lens_[0]; });
  p.uniform_len = uniform && !device_lengths_ ? seq_lens_[0] : 0;
  p.cut = device_lengths_ ? d_cut_ : nullptr;
  p.num_kv_heads = shape_.num_kv_heads;
  p.group = group_;
  p.ring_slots = slots_;
  p.merge_stage_bytes = merge_stage_;
  p.o_part = d_o_part_;
  p.lse_part = d_lse_part_;
  p.merge_count = d_merge_count_;
  p.trace = trace_;
  p.overlap = shape_.overlap_previous;
  const float scale = shape_.scale > 0 ? shape_.scale : 1.f / std::sqrt(float(shape_.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.rope = shape_.rope_theta > 0;
  p.inv_freq = d_inv_freq_;
  return p;
}

kernels::DecodeShortParams DecodeAttention::short_params(const DecodeParams& p) const {
  kernels::DecodeShortParams s;
  s.q = p.q;
  s.k_new = p.k_new;
  s.v_new = p.v_new;
  s.k_cache = p.k_cache;
  s.v_cache = p.v_cache;
  s.page_table = p.page_table;
  s.max_seq_len = p.max_seq_len;
  s.page_size = p.page_size;
  s.pages_per_seq = p.pages_per_seq;
  s.out = p.out;
  s.num_kv_heads = p.num_kv_heads;
  s.group = p.group;
  s.scale_log2 = p.scale_log2;
  s.inv_freq = p.rope ? p.inv_freq : nullptr;
  s.overlap = p.overlap;
  s.trace = p.trace;
  s.uniform_len = p.uniform_len;
  if (s.uniform_len == 0)
    for (int b = 0; b < shape_.batch; ++b) s.len[b] = static_cast<uint8_t>(seq_lens_[b]);
  return s;
}

void DecodeAttention::run(const DecodeAttentionTensors& t, cudaStream_t stream) const {
  const DecodeParams p = device_params(t);
  if (few_) {
    const detail::DecodeShortKernel k = pick_short_kernel(shape_.head_dim, group_, shape_.layout == KvLayout::Paged);
    runtime::launch_kernel(k.fn, dim3(shape_.batch * shape_.num_kv_heads), dim3(kernels::kDecodeThreads), short_smem_,
                           stream, shape_.overlap_previous, short_params(p));
    return;
  }
  if (device_lengths_) {
    kernels::DecodeCutArgs a;
    a.seq_lens = t.seq_lens;
    a.page_table = shape_.layout == KvLayout::Paged ? t.page_table : nullptr;
    a.batch = shape_.batch;
    a.num_kv_heads = shape_.num_kv_heads;
    a.capacity = seq_lens_[0];  // the plan's lengths: every cache full
    a.page_size = shape_.page_size;
    a.pages_per_seq = shape_.pages_per_seq;
    a.num_pages = shape_.num_pages;
    a.max_tiles = plan_.num_tiles;
    a.min_units = shape_.num_tiles > 0 ? 1 : kDeviceMinUnits;  // a fixed tile count is taken as given
    a.pair_info = reinterpret_cast<int2*>(d_pair_info_);
    a.tile_first = reinterpret_cast<int4*>(d_tile_first_);
    a.cut = d_cut_;
    a.error = d_cut_ + 2;
    a.out = t.out;
    a.out_elems = int64_t(shape_.batch) * shape_.num_q_heads * shape_.head_dim;
    runtime::launch_kernel(decode_cut_kernel, dim3(1), dim3(kCutThreads), 0, stream, hopper_, a);
  }
  const detail::DecodeKernel k = pick_kernel(shape_.head_dim, group_, shape_.layout == KvLayout::Paged, bulk_, warps_);
  // With device lengths the attention kernel overlaps the cut kernel on Hopper (its blocks wait for
  // the cut; elsewhere the stream's order does).
  runtime::launch_kernel(k.fn, dim3(plan_.num_tiles), dim3(32 * warps_), smem_, stream,
                         shape_.overlap_previous || (device_lengths_ && hopper_), p);
}

std::vector<DecodeTileDesc> DecodeAttention::tiles() const { return decode_tile_descs(plan_); }

}  // namespace tw
