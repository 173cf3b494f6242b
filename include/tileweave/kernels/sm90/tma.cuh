// Tensor-map (TMA) copies for the Hopper mainloop: the host side builds a 2-D tensor map of a
// row-major bf16 matrix (rows x cols, cols contiguous) whose box is written to shared memory with
// the 128-byte swizzle that wgmma's SW128 descriptors read; the device side issues the copy with an
// L2 cache policy and completes it on an mbarrier (complete_tx of the box bytes, out-of-bounds
// elements zero-filled and counted too).
#pragma once

#include <cuda.h>  // CUtensorMap and the encode function's types (no libcuda link: fetched at run time)
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "tileweave/kernels/sm90/arch.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw::sm90 {

#if TW_SM90_ENABLED
// L2 policies: weights are read once per launch (evict_first keeps them from pushing out the
// activations, which every tile of the launch re-reads: evict_last).
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t l2_evict_normal() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ uint64_t l2_evict_last() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}

// Box at (col c0, row r0) of `map` into `dst` (1024-B aligned), completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int r0, uint64_t* bar,
                                           uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(r0),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

// Pulls the descriptor into the constant cache before the first copy uses it.
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
#endif

// ---- host ----

// A row-major bf16 matrix [rows][cols] (cols contiguous, row stride = cols elements) read in boxes
// of box_rows x 64 columns (128 B = one swizzle row). Requires: base 16-B aligned, cols % 8 == 0
// (row stride a multiple of 16 B), 1 <= box_rows <= 256. Reads past rows/cols are zero-filled.
// promote_256: L2 fetch granularity for the box rows (256 B: the neighbouring 128 B, the next
// K stage of the same rows, arrives with this one).
inline CUtensorMap make_tensor_map_bf16(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                                        bool promote_256 = true) {
  using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                              const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TW_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) throw CudaError("cuTensorMapEncodeTiled not available");
    return reinterpret_cast<Encode>(fn);
  }();
  CUtensorMap map;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            promote_256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError("cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ") for a " + std::to_string(rows) +
                    "x" + std::to_string(cols) + " bf16 matrix, box rows " + std::to_string(box_rows));
  return map;
}

}  // namespace tw::sm90
