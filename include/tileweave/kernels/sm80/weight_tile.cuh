// Portable (sm_80+) mainloop of a weight-streaming GEMM tile: cp.async into a ring of shared-
// memory stages, ldmatrix + mma.sync m16n8k16 (bf16 in, fp32 accumulate).
//
// "Swap A/B": the weight tile is the MMA's 16-row A operand (64 weight rows per block, 16 per warp)
// and the few activation rows are its N = 8 side, so a decode batch of M = 1..64 wastes at most 7
// columns instead of padding M to 64. The weight loads of the first stages are issued before the
// caller's dependency wait, so the weight stream hides the wait; activations are loaded after it.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace tw::kernels::sm80 {

constexpr int kThreads = 128;     // 4 warps, 16 weight rows each
constexpr int kWeightRows = 64;

// NT: activation rows per tile = 8 * NT. BK: K per warp per stage (64 or 128: 128- or 256-byte
// rows). KS: warps that share one 16-row weight group, each on its own quarter of the stage's K.
//   KS = 1: 64 weight rows per block, a stage is 64 x BK.
//   KS = 4: 16 weight rows per block, a stage is 16 x 4BK, the 4 partial sums are added in shared
//           memory at the end (KS = 2: 32 rows, 2 warps per group, likewise). The same bytes per tile then cover 4x the K, so a decode GEMM needs
//           4x fewer split-K slices, and the slices' fp32 reductions (which grow with M) shrink.
template <int NT, int BK, int KS = 1>
struct TileShape {
  static_assert(BK == 64 || BK == 128, "BK is 64 or 128");
  static_assert(KS == 1 || ((KS == 2 || KS == 4) && BK == 64), "KS is 1, or 2/4 with BK = 64");
  static constexpr int act_rows = 8 * NT;
  static constexpr int weight_rows = kWeightRows / KS;
  static constexpr int stage_cols = BK * KS;
  static constexpr int chunks_per_row = stage_cols / 8;  // 16-byte chunks
  static constexpr int w_bytes = weight_rows * stage_cols * 2;
  static constexpr int x_bytes = act_rows * stage_cols * 2;
  static constexpr int stage_bytes = w_bytes + x_bytes;
  // 48 KiB of weights in flight per block (32 KiB with KS = 4, whose stages carry 4x the
  // activations): a block streaming alone (the last tiles of a launch) still moves ~30 GB/s.
  static constexpr int stages = KS > 1 ? 4 : BK == 64 ? 6 : 3;
  static constexpr int smem_bytes = stages * stage_bytes;
};

// Byte offset of 16-byte chunk `c` of row `r` in a stage with `COLS` bf16 columns. The XOR
// swizzle puts the 8 rows an ldmatrix phase reads into 8 different bank groups (no conflicts).
template <int COLS>
__device__ __forceinline__ uint32_t swizzle(int r, int c) { return r * (COLS * 2) + ((c ^ (r & 7)) << 4); }

// .cg: L2 only. Activations may have been written by other SMs in this launch, and L1 is not
// coherent with them; weights are read once, so L1 would not help them either.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// Weights are streamed once: evict-first keeps them from pushing activations and split-K
// accumulators (which are re-read) out of L2.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
__device__ __forceinline__ void cp_async16_stream(uint32_t dst, const void* src, bool valid, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0), "l"(policy));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
// Transposed: each 8x8 matrix of 16-bit elements is read column-wise (an MMA's B operand from a
// row-major K x N tile, e.g. attention's V).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Which weight row feeds tile row r (0..64/KS-1), or -1 for a row past the matrix (zero-filled).
// With G = warp / KS: acc[j][0..1] belong to tile row 16G + g, acc[j][2..3] to 16G + g + 8
// (g = lane / 4); acc[j][e & 1] is activation row 8j + 2t + (e & 1) (t = lane % 4). With KS > 1
// only the warps with warp % KS == 0 hold the (reduced) result.
struct WeightTileArgs {
  const __nv_bfloat16* w;  // [rows, ldw] row-major
  int64_t ldw;
  const __nv_bfloat16* x;  // [M, ldx] row-major activations
  int64_t ldx;
  int64_t m0, m;           // activation rows [m0, min(m0 + 8*NT, m))
  int64_t k0, k1;          // K range, k1 - k0 > 0, multiples of 8 apart from K's end
};

// Computes acc = W[rows(r), k0:k1] . X[m0:m0+8NT, k0:k1]^T for this block's 64 tile rows.
// `row_of(r)` maps tile row -> weight row (or -1); `wait()` is called by all threads after the
// weight prologue is in flight and must return false to abort (nothing more is read then).
template <int NT, int BK, int KS, class RowOf, class Wait>
__device__ __forceinline__ bool weight_tile_mainloop(float (&acc)[NT][4], const WeightTileArgs& a, RowOf row_of,
                                                     Wait wait, char* smem) {
  using S = TileShape<NT, BK, KS>;
  constexpr int kStages = S::stages;
  constexpr int SC = S::stage_cols;
  constexpr int CPR = S::chunks_per_row;
  constexpr int WL = S::weight_rows * CPR / kThreads;  // weight chunks per thread per stage
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wrow0 = (warp / KS) * 16, kchunk0 = (warp % KS) * (BK / 8);  // this warp's rows and K quarter
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int nk = static_cast<int>((a.k1 - a.k0 + SC - 1) / SC);
  const uint64_t stream_policy = evict_first_policy();

#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  // Each thread loads the same weight rows' chunks in every stage: resolve the rows once.
  const __nv_bfloat16* wrow[WL];
  bool wvalid[WL];
#pragma unroll
  for (int i = 0; i < WL; ++i) {
    const int r = (tid + i * kThreads) / CPR;
    const int64_t gr = row_of(r);
    wvalid[i] = gr >= 0;
    wrow[i] = a.w + (gr >= 0 ? gr : 0) * a.ldw;
  }
  auto load_w = [&](int s, int kt) {
    const int64_t kb = a.k0 + int64_t(kt) * SC;
    const uint32_t base = smem_base + s * S::stage_bytes;
#pragma unroll
    for (int i = 0; i < WL; ++i) {
      const int idx = tid + i * kThreads, r = idx / CPR, c = idx % CPR;
      const int64_t k = kb + c * 8;
      const bool ok = wvalid[i] && k < a.k1;
      cp_async16_stream(base + swizzle<SC>(r, c), ok ? wrow[i] + k : a.w, ok, stream_policy);
    }
  };
  auto load_x = [&](int s, int kt) {
    const int64_t kb = a.k0 + int64_t(kt) * SC;
    const uint32_t base = smem_base + s * S::stage_bytes + S::w_bytes;
    constexpr int chunks = S::act_rows * CPR;
#pragma unroll
    for (int i = 0; i < (chunks + kThreads - 1) / kThreads; ++i) {
      const int idx = tid + i * kThreads;
      if (chunks % kThreads == 0 || idx < chunks) {
        const int r = idx / CPR, c = idx % CPR;
        const int64_t row = a.m0 + r, k = kb + c * 8;
        const bool ok = row < a.m && k < a.k1;
        cp_async16(base + swizzle<SC>(r, c), ok ? a.x + row * a.ldx + k : a.x, ok);
      }
    }
  };

  // Prologue: weights for kStages-1 stages go out before the dependency wait.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_w(s, s);
    cp_async_commit();
  }
  if (!wait()) {
    cp_async_wait<0>();
    return false;
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < nk) load_x(s, s);
  cp_async_commit();

  for (int kt = 0; kt < nk; ++kt) {
    // Group accounting: the prologue's activations were committed last, so the first stage
    // needs every group; after that one group is committed per iteration (empty ones included).
    if (kt == 0)
      cp_async_wait<0>();
    else
      cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is visible to all warps, and stage kt-1 is free for reuse
    const int nxt = kt + kStages - 1;
    if (nxt < nk) {
      load_w(nxt % kStages, nxt);
      load_x(nxt % kStages, nxt);
    }
    cp_async_commit();

    const uint32_t w_base = smem_base + (kt % kStages) * S::stage_bytes;
    const uint32_t x_base = w_base + S::w_bytes;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[4];
      ldmatrix_x4(w_base + swizzle<SC>(wrow0 + (lane % 8) + 8 * ((lane / 8) % 2), kchunk0 + kk * 2 + lane / 16),
                  af[0], af[1], af[2], af[3]);
      if constexpr (NT == 1) {
        uint32_t b0, b1;
        ldmatrix_x2(x_base + swizzle<SC>(lane % 8, kchunk0 + kk * 2 + (lane / 8) % 2), b0, b1);
        mma_bf16(acc[0], af, b0, b1);
      } else {
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          uint32_t b0, b1, b2, b3;
          ldmatrix_x4(x_base + swizzle<SC>(8 * (j + lane / 16) + lane % 8, kchunk0 + kk * 2 + (lane / 8) % 2), b0, b1,
                      b2, b3);
          mma_bf16(acc[j], af, b0, b1);
          mma_bf16(acc[j + 1], af, b2, b3);
        }
      }
    }
  }
  if constexpr (KS > 1) {
    // Add the K shares of each 16-row group: the group's other warps park their sums in the (now
    // idle) stage memory, one slot per warp, and the group's first warp adds them.
    __syncthreads();  // every warp is done reading the last stage
    float* park = reinterpret_cast<float*>(smem);
    if (warp % KS) {
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) park[(warp * NT * 4 + j * 4 + e) * 32 + lane] = acc[j][e];
    }
    __syncthreads();
    if (warp % KS == 0) {
#pragma unroll
      for (int w = warp + 1; w < warp + KS; ++w)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[j][e] += park[(w * NT * 4 + j * 4 + e) * 32 + lane];
    }
  }
  return true;
}

}  // namespace tw::kernels::sm80
