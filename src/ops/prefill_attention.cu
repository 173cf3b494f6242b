// Prefill attention on Hopper: the host side of kernels/attention/prefill_sm90.cuh.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "ffn_sm90.hpp"  // check_operand
#include "tileweave/kernels/attention/prefill_sm90.cuh"
#include "tileweave/ops/prefill_attention.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace tw {

namespace {

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("prefill attention: " + what); }

template <int kD, int kBN, int kWGs = 2>
void launch(const PrefillAttentionShape& s, int total_q, int total_k, int num_tiles, const kernels::PrefillParams& p,
            int sms, const PrefillAttentionTensors& t, cudaStream_t stream) {
  using C = kernels::PrefillConfig<kD, kBN, kWGs>;
  static const bool attr_set = [] {
    TW_CUDA_CHECK(cudaFuncSetAttribute(kernels::prefill_attention_sm90<kD, kBN, kWGs>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    return true;
  }();
  (void)attr_set;
  const CUtensorMap mq = sm90::make_head_rows_map_bf16(t.q, uint64_t(total_q), s.num_q_heads, kD, C::kBM);
  const CUtensorMap mk = sm90::make_head_rows_map_bf16(t.k, uint64_t(total_k), s.num_kv_heads, kD, C::kBN);
  const CUtensorMap mv = sm90::make_head_rows_map_bf16(t.v, uint64_t(total_k), s.num_kv_heads, kD, C::kBN);
  const int blocks = int(std::min<int64_t>(sms, int64_t(num_tiles) * s.num_q_heads));
  kernels::prefill_attention_sm90<kD, kBN, kWGs><<<blocks, C::kThreads, C::kSmemBytes, stream>>>(mq, mk, mv, p);
  TW_CUDA_CHECK_LAUNCH();
}

}  // namespace

PrefillAttention::PrefillAttention(const PrefillAttentionShape& shape, std::vector<int> cu_q, std::vector<int> cu_k)
    : shape_(shape), cu_q_(std::move(cu_q)), cu_k_(std::move(cu_k)) {
  validate_prefill_attention(shape_, cu_q_, cu_k_);
  if (cu_k_.empty()) cu_k_ = cu_q_;
  block_n_ = prefill_block_n(shape_);
  flops_ = prefill_attention_flops(shape_, cu_q_, cu_k_);

  int dev = 0, major = 0, minor = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    throw CudaError("prefill attention runs on sm_90a (Hopper); this device is sm_" + std::to_string(major) +
                    std::to_string(minor));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, dev));
  block_m_ = prefill_block_m(shape_, cu_q_, sms_);
  tiles_ = plan_prefill_tiles(shape_, cu_q_, cu_k_, block_n_, block_m_);
  if (int64_t(tiles_.size()) * shape_.num_q_heads > INT32_MAX)
    bad(std::to_string(tiles_.size()) + " query tiles x " + std::to_string(shape_.num_q_heads) +
        " heads is more work items than the kernel counts (2^31 - 1)");

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
}

PrefillAttention::~PrefillAttention() {
  cudaFree(d_cu_q_);
  cudaFree(d_cu_k_);
  cudaFree(d_tiles_);
  cudaFree(d_work_counter_);
}

void PrefillAttention::run(const PrefillAttentionTensors& t, cudaStream_t stream) const {
  for (const auto& [ptr, name] :
       {std::pair<const void*, const char*>{t.q, "q"}, {t.k, "k"}, {t.v, "v"}, {t.out, "out"}})
    ffn_sm90::check_operand("prefill attention", ptr, name);
  if (reinterpret_cast<uintptr_t>(t.lse) % alignof(float)) bad("lse must be 4-byte aligned");
  if (tiles_.empty()) return;  // every sequence has no query
  kernels::PrefillParams p;
  p.cu_q = d_cu_q_;
  p.cu_k = d_cu_k_;
  p.tiles = d_tiles_;
  p.num_tiles = int(tiles_.size());
  p.num_work = int(tiles_.size()) * shape_.num_q_heads;
  p.work_counter = d_work_counter_;
  p.heads_q = shape_.num_q_heads;
  p.group = shape_.num_q_heads / shape_.num_kv_heads;
  p.causal = shape_.causal ? 1 : 0;
  p.total_q = total_q();
  const float scale = shape_.scale > 0.f ? shape_.scale : 1.f / std::sqrt(float(shape_.head_dim));
  p.scale_log2 = scale * 1.4426950408889634f;
  p.out = t.out;
  p.lse = t.lse;
  // A tensor map needs at least one row: keys may be empty while queries are not.
  const int rows_k = std::max(total_k(), 1);
  if (shape_.head_dim == 64 && block_m_ == 192)
    launch<64, 128, 3>(shape_, total_q(), rows_k, int(tiles_.size()), p, sms_, t, stream);
  else if (shape_.head_dim == 64)
    launch<64, 128>(shape_, total_q(), rows_k, int(tiles_.size()), p, sms_, t, stream);
  else if (block_n_ == 160)
    launch<128, 160>(shape_, total_q(), rows_k, int(tiles_.size()), p, sms_, t, stream);
  else
    launch<128, 128>(shape_, total_q(), rows_k, int(tiles_.size()), p, sms_, t, stream);
}

}  // namespace tw
