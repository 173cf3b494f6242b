// The standalone decode-attention kernels (private to src/ops): block c runs work tile c (the last
// tile to finish a pair merges it inside the same launch), or, on the few-token path, pair c whole.
// Instantiated per head dim in attention_d64.cu / attention_d128.cu / attention_d256.cu (translation
// units build in parallel).
#pragma once

#include "tileweave/kernels/attention/decode.cuh"
#include "tileweave/kernels/attention/decode_short.cuh"

namespace tw::detail {

struct DecodeKernel {
  void (*fn)(kernels::DecodeParams) = nullptr;
  int ring_offset = 0;  // smem bytes before the ring: smem = ring_offset + slots * slot bytes
  int warps = kernels::kDecodeWarps;
};

// kWarps = 8 runs one block per SM (their registers), 4 runs two.
template <int D, int G, bool kPaged, bool kBulk, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 4 ? 2 : 1)
    decode_attention_kernel(const __grid_constant__ kernels::DecodeParams p) {
  extern __shared__ __align__(128) char smem[];
  kernels::decode_work_tile<D, G, kPaged, kBulk, /*kStandalone=*/true, kWarps>(p, blockIdx.x, smem);
}

// Which variants exist (each one is compile time): 8 warps only with cp.async (the default loader),
// and only at D <= 128 (decode_tile_warps: 8 warps' combine buffers leave no room for a ring at
// D = 256); bulk copies (an opt-in, measured slower) only at D <= 128 and up to 8 heads. Each keeps
// the build short.
template <int D, int G>
DecodeKernel make_kernel(bool paged, bool bulk, int warps) {
  if constexpr (D <= 128)
    if (warps == 8 && !bulk)
      return {paged ? decode_attention_kernel<D, G, true, false, 8> : decode_attention_kernel<D, G, false, false, 8>,
              kernels::decode_ring_offset<D, G, 8>(), 8};
  if constexpr (D <= 128 && G <= 8)
    if (bulk)
      return {paged ? decode_attention_kernel<D, G, true, true, 4> : decode_attention_kernel<D, G, false, true, 4>,
              kernels::decode_ring_offset<D, G, 4>(), 4};
  return {paged ? decode_attention_kernel<D, G, true, false, 4> : decode_attention_kernel<D, G, false, false, 4>,
          kernels::decode_ring_offset<D, G, 4>(), 4};
}

// Groups of 9..16 heads share one kernel (two mma row blocks, the group read at run time).
template <int D>
DecodeKernel pick_kernel(int g, bool paged, bool bulk, int warps) {
  switch (g) {
    case 1: return make_kernel<D, 1>(paged, bulk, warps);
    case 2: return make_kernel<D, 2>(paged, bulk, warps);
    case 3: return make_kernel<D, 3>(paged, bulk, warps);
    case 4: return make_kernel<D, 4>(paged, bulk, warps);
    case 5: return make_kernel<D, 5>(paged, bulk, warps);
    case 6: return make_kernel<D, 6>(paged, bulk, warps);
    case 7: return make_kernel<D, 7>(paged, bulk, warps);
    case 8: return make_kernel<D, 8>(paged, bulk, warps);
    default: return make_kernel<D, kernels::kDecodeMaxGroup>(paged, bulk, warps);
  }
}

// The few-token path: one block per pair. Four variants per head dim (one or two mma row blocks,
// contiguous or paged; the group is read at run time), so the build stays short.
struct DecodeShortKernel {
  void (*fn)(kernels::DecodeShortParams) = nullptr;
  int kv_offset = 0;  // smem bytes before the K/V units: smem = kv_offset + units x slot bytes
};

template <int D, int kR, bool kPaged>
__global__ void __launch_bounds__(kernels::kDecodeThreads, kernels::decode_short_blocks_per_sm(D))
    decode_short_kernel(const __grid_constant__ kernels::DecodeShortParams p) {
  extern __shared__ __align__(128) char smem[];
  kernels::decode_short_pair<D, kR, kPaged>(p, blockIdx.x, smem);
}

template <int D>
DecodeShortKernel pick_short_kernel(int g, bool paged) {
  if (g <= 8)
    return {paged ? decode_short_kernel<D, 1, true> : decode_short_kernel<D, 1, false>, kernels::decode_short_kv_offset<D, 1>()};
  return {paged ? decode_short_kernel<D, 2, true> : decode_short_kernel<D, 2, false>, kernels::decode_short_kv_offset<D, 2>()};
}

DecodeKernel decode_kernel_d64(int g, bool paged, bool bulk, int warps);
DecodeKernel decode_kernel_d128(int g, bool paged, bool bulk, int warps);
DecodeKernel decode_kernel_d256(int g, bool paged, bool bulk, int warps);
DecodeShortKernel decode_short_kernel_d64(int g, bool paged);
DecodeShortKernel decode_short_kernel_d128(int g, bool paged);
DecodeShortKernel decode_short_kernel_d256(int g, bool paged);

}  // namespace tw::detail
