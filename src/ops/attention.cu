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

// The defaults, from the H200 variants of bench_attention (2026-11-22):
// - KvLoad::Auto: cp.async. Bulk copies tie with it on the large cases and lose up to 8% on the
//   small ones (copy latency, and bank conflicts in the unswizzled ring).
// - Small work (no more pairs than SMs, at most kSmallBytesPerSm of K/V per SM): one tile per SM,
//   tiles cut at pair boundaries, 2 stages in flight per warp: the fewest partials and merges on
//   the latency-bound cases (B = 16, L = 4096: 67.6 us against 69.1 with two tiles per SM).
// - Otherwise two tiles per SM (8 warps per SM keep up with the stream, 4 fall 3-4% short), cut
//   evenly over every slot, kStreamSlots stages per warp (all of them when a tile has <= kDeepSlots).
constexpr bool kAutoBulk = false;
constexpr int64_t kSmallBytesPerSm = int64_t(8) << 20;
constexpr int kSmallSlots = 2;
constexpr int kStreamSlots = 3;
constexpr int kDeepSlots = 4;
// A tile streams at least one stage per warp.
constexpr int kMinUnitsPerTile = kernels::kDecodeWarps;

// Tiles for `slots_max` co-resident ones, each streaming at least kMinUnitsPerTile units. `aligned`:
// when all pairs are equally long and fewer than the slots, each pair gets the same whole number of
// tiles, so that tile boundaries fall on pair boundaries (no tile holds parts of two pairs, and a
// pair's merge waits for the fewest tiles).
int plan_tiles(const std::vector<int>& lens, int num_kv_heads, int slots_max, bool aligned) {
  const int npairs = static_cast<int>(lens.size()) * num_kv_heads;
  int units = 0;
  for (int len : lens) units += kernels::decode_units(len) * num_kv_heads;
  const int most = std::clamp((units + kMinUnitsPerTile - 1) / kMinUnitsPerTile, 1, slots_max);
  const bool uniform = std::all_of(lens.begin(), lens.end(), [&](int l) {
    return kernels::decode_units(l) == kernels::decode_units(lens[0]);
  });
  if (!aligned || !uniform || npairs > most) return most;
  return npairs * std::max(1, most / npairs);
}

// The kernel for a shape (instantiated in attention_d64.cu / attention_d128.cu).
detail::DecodeKernel pick_kernel(int d, int g, bool paged, bool bulk) {
  return d == 64 ? detail::decode_kernel_d64(g, paged, bulk) : detail::decode_kernel_d128(g, paged, bulk);
}

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
  auto in_range = [](const char* name, int v, int hi) {
    if (v < 0 || v > hi)
      bad(std::string(name) + " " + std::to_string(v) + " is outside [0, " + std::to_string(hi) + "]");
  };
  in_range("num_tiles", s.num_tiles, kernels::kDecodeMaxTiles);
  in_range("tiles_per_sm", s.tiles_per_sm, 2);
  in_range("ring_slots", s.ring_slots, kernels::kDecodeMaxSlots);
  if (int64_t(lens.size()) != s.batch)
    bad("seq_lens has " + std::to_string(lens.size()) + " entries for batch " + std::to_string(s.batch));
  for (int b = 0; b < s.batch; ++b)
    if (lens[b] < 1)
      bad("seq_lens[" + std::to_string(b) + "] = " + std::to_string(lens[b]) +
          ": a sequence holds at least the new token");
  const int max_len = *std::max_element(lens.begin(), lens.end());
  int64_t units = 0;
  for (int len : lens) units += int64_t(kernels::decode_units(len)) * s.num_kv_heads;
  if (units > INT32_MAX / 2) bad("the cache holds " + std::to_string(units) + " 16-token units, over 2^30");
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

DecodePlan plan_decode(const std::vector<int>& seq_lens, int num_kv_heads, int num_tiles) {
  DecodePlan pl;
  const int npairs = static_cast<int>(seq_lens.size()) * num_kv_heads;
  pl.pair_info.resize(2 * size_t(npairs + 1));
  int units = 0;
  for (int i = 0; i < npairs; ++i) {
    const int len = seq_lens[i / num_kv_heads];
    pl.pair_info[2 * i] = units;
    pl.pair_info[2 * i + 1] = len;
    units += kernels::decode_units(len);
  }
  pl.pair_info[2 * npairs] = units;
  pl.total_units = units;
  pl.num_tiles = std::clamp(num_tiles, 1, units);
  pl.tile_first.resize(4 * size_t(pl.num_tiles));
  int i = 0;
  for (int c = 0; c < pl.num_tiles; ++c) {
    const int u = kernels::decode_tile_start(c, pl.num_tiles, units);
    while (pl.pair_info[2 * (i + 1)] <= u) ++i;
    const int f[4] = {i, pl.pair_info[2 * i], pl.pair_info[2 * (i + 1)], pl.pair_info[2 * i + 1]};
    std::copy(f, f + 4, pl.tile_first.begin() + 4 * c);
  }
  return pl;
}

DecodeAttention::DecodeAttention(const DecodeAttentionShape& shape, std::vector<int> seq_lens,
                                 std::vector<int> page_table)
    : shape_(shape), seq_lens_(std::move(seq_lens)), page_table_(std::move(page_table)) {
  validate(shape_, seq_lens_, page_table_);
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
  bulk_ = shape_.kv_load == KvLoad::Bulk || (shape_.kv_load == KvLoad::Auto && major >= 9 && kAutoBulk);

  // Tiles: every SM streams (tiles_per_sm blocks each).
  const int64_t npairs = int64_t(shape_.batch) * shape_.num_kv_heads;
  const bool small = npairs <= sms && kv_bytes() <= kSmallBytesPerSm * sms;
  const int tiles_per_sm = shape_.tiles_per_sm > 0 ? shape_.tiles_per_sm : (small ? 1 : 2);
  const int slots_max = std::min(sms * tiles_per_sm, kernels::kDecodeMaxTiles);
  const int tiles = shape_.num_tiles > 0 ? shape_.num_tiles
                                         : plan_tiles(seq_lens_, shape_.num_kv_heads, slots_max, tiles_per_sm == 1);
  plan_ = plan_decode(seq_lens_, shape_.num_kv_heads, tiles);

  // Ring depth, capped by the smem of tiles_per_sm blocks per SM.
  const detail::DecodeKernel k = pick_kernel(shape_.head_dim, group_, shape_.layout == KvLayout::Paged, bulk_);
  const int slot_bytes = kernels::kDecodeWarps * 2 * kernels::kDecodeStageTokens * shape_.head_dim * 2;
  const int smem_cap = std::min(smem_block, smem_sm / tiles_per_sm - 1024);
  const int fit = std::clamp((smem_cap - k.ring_offset) / slot_bytes, 1, kernels::kDecodeMaxSlots);
  const int per_warp = std::max(1, (plan_.total_units + plan_.num_tiles * kernels::kDecodeWarps - 1) /
                                       (plan_.num_tiles * kernels::kDecodeWarps));
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
  smem_ = k.ring_offset + slots_ * slot_bytes;
  // The device's limit, not smem_: ops with deeper rings share this kernel.
  TW_CUDA_CHECK(cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_block));

  if (!page_table_.empty()) d_page_table_ = device_copy(page_table_);
  d_pair_info_ = device_copy(plan_.pair_info);
  d_tile_first_ = device_copy(plan_.tile_first);
  const int64_t slots = int64_t(2) * plan_.num_tiles * group_;
  TW_CUDA_CHECK(cudaMalloc(&d_o_part_, slots * shape_.head_dim * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&d_lse_part_, slots * sizeof(float)));
  TW_CUDA_CHECK(cudaMalloc(&d_merge_count_, npairs * sizeof(int)));
  TW_CUDA_CHECK(cudaMemset(d_merge_count_, 0, npairs * sizeof(int)));
}

DecodeAttention::~DecodeAttention() {
  cudaFree(d_page_table_);
  cudaFree(d_pair_info_);
  cudaFree(d_tile_first_);
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
  if (shape_.append && (misaligned(t.k_new) || misaligned(t.v_new))) bad("k_new and v_new must be 16-byte aligned");
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
  p.out = t.out;
  p.pair_info = reinterpret_cast<const int2*>(d_pair_info_);
  p.tile_first = reinterpret_cast<const int4*>(d_tile_first_);
  p.num_tiles = plan_.num_tiles;
  p.total_units = plan_.total_units;
  const bool uniform = std::all_of(seq_lens_.begin(), seq_lens_.end(), [&](int l) { return l == seq_lens_[0]; });
  p.uniform_len = uniform ? seq_lens_[0] : 0;
  p.num_kv_heads = shape_.num_kv_heads;
  p.ring_slots = slots_;
  p.o_part = d_o_part_;
  p.lse_part = d_lse_part_;
  p.merge_count = d_merge_count_;
  const float scale = shape_.scale > 0 ? shape_.scale : 1.f / std::sqrt(float(shape_.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.rope = shape_.rope_theta > 0;
  for (size_t i = 0; i < inv_freq_.size(); ++i) p.inv_freq[i] = inv_freq_[i];
  return p;
}

void DecodeAttention::run(const DecodeAttentionTensors& t, cudaStream_t stream) const {
  const DecodeParams p = device_params(t);
  const detail::DecodeKernel k = pick_kernel(shape_.head_dim, group_, shape_.layout == KvLayout::Paged, bulk_);
  k.fn<<<plan_.num_tiles, kernels::kDecodeThreads, smem_, stream>>>(p);
  TW_CUDA_CHECK_LAUNCH();
}

std::vector<DecodeTileDesc> DecodeAttention::tiles() const {
  std::vector<DecodeTileDesc> out(plan_.num_tiles);
  for (int c = 0; c < plan_.num_tiles; ++c) {
    const int last_unit = kernels::decode_tile_start(c + 1, plan_.num_tiles, plan_.total_units) - 1;
    int pair = plan_.tile_first[4 * c];
    while (plan_.pair_info[2 * (pair + 1)] <= last_unit) ++pair;
    out[c] = {c, plan_.tile_first[4 * c], pair + 1};
  }
  return out;
}

}  // namespace tw
