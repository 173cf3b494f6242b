// Prefill attention for Ampere / Ada (sm_80+; runs on Hopper too): the same inputs and outputs as
// prefill_sm90.cuh (bf16 Q, K, V in the packed THD layout, packed sequences, GQA, causal, the
// log-sum-exp), with mma.sync m16n8k16 and cp.async instead of wgmma and TMA.
//
// One block of 4 warps per (64-row query tile, query head) item. 80 KiB of shared memory at d = 128:
// two blocks per SM on an A100 or H100, one on sm_86 / sm_89 (100 KiB per SM; at d = 64, 40 KiB: two).
// Each warp owns 16 query rows: their Q fragments stay in registers for the whole key loop, S = Q K^T
// of a 64-key tile lands in its accumulators, the online softmax (fp32, exp2) runs on them in place,
// and P goes back into the PV MMAs as A fragments without touching shared memory (the accumulator and
// A fragment layouts agree pairwise). K and V tiles stream through two shared-memory stages: tile
// j + 1 is requested before tile j is computed. Rows are stored with 16-byte chunks XOR-swizzled by
// the row (sm80::swizzle), so ldmatrix reads them without bank conflicts (K as S's B operand, V
// transposed as PV's).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "tileweave/kernels/attention/prefill_sm90.cuh"  // PrefillParams
#include "tileweave/kernels/sm80/weight_tile.cuh"        // cp.async, ldmatrix, mma.sync, swizzle

namespace tw::kernels {

template <int kD>
struct PrefillSm80Config {
  static_assert(kD == 64 || kD == 128, "head_dim 64 or 128");
  static constexpr int kBM = 64, kBN = 64, kThreads = 128;  // 4 warps x 16 query rows
  static constexpr int kChunks = kD / 8;                    // 16-byte chunks per row
  static constexpr int kTileBytes = kBM * kD * 2;           // Q, or one K or V tile (kBN == kBM)
  static constexpr int kSmemBytes = 5 * kTileBytes;         // Q, two stages of K and V
};

namespace prefill_sm80_detail {

// Rows [row0, row0 + 64) of head `head` of a [rows][heads][kD] tensor into a swizzled tile; rows at
// or past row_end are zero-filled (no bytes read).
template <int kD>
__device__ __forceinline__ void load_tile(uint32_t dst, const __nv_bfloat16* src, int64_t row0, int64_t row_end,
                                          int heads, int head) {
  using C = PrefillSm80Config<kD>;
#pragma unroll
  for (int i = 0; i < C::kBM * C::kChunks / C::kThreads; ++i) {
    const int task = threadIdx.x + C::kThreads * i, r = task / C::kChunks, c = task % C::kChunks;
    const bool valid = row0 + r < row_end;
    const __nv_bfloat16* g = valid ? src + ((row0 + r) * heads + head) * kD + 8 * c : src;
    sm80::cp_async16(dst + sm80::swizzle<kD>(r, c), g, valid);
  }
}

}  // namespace prefill_sm80_detail

template <int kD>
__global__ void __launch_bounds__(128, 2)
    prefill_attention_sm80(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                           const __nv_bfloat16* __restrict__ v, const PrefillParams p) {
  using namespace prefill_sm80_detail;
  using namespace prefill_detail;
  using C = PrefillSm80Config<kD>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kKSteps = kD / 16, kNT = kBN / 8, kDT = kD / 8;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t s_q = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  auto s_k = [&](int stage) { return s_q + (1 + 2 * stage) * C::kTileBytes; };
  auto s_v = [&](int stage) { return s_q + (2 + 2 * stage) * C::kTileBytes; };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  // Item blockIdx.x: query tile w % num_tiles of head w / num_tiles (the plan's order, as sm90's).
  const int w = blockIdx.x, tile = w % p.num_tiles, head = w / p.num_tiles;
  const int seq = p.tiles[3 * tile], q_tile = p.tiles[3 * tile + 1], n_kv = p.tiles[3 * tile + 2];
  const int q_begin = p.cu_q[seq], len_q = p.cu_q[seq + 1] - q_begin;
  const int k_begin = p.cu_k[seq], len_k = p.cu_k[seq + 1] - k_begin;
  const int heads_kv = p.heads_q / p.group, kv_head = head / p.group;
  const int r0 = q_tile * kBM + warp * 16 + g;  // this thread's rows r0 and r0 + 8 of the sequence
  const int diag = len_k - len_q;               // causal: key <= row + diag

  float o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // running max (log2 units), partial sums

  if (n_kv > 0) {
    load_tile<kD>(s_q, q, int64_t(q_begin) + q_tile * kBM, int64_t(q_begin) + len_q, p.heads_q, head);
    load_tile<kD>(s_k(0), k, k_begin, int64_t(k_begin) + len_k, heads_kv, kv_head);
    load_tile<kD>(s_v(0), v, k_begin, int64_t(k_begin) + len_k, heads_kv, kv_head);
    sm80::cp_async_commit();
  }
  uint32_t qa[kKSteps][4];  // this warp's 16 Q rows as A fragments
  for (int j = 0; j < n_kv; ++j) {
    const int stage = j & 1;
    sm80::cp_async_wait<0>();
    // Tile j (and Q) landed for every thread; every warp is done with tile j - 1, whose stage the
    // next requests overwrite.
    __syncthreads();
    if (j + 1 < n_kv) {
      const int64_t row0 = int64_t(k_begin) + (j + 1) * kBN, row_end = int64_t(k_begin) + len_k;
      load_tile<kD>(s_k(stage ^ 1), k, row0, row_end, heads_kv, kv_head);
      load_tile<kD>(s_v(stage ^ 1), v, row0, row_end, heads_kv, kv_head);
      sm80::cp_async_commit();
    }
    if (j == 0) {
      // ldmatrix.x4 matrices: rows 0-7 / 8-15 of the warp's 16, chunks 2s / 2s + 1 (lane / 8 picks).
      const int mi = lane / 8, row = warp * 16 + (mi % 2) * 8 + lane % 8;
#pragma unroll
      for (int s = 0; s < kKSteps; ++s)
        sm80::ldmatrix_x4(s_q + sm80::swizzle<kD>(row, 2 * s + mi / 2), qa[s][0], qa[s][1], qa[s][2], qa[s][3]);
    }

    // S = Q K^T: B fragments of two 8-key n-tiles per ldmatrix.x4 (keys 8 nt .. 8 nt + 15).
    float s[kNT][4];
#pragma unroll
    for (int i = 0; i < kNT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    {
      const int mi = lane / 8;
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
        for (int nt = 0; nt < kNT; nt += 2) {
          uint32_t b0, b1, b2, b3;
          const int key = 8 * (nt + mi / 2) + lane % 8;
          sm80::ldmatrix_x4(s_k(stage) + sm80::swizzle<kD>(key, 2 * kk + mi % 2), b0, b1, b2, b3);
          sm80::mma_bf16(s[nt], qa[kk], b0, b1);
          sm80::mma_bf16(s[nt + 1], qa[kk], b2, b3);
        }
    }

    // Scale into log2 units; hide keys past the sequence and, causal, past the diagonal.
    const bool ragged = (j + 1) * kBN > len_k;
    const bool diagonal = p.causal && (j + 1) * kBN - 1 > q_tile * kBM + warp * 16 + diag;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nt][e] *= p.scale_log2;
        if (ragged || diagonal) {
          const int key = j * kBN + 8 * nt + 2 * t + (e & 1), row = r0 + 8 * (e >> 1);
          if (key >= len_k || (p.causal && key > row + diag)) s[nt][e] = -INFINITY;
        }
      }
    // Online softmax of rows g (e = 0, 1) and g + 8 (e = 2, 3).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      const float m_new = fmaxf(m[h], quad_max(mx));
      const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with no visible key yet stays at 0
      const float alpha = ex2(m[h] - base);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        s[nt][2 * h] = ex2(s[nt][2 * h] - base);
        s[nt][2 * h + 1] = ex2(s[nt][2 * h + 1] - base);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l[h] = l[h] * alpha + sum;
      m[h] = m_new;
#pragma unroll
      for (int i = 0; i < kDT; ++i) o[i][2 * h] *= alpha, o[i][2 * h + 1] *= alpha;
    }

    // O += P V: P's A fragment of keys 16 kk .. 16 kk + 15 is S's n-tiles 2 kk, 2 kk + 1 packed;
    // V's B fragments by ldmatrix.x4.trans, two 8-column n-tiles per load.
    {
      const int mi = lane / 8;
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        const int key = 16 * kk + (mi % 2) * 8 + lane % 8;
#pragma unroll
        for (int dn = 0; dn < kDT; dn += 2) {
          uint32_t b0, b1, b2, b3;
          sm80::ldmatrix_x4_trans(s_v(stage) + sm80::swizzle<kD>(key, dn + mi / 2), b0, b1, b2, b3);
          sm80::mma_bf16(o[dn], pa, b0, b1);
          sm80::mma_bf16(o[dn + 1], pa, b2, b3);
        }
      }
    }
  }

  // Epilogue: rows past the sequence (the tile's overhang) are computed but not stored.
  const int64_t row_stride = int64_t(p.heads_q) * kD;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    const float sum = quad_sum(l[h]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    if (row >= len_q) continue;
    __nv_bfloat16* dst = p.out + int64_t(q_begin + row) * row_stride + int64_t(head) * kD + 2 * t;
#pragma unroll
    for (int i = 0; i < kDT; ++i)
      *reinterpret_cast<uint32_t*>(dst + 8 * i) = pack_bf16(o[i][2 * h] * inv, o[i][2 * h + 1] * inv);
    if (p.lse && t == 0)
      p.lse[int64_t(head) * p.total_q + q_begin + row] = sum > 0.f ? (m[h] + __log2f(sum)) * 0.69314718f : -INFINITY;
  }
}

}  // namespace tw::kernels
