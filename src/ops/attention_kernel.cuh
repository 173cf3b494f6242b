// The standalone decode-attention kernel (private to src/ops): every block runs one partial tile,
// and the last split block of each (batch, kv head) to finish merges. Instantiated per head dim in
// attention_d64.cu / attention_d128.cu (two translation units build in parallel).
#pragma once

#include "tileweave/kernels/attention/decode.cuh"

namespace tw::detail {

using DecodeKernel = void (*)(kernels::DecodeParams);

template <int D, int G, bool kPaged, bool kBulk>
__global__ void __launch_bounds__(kernels::kDecodeThreads, 2)
    decode_attention_kernel(const __grid_constant__ kernels::DecodeParams p) {
  extern __shared__ __align__(16) char smem[];
  __shared__ int is_last;
  const int split = blockIdx.x, hkv = blockIdx.y, b = blockIdx.z;
  const int n = kernels::decode_num_splits(p.seq_lens[b], p.split_tokens);
  if (split >= n) return;
  kernels::decode_partial_tile<D, G, kPaged, kBulk>(p, b, hkv, split, smem);
  if (n == 1) return;
  // The last split block of (b, hkv) to finish merges (fence, count, fence): no second kernel.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* count = p.merge_count + b * p.num_kv_heads + hkv;
    is_last = atomicAdd(count, 1) == n - 1;
    if (is_last) *count = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  kernels::decode_merge_tile<D, G>(p, b, hkv, smem);
}

template <int D, bool kPaged, bool kBulk>
DecodeKernel pick_group(int g) {
  switch (g) {
    case 1: return decode_attention_kernel<D, 1, kPaged, kBulk>;
    case 2: return decode_attention_kernel<D, 2, kPaged, kBulk>;
    case 3: return decode_attention_kernel<D, 3, kPaged, kBulk>;
    case 4: return decode_attention_kernel<D, 4, kPaged, kBulk>;
    case 5: return decode_attention_kernel<D, 5, kPaged, kBulk>;
    case 6: return decode_attention_kernel<D, 6, kPaged, kBulk>;
    case 7: return decode_attention_kernel<D, 7, kPaged, kBulk>;
    default: return decode_attention_kernel<D, 8, kPaged, kBulk>;
  }
}

template <int D>
DecodeKernel pick_kernel(int g, bool paged, bool bulk) {
  if (paged) return bulk ? pick_group<D, true, true>(g) : pick_group<D, true, false>(g);
  return bulk ? pick_group<D, false, true>(g) : pick_group<D, false, false>(g);
}

DecodeKernel decode_kernel_d64(int g, bool paged, bool bulk);
DecodeKernel decode_kernel_d128(int g, bool paged, bool bulk);

}  // namespace tw::detail
