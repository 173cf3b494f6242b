// The standalone decode-attention kernel (private to src/ops): block c runs work tile c (the last
// tile to finish a pair merges it inside the same launch). Instantiated per head dim in
// attention_d64.cu / attention_d128.cu (two translation units build in parallel).
#pragma once

#include "tileweave/kernels/attention/decode.cuh"

namespace tw::detail {

struct DecodeKernel {
  void (*fn)(kernels::DecodeParams) = nullptr;
  int ring_offset = 0;  // smem bytes before the ring: smem = ring_offset + slots * slot bytes
};

template <int D, int G, bool kPaged, bool kBulk>
__global__ void __launch_bounds__(kernels::kDecodeThreads, 2)
    decode_attention_kernel(const __grid_constant__ kernels::DecodeParams p) {
  extern __shared__ __align__(128) char smem[];
  kernels::decode_work_tile<D, G, kPaged, kBulk, /*kStandalone=*/true>(p, blockIdx.x, smem);
}

template <int D, int G>
DecodeKernel make_kernel(bool paged, bool bulk) {
  auto fn = paged ? (bulk ? decode_attention_kernel<D, G, true, true> : decode_attention_kernel<D, G, true, false>)
                  : (bulk ? decode_attention_kernel<D, G, false, true> : decode_attention_kernel<D, G, false, false>);
  return {fn, kernels::decode_ring_offset<D, G>()};
}

template <int D>
DecodeKernel pick_kernel(int g, bool paged, bool bulk) {
  switch (g) {
    case 1: return make_kernel<D, 1>(paged, bulk);
    case 2: return make_kernel<D, 2>(paged, bulk);
    case 3: return make_kernel<D, 3>(paged, bulk);
    case 4: return make_kernel<D, 4>(paged, bulk);
    case 5: return make_kernel<D, 5>(paged, bulk);
    case 6: return make_kernel<D, 6>(paged, bulk);
    case 7: return make_kernel<D, 7>(paged, bulk);
    default: return make_kernel<D, 8>(paged, bulk);
  }
}

DecodeKernel decode_kernel_d64(int g, bool paged, bool bulk);
DecodeKernel decode_kernel_d128(int g, bool paged, bool bulk);

}  // namespace tw::detail
