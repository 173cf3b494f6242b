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

// Box at coordinates (c0, c1, c2) of a 3-D map (make_head_rows_map_bf16: column, head, row).
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar,
                                           uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

// Box at coordinates (c0, c1, c2, c3) of a 4-D map (make_paired_rows_map_bf16).
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                           uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

// Box at (col c0, row r0) of `map` from `src` (1024-B aligned, the map's swizzle), as a bulk async-group
// of this thread: commit with bulk_commit, then bulk_wait_read (src may be overwritten) or bulk_wait
// (the writes are done). Rows and columns past the tensor are not written.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int c0, int r0, const void* src) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(r0), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(src)))
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// `bytes` contiguous bytes (a multiple of 16, 16-B aligned both sides) into `dst`, completing on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(src), "r"(bytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))), "l"(policy)
      : "memory");
}

// Starts pulling `bytes` (a multiple of 16) at src into L2; nothing waits for it.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// Pulls the descriptor into the constant cache before the first copy uses it.
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
#endif

// ---- host ----

namespace detail {
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
// A tensor map with 128-B swizzle; dims[0] is the contiguous one (64 bf16 elements per box row).
// (dtype: bf16 unless given; an 8-bit type has 128 elements per box row. swizzle: 128 B unless
// given, whose span the box's rows must not exceed.)
inline CUtensorMap encode_tiled(const void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                                const cuuint32_t* box, bool promote_256, const std::string& what,
                                CUtensorMapDataType dtype = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                                CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  static EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    TW_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) throw CudaError("cuTensorMapEncodeTiled not available");
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  CUtensorMap map;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(&map, dtype, rank, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            promote_256 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) throw CudaError("cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ") for " + what);
  return map;
}
}  // namespace detail

// A row-major bf16 matrix [rows][cols] (cols contiguous, row stride = cols elements) read in boxes
// of box_rows x 64 columns (128 B = one swizzle row). Requires: base 16-B aligned, cols % 8 == 0
// (row stride a multiple of 16 B), 1 <= box_rows <= 256. Reads past rows/cols are zero-filled.
// promote_256: L2 fetch granularity for the box rows (256 B: the neighbouring 128 B, the next
// K stage of the same rows, arrives with this one).
inline CUtensorMap make_tensor_map_bf16(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                                        bool promote_256 = true) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * 2};
  const cuuint32_t box[2] = {64, box_rows};
  return detail::encode_tiled(base, 2, dims, strides, box, promote_256,
                                   "a " + std::to_string(rows) + "x" + std::to_string(cols) + " bf16 matrix, box rows " +
                                       std::to_string(box_rows));
}

// Two stacked halves of a row-major bf16 matrix [2 * half_rows][cols] (e.g. W_gate; W_up) read
// interleaved: one box of `groups` x 16 rows x 64 columns lands as, per group g, the first half's
// rows 8g..8g+7 then the second half's same rows (box coordinates: {col, 0, 0, first group}).
// One copy instead of 2 * groups 8-row copies. Requires half_rows % 8 == 0 and the 2-D rules.
inline CUtensorMap make_paired_rows_map_bf16(const void* base, uint64_t half_rows, uint64_t cols, uint32_t groups) {
  const cuuint64_t dims[4] = {cols, 8, 2, half_rows / 8};
  const cuuint64_t strides[3] = {cols * 2, half_rows * cols * 2, 8 * cols * 2};
  const cuuint32_t box[4] = {64, 8, 2, groups};
  return detail::encode_tiled(base, 4, dims, strides, box, false,
                                   "paired halves of " + std::to_string(half_rows) + "x" + std::to_string(cols) + " rows");
}

// One head of packed activations [rows][heads][cols] bf16 (the "THD" layout of attention's q, k, v)
// read in boxes of box_rows rows x 64 columns of one head (box coordinates {col, head, row}): each
// box lands as box_rows rows of 128 B, like make_tensor_map_bf16's. Requires cols % 64 == 0 and a
// 16-B aligned base; rows past `rows` are zero-filled. row_elems: the row stride in elements where
// the heads are part of a wider row (q, k or v within a fused q|k|v [rows][3 heads][cols]); 0: heads * cols.
inline CUtensorMap make_head_rows_map_bf16(const void* base, uint64_t rows, uint64_t heads, uint64_t cols,
                                           uint32_t box_rows, uint64_t row_elems = 0) {
  const cuuint64_t dims[3] = {cols, heads, rows};
  const cuuint64_t strides[2] = {cols * 2, (row_elems ? row_elems : heads * cols) * 2};
  const cuuint32_t box[3] = {64, 1, box_rows};
  return detail::encode_tiled(base, 3, dims, strides, box, true,
                                   std::to_string(rows) + " rows x " + std::to_string(heads) + " heads x " +
                                       std::to_string(cols) + " bf16, box rows " + std::to_string(box_rows));
}

// 8-bit elements (e4m3): a 3-D tensor (dims[0] contiguous, strides in bytes of dims 1 and 2,
// multiples of 16) read in boxes of box[0] x box[1] x box[2] with the 128-B swizzle (box[0] = 128)
// or the 64-B one (box[0] = 64): each box lands as box[1] * box[2] rows of box[0] bytes. Zero-filled
// past the ends.
inline CUtensorMap make_map_3d_u8(const void* base, const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2],
                                  const cuuint32_t (&box)[3], const std::string& what) {
  return detail::encode_tiled(base, 3, dims, strides, box, true, what, CU_TENSOR_MAP_DATA_TYPE_UINT8,
                              box[0] == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B);
}

}  // namespace tw::sm90
