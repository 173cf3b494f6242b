// Prefill attention: the host side of kernels/attention/prefill_sm90.cuh (Hopper) and
// prefill_sm80.cuh (Ampere and later).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "ffn_sm90.hpp"  // check_operand
#include "tileweave/kernels/attention/prefill_fp8_quant.cuh"
#include "tileweave/kernels/attention/prefill_sm80.cuh"
#include "tileweave/kernels/attention/prefill_sm90.cuh"
#include "tileweave/model/prefill_traffic.hpp"  // prefill_piece_costs
#include "tileweave/ops/prefill_attention.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace tw {

namespace {

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("prefill attention: " + what); }

// The kernel's three tensor maps: bf16 Q, K, V ([rows][heads][D]), or for fp8 the quantized
// e4m3 Q and K ([rows][heads][D], 128-B rows) and V^T ([heads][D][rows_pad]).
struct Maps {
  CUtensorMap q, k, v;
};

template <int kD, int kBN, int kWGs = 2, bool kFp8 = false>
void launch(const Maps& m, const kernels::PrefillParams& p, int sms, cudaStream_t stream) {
  using C = kernels::PrefillConfig<kD, kBN, kWGs, kFp8>;
  static const bool attr_set = [] {
    TW_CUDA_CHECK(cudaFuncSetAttribute(kernels::prefill_attention_sm90<kD, kBN, kWGs, kFp8>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    return true;
  }();
  (void)attr_set;
  const int blocks = std::min(sms, p.num_work);  // one per SM; each draws until the work runs out
  kernels::prefill_attention_sm90<kD, kBN, kWGs, kFp8><<<blocks, C::kThreads, C::kSmemBytes, stream>>>(m.q, m.k, m.v, p);
  TW_CUDA_CHECK_LAUNCH();
}

template <int kD>
void launch_sm80(const PrefillAttentionTensors& t, const kernels::PrefillParams& p, cudaStream_t stream) {
  using C = kernels::PrefillSm80Config<kD>;
  static const bool attr_set = [] {
    TW_CUDA_CHECK(cudaFuncSetAttribute(kernels::prefill_attention_sm80<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       C::kSmemBytes));
    return true;
  }();
  (void)attr_set;
  kernels::prefill_attention_sm80<kD><<<p.num_work, C::kThreads, C::kSmemBytes, stream>>>(t.q, t.k, t.v, p);
  TW_CUDA_CHECK_LAUNCH();
}

template <class T>
void alloc(T** p, size_t n) {
  TW_CUDA_CHECK(cudaMalloc(p, std::max<size_t>(n, 1) * sizeof(T)));
}

}  // namespace

PrefillAttention::PrefillAttention(const PrefillAttentionShape& shape, std::vector<int> cu_q, std::vector<int> cu_k)
    : shape_(shape), cu_q_(std::move(cu_q)), cu_k_(std::move(cu_k)) {
  validate_prefill_attention(shape_, cu_q_, cu_k_);
  if (cu_k_.empty()) cu_k_ = cu_q_;
  flops_ = prefill_attention_flops(shape_, cu_q_, cu_k_);

  int dev = 0, major = 0, minor = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const std::string arch = "sm_" + std::to_string(major) + std::to_string(minor);
  const bool hopper = major == 9 && minor == 0;
  if (shape_.mainloop == "sm90" && !hopper)
    throw CudaError("prefill attention's sm90 kernel runs on sm_90a (Hopper); this device is " + arch);
  sm80_ = shape_.mainloop == "sm80" || (shape_.mainloop == "auto" && !hopper);
  if (sm80_ && major < 8) throw CudaError("prefill attention needs sm_80 or newer; this device is " + arch);
  if (sm80_ && shape_.fp8) throw CudaError("fp8 prefill attention runs on Hopper (sm_90a); this device is " + arch);
  if (sm80_ && shape_.head_dim == 256)
    throw CudaError("prefill attention at head_dim 256 runs on Hopper (sm_90a); this device is " + arch);
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
  block_n_ = sm80_ ? kernels::PrefillSm80Config<64>::kBN : prefill_block_n(shape_);
  block_m_ = sm80_ ? kernels::PrefillSm80Config<64>::kBM : prefill_block_m(shape_, cu_q_, sms_);
  tiles_ = plan_prefill_tiles(shape_, cu_q_, cu_k_, block_n_, block_m_);
  if (int64_t(tiles_.size()) * shape_.num_q_heads > INT32_MAX)
    bad(std::to_string(tiles_.size()) + " query tiles x " + std::to_string(shape_.num_q_heads) +
        " heads is more work items than the kernel counts (2^31 - 1)");
  // The tail's key-range splits: the sm90 kernel (bf16 and fp8).
  work_ = plan_prefill_work(tiles_, shape_.num_q_heads, sms_, shape_.split_tail && !sm80_,
                            prefill_piece_costs(shape_, block_n_));

  std::vector<int> flat;
  flat.reserve(tiles_.size() * 3);
  for (const auto& t : tiles_) flat.insert(flat.end(), {t.seq, t.q_tile, t.kv_tiles});
  TW_CUDA_CHECK(cudaMalloc(&d_cu_q_, cu_q_.size() * sizeof(int)));
  TW_CUDA_CHECK(cudaMalloc(&d_cu_k_, cu_k_.size() * sizeof(int)));
  TW_CUDA_CHECK(cudaMalloc(&d_tiles_, std::max<size_t>(flat.size(), 1) * sizeof(int)));
  TW_CUDA_CHECK(cudaMalloc(&d_work_counter_, sizeof(int)));
  TW_CUDA_CHECK(cudaMemset(d_work_counter_, 0, sizeof(int)));
  TW_CUDA_CHECK(cudaMemcpy(d_cu_q_, cu_q_.data(), cu_q_.size() * sizeof(int), cudaMemcpyHostToDevice));
  TW_CUDA_CHECK(cudaMemcpy(d_cu_k_, cu_k_.data(), cu_k_.size() * sizeof(int), cudaMemcpyHostToDevice));
  if (!flat.empty())
    TW_CUDA_CHECK(cudaMemcpy(d_tiles_, flat.data(), flat.size() * sizeof(int), cudaMemcpyHostToDevice));
  if (work_.units() > 0) {
    std::vector<int> pieces;
    for (const PrefillPiece& q : work_.pieces)
      pieces.insert(pieces.end(), {q.item, q.kv_first, q.kv_tiles, q.group, q.slot, q.first_slot, q.parts});
    static_assert(kernels::kPieceInts == 7, "PrefillPiece's fields, as the kernel reads them");
    const size_t wgs = size_t(block_m_ / 64), vec = size_t(kernels::prefill_partial_vec4(shape_.head_dim, shape_.fp8));
    alloc(&d_units_, work_.unit_offsets.size());
    alloc(&d_pieces_, pieces.size());
    alloc(&d_split_ws_, size_t(work_.slots) * wgs * 128 * vec * 4);
    alloc(&d_split_count_, size_t(work_.groups) * wgs * 4);
    TW_CUDA_CHECK(cudaMemset(d_split_count_, 0, size_t(work_.groups) * wgs * 4 * sizeof(int)));
    TW_CUDA_CHECK(cudaMemcpy(d_units_, work_.unit_offsets.data(), work_.unit_offsets.size() * sizeof(int),
                             cudaMemcpyHostToDevice));
    TW_CUDA_CHECK(cudaMemcpy(d_pieces_, pieces.data(), pieces.size() * sizeof(int), cudaMemcpyHostToDevice));
  }

  if (shape_.fp8) {
    fp8_.cu_k_pad = prefill_fp8_key_offsets(cu_k_, block_n_);
    const int rows_pad = fp8_.cu_k_pad.back(), blocks = rows_pad / kPrefillFp8KeyBlock;
    std::vector<int> block_seq(blocks);
    for (size_t b = 0; b + 1 < cu_k_.size(); ++b)
      for (int i = fp8_.cu_k_pad[b] / kPrefillFp8KeyBlock; i < fp8_.cu_k_pad[b + 1] / kPrefillFp8KeyBlock; ++i)
        block_seq[i] = int(b);
    const size_t d = size_t(shape_.head_dim), hq = size_t(shape_.num_q_heads), hkv = size_t(shape_.num_kv_heads);
    alloc(&fp8_.d_cu_k_pad, fp8_.cu_k_pad.size());
    alloc(&fp8_.d_block_seq, block_seq.size());
    alloc(&fp8_.q8, size_t(total_q()) * hq * d);
    alloc(&fp8_.k8, size_t(rows_pad) * hkv * d);
    alloc(&fp8_.vt8, size_t(rows_pad) * hkv * d);
    alloc(&fp8_.q_scale, size_t(total_q()) * hq);
    alloc(&fp8_.k_scale, size_t(blocks) * hkv);
    alloc(&fp8_.v_amax, hkv * d);
    TW_CUDA_CHECK(cudaMemcpy(fp8_.d_cu_k_pad, fp8_.cu_k_pad.data(), fp8_.cu_k_pad.size() * sizeof(int),
                             cudaMemcpyHostToDevice));
    if (blocks > 0)
      TW_CUDA_CHECK(
          cudaMemcpy(fp8_.d_block_seq, block_seq.data(), block_seq.size() * sizeof(int), cudaMemcpyHostToDevice));
  }
}

PrefillAttention::~PrefillAttention() {
  cudaFree(d_cu_q_);
  cudaFree(d_cu_k_);
  cudaFree(d_tiles_);
  cudaFree(d_work_counter_);
  cudaFree(d_units_);
  cudaFree(d_pieces_);
  cudaFree(d_split_ws_);
  cudaFree(d_split_count_);
  for (void* p : {(void*)fp8_.d_cu_k_pad, (void*)fp8_.d_block_seq, (void*)fp8_.q8, (void*)fp8_.k8, (void*)fp8_.vt8,
                  (void*)fp8_.q_scale, (void*)fp8_.k_scale, (void*)fp8_.v_amax})
    cudaFree(p);
}

void PrefillAttention::check_inputs(const PrefillAttentionTensors& t) const {
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{t.q, "q"}, {t.k, "k"}, {t.v, "v"}})
    ffn_sm90::check_operand("prefill attention", ptr, name);
}

void PrefillAttention::check_outputs(const PrefillAttentionTensors& t) const {
  ffn_sm90::check_operand("prefill attention", t.out, "out");
  if (reinterpret_cast<uintptr_t>(t.lse) % alignof(float)) bad("lse must be 4-byte aligned");
}

void PrefillAttention::run(const PrefillAttentionTensors& t, cudaStream_t stream) const {
  check_outputs(t);  // before any launch; quantize() checks the inputs for the fp8 path
  if (shape_.fp8)
    quantize(t, stream);
  else
    check_inputs(t);
  attend(t, stream);
}

void PrefillAttention::quantize(const PrefillAttentionTensors& t, cudaStream_t stream) const {
  if (!shape_.fp8) bad("quantize() is for an fp8 op (shape.fp8)");
  check_inputs(t);
  constexpr int kD = 128;
  kernels::PrefillFp8QuantParams p;
  p.q = t.q;
  p.k = t.k;
  p.v = t.v;
  p.q8 = fp8_.q8;
  p.k8 = fp8_.k8;
  p.vt8 = fp8_.vt8;
  p.q_scale = fp8_.q_scale;
  p.k_scale = fp8_.k_scale;
  p.v_amax = fp8_.v_amax;
  p.cu_k = d_cu_k_;
  p.cu_k_pad = fp8_.d_cu_k_pad;
  p.block_seq = fp8_.d_block_seq;
  p.total_q = total_q();
  p.total_k = total_k();
  p.heads_q = shape_.num_q_heads;
  p.heads_kv = shape_.num_kv_heads;
  p.rows_pad = fp8_.cu_k_pad.back();
  p.k_blocks = p.rows_pad / kPrefillFp8KeyBlock;
  TW_CUDA_CHECK(cudaMemsetAsync(fp8_.v_amax, 0, size_t(shape_.num_kv_heads) * kD * sizeof(float), stream));
  if (p.total_k > 0) {
    kernels::fp8_v_amax<kD><<<dim3((p.total_k + 127) / 128, p.heads_kv), 256, 0, stream>>>(p);
    TW_CUDA_CHECK_LAUNCH();
    kernels::fp8_quantize_kv<kD><<<dim3(p.k_blocks, p.heads_kv), 128, 0, stream>>>(p);
    TW_CUDA_CHECK_LAUNCH();
  }
  if (p.total_q > 0) {
    const int64_t blocks = (int64_t(p.total_q) * p.heads_q + 63) / 64;  // 64 rows a block
    kernels::fp8_quantize_q<kD><<<int(std::min<int64_t>(blocks, 65535)), 256, 0, stream>>>(p);
    TW_CUDA_CHECK_LAUNCH();
  }
}

void PrefillAttention::run_quantized(const PrefillAttentionTensors& t, cudaStream_t stream) const {
  if (!shape_.fp8) bad("run_quantized() is for an fp8 op (shape.fp8)");
  check_outputs(t);
  attend(t, stream);
}

void PrefillAttention::attend(const PrefillAttentionTensors& t, cudaStream_t stream) const {
  if (tiles_.empty()) return;  // every sequence has no query
  kernels::PrefillParams p;
  p.cu_q = d_cu_q_;
  p.cu_k = d_cu_k_;
  p.tiles = d_tiles_;
  p.num_tiles = int(tiles_.size());
  p.num_work = int(tiles_.size()) * shape_.num_q_heads;
  p.work_counter = d_work_counter_;
  if (work_.units() > 0) {
    p.num_work = int(work_.draws());
    p.num_whole = int(work_.whole);
    p.unit_offsets = d_units_;
    p.unit_pieces = d_pieces_;
    p.split_ws = d_split_ws_;
    p.split_count = d_split_count_;
  }
  p.heads_q = shape_.num_q_heads;
  p.group = shape_.num_q_heads / shape_.num_kv_heads;
  p.causal = shape_.causal ? 1 : 0;
  p.total_q = total_q();
  const float scale = shape_.scale > 0.f ? shape_.scale : 1.f / std::sqrt(float(shape_.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.out = t.out;
  p.lse = t.lse;
  if (sm80_) {
    if (shape_.head_dim == 64)
      launch_sm80<64>(t, p, stream);
    else
      launch_sm80<128>(t, p, stream);
    return;
  }
  const uint64_t hq = uint64_t(shape_.num_q_heads), hkv = uint64_t(shape_.num_kv_heads),
                 d = uint64_t(shape_.head_dim);
  if (shape_.fp8) {
    p.cu_k_pad = fp8_.d_cu_k_pad;
    p.q_scale = fp8_.q_scale;
    p.k_scale = fp8_.k_scale;
    p.v_amax = fp8_.v_amax;
    // A tensor map needs at least one row: keys may be empty while queries are not.
    const uint64_t rows_pad = uint64_t(std::max(fp8_.cu_k_pad.back(), kPrefillFp8TileKeys));
    p.k_blocks = fp8_.cu_k_pad.back() / kPrefillFp8KeyBlock;
    constexpr uint32_t kBN = kPrefillFp8TileKeys;
    const Maps m{sm90::make_map_3d_u8(fp8_.q8, {d, hq, uint64_t(total_q())}, {d, hq * d}, {128, 1, kPrefillBlockM},
                                      "fp8 q"),
                 sm90::make_map_3d_u8(fp8_.k8, {d, hkv, rows_pad}, {d, hkv * d}, {128, 1, kBN}, "fp8 k"),
                 sm90::make_map_3d_u8(fp8_.vt8, {rows_pad, d, hkv}, {rows_pad, d * rows_pad}, {64, uint32_t(d), 1},
                                      "fp8 v^T")};  // 64-key boxes, 64-B swizzle (PrefillConfig::kVChunks)
    launch<128, kPrefillFp8TileKeys, 2, true>(m, p, sms_, stream);
    return;
  }
  const uint64_t rows_k = uint64_t(std::max(total_k(), 1));
  auto maps = [&](int block_m, int block_n) {
    return Maps{sm90::make_head_rows_map_bf16(t.q, uint64_t(total_q()), hq, d, block_m),
                sm90::make_head_rows_map_bf16(t.k, rows_k, hkv, d, block_n),
                sm90::make_head_rows_map_bf16(t.v, rows_k, hkv, d, block_n)};
  };
  if (shape_.head_dim == 256)
    launch<256, 64>(maps(128, 64), p, sms_, stream);
  else if (shape_.head_dim == 64 && block_m_ == 192)
    launch<64, 128, 3>(maps(192, 128), p, sms_, stream);
  else if (shape_.head_dim == 64)
    launch<64, 128>(maps(128, 128), p, sms_, stream);
  else if (block_n_ == 160)
    launch<128, 160>(maps(128, 160), p, sms_, stream);
  else
    launch<128, 128>(maps(128, 128), p, sms_, stream);
}

}  // namespace tw
