// Prefill attention (sm_90a; shape.mainloop = sm80 or a pre-Hopper GPU: prefill_sm80.cuh's mma.sync
// kernel, 64-row query tiles, bf16): bf16 Q, K, V in the packed "THD" layout, fp32 online softmax,
// non-causal or causal, GQA, packed sequences of any lengths, the log-sum-exp as an optional output.
// Persistent blocks, one per SM, take (128-row query tile, query head) items from a counter: a
// producer thread streams each item's Q once and K/V tiles of 128 or 160 keys (prefill_block_n)
// through TMA into mbarrier rings; two consumer warpgroups (three at d = 64 on large problems: 64
// query rows each) take turns on the tensor cores for S = QK^T and O = PV (wgmma), the softmax of one key tile overlapping the PV GEMM
// of the one before. shape.fp8: the op quantizes Q, K and V to e4m3 with per-block scales into
// buffers of its own, then runs the e4m3 instance of the kernel (head_dim 128). The kernel is
// kernels/attention/prefill_sm90.cuh; docs/prefill_attention.md has the design and the measurements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "tileweave/graph/prefill_attention_graph.hpp"

namespace tw {

struct PrefillAttentionTensors {
  const __nv_bfloat16* q = nullptr;  // [total_q, Hq, D]
  const __nv_bfloat16* k = nullptr;  // [total_k, Hkv, D]
  const __nv_bfloat16* v = nullptr;  // [total_k, Hkv, D]
  __nv_bfloat16* out = nullptr;      // [total_q, Hq, D]
  float* lse = nullptr;              // optional [Hq, total_q]: natural-log sum of exp(scale * q.k) per row
};

class PrefillAttention {
 public:
  // Validates (tw::InvalidArgument naming the bad value, before anything touches the GPU), plans
  // the tiles and uploads the offsets and the tile list. cu_seqlens_k empty: keys = queries.
  PrefillAttention(const PrefillAttentionShape& shape, std::vector<int> cu_seqlens_q,
                   std::vector<int> cu_seqlens_k = {});
  ~PrefillAttention();
  PrefillAttention(const PrefillAttention&) = delete;
  PrefillAttention& operator=(const PrefillAttention&) = delete;

  // One launch on `stream` (fp8: the quantization's three, then the attention's); capturable in a
  // CUDA graph. Launches of one object run on one stream at a time (they share the work counter
  // and, for fp8, the quantized buffers). Throws tw::InvalidArgument on a null or misaligned
  // tensor (16 B; lse 4 B), tw::CudaError on a device without sm_90a.
  void run(const PrefillAttentionTensors& t, cudaStream_t stream) const;
  // fp8 only, run()'s two halves (to time them apart): quantize t.q, t.k, t.v into the object's
  // buffers; attend over the last quantized inputs, writing t.out and t.lse.
  void quantize(const PrefillAttentionTensors& t, cudaStream_t stream) const;
  void run_quantized(const PrefillAttentionTensors& t, cudaStream_t stream) const;

  const PrefillAttentionShape& shape() const { return shape_; }
  int batch() const { return int(cu_q_.size()) - 1; }
  int total_q() const { return cu_q_.back(); }
  int total_k() const { return cu_k_.back(); }
  const std::vector<int>& cu_seqlens_q() const { return cu_q_; }
  const std::vector<int>& cu_seqlens_k() const { return cu_k_; }
  const std::vector<PrefillTile>& tiles() const { return tiles_; }
  const PrefillWork& work() const { return work_; }  // how the sm90 kernel deals the tiles (its tail's splits)
  double flops() const { return flops_; }

 private:
  PrefillAttentionShape shape_;
  std::vector<int> cu_q_, cu_k_;
  std::vector<PrefillTile> tiles_;
  PrefillWork work_;
  double flops_ = 0;
  int block_n_ = kPrefillBlockN;  // keys per K/V tile of the kernel instance chosen
  int block_m_ = kPrefillBlockM;  // query rows per item
  int sms_ = 0;                   // the device's SMs: one persistent block each (sm90)
  bool sm80_ = false;             // the mma.sync kernel (shape.mainloop; Ampere / Ada, or asked for)
  int* d_cu_q_ = nullptr;
  int* d_cu_k_ = nullptr;
  int* d_tiles_ = nullptr;  // {seq, q_tile, kv_tiles} per tile
  int* d_work_counter_ = nullptr;  // the persistent blocks' next work item; zero between launches
  // The tail (work_.units() > 0): unit offsets, pieces, the split items' partials and counters.
  int *d_units_ = nullptr, *d_pieces_ = nullptr, *d_split_count_ = nullptr;
  float* d_split_ws_ = nullptr;
  // fp8: the quantized inputs and their scales (kernels/attention/prefill_fp8_quant.cuh).
  struct Fp8Buffers {
    std::vector<int> cu_k_pad;  // prefill_fp8_key_offsets
    int* d_cu_k_pad = nullptr;
    int* d_block_seq = nullptr;
    uint8_t *q8 = nullptr, *k8 = nullptr, *vt8 = nullptr;
    float *q_scale = nullptr, *k_scale = nullptr, *v_amax = nullptr;
  } fp8_;
  void check_inputs(const PrefillAttentionTensors& t) const;   // q, k, v: non-null, 16-B aligned
  void check_outputs(const PrefillAttentionTensors& t) const;  // out (16 B) and lse (4 B)
  void attend(const PrefillAttentionTensors& t, cudaStream_t stream) const;
};

}  // namespace tw
