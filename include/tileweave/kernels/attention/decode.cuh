// Split-KV decode attention tiles (flash-decoding with GQA, stream-K work split), callable from a
// standalone kernel or from the persistent executor:
//   decode_work_tile<D, G, paged, bulk>(p, tile, smem): streams tile `tile`'s even share of all
//     K/V units (params.hpp says how the units are cut), pair by pair, for all G query heads of
//     each pair's group in one pass, with the fused prologue (RoPE on q; the tile holding a pair's
//     new token ropes k_new, appends k_new/v_new to the cache and uses that row from smem). A pair
//     it holds whole gets its output; a part of a pair gets a partial output + LSE, and the last
//     tile to finish a pair (an atomic count) merges its partials. No tile waits for another.
// It runs on threads 0 .. 32 * kWarps - 1 of the block (others must skip it) and needs
// decode_smem_bytes<D, G, kWarps>(p.ring_slots) bytes of shared memory; the caller syncs before
// reusing it. kWarps: 4 (two tiles per SM, and the attention -> o_proj kernel) or 8 (one tile per
// SM: one warp per scheduler left the math and the copies' issue unhidden; 8 warps with fewer
// stages each read 2-13% faster on the H200).
//
// Inside a tile each of the kWarps warps streams its own 16-token units (unit u_lo + w, u_lo + w + kWarps, ...)
// through a private ring of p.ring_slots smem slots, so the main loop has no block barrier and the
// stream runs on across pair boundaries (the next pair's q is prefetched into registers). The ring
// is filled either by 16-byte cp.async (any sm_80+; swizzled, zero-filled tails) or, with `bulk`,
// by one lane's Hopper bulk copies completing on a per-slot mbarrier (sm_90). QK^T and PV run on
// mma.sync m16n8k16 with the group's heads as rows (0..7 for up to 8 heads, rows 8..15 then zero; all
// 16 for 9..16 heads): tensor cores keep the FMA and register cost of the heads off the memory
// stream. The K and V fragments are read
// with 16-byte loads by permuting the head dimension (the dot product and the output columns do
// not care about order; the output is un-permuted on the way out).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "tileweave/kernels/attention/decode_params.hpp"
#include "tileweave/runtime/grid_dependency.cuh"

namespace tw::kernels {

// Row blocks of 8 heads in the mma tiles: 1 up to 8 heads, 2 up to 16.
template <int G>
constexpr int decode_row_blocks() {
  return G > 8 ? 2 : 1;
}

// G: the group size the tile is compiled for, 1..8 exactly, or 16 for any of 9..16 (p.group).
template <int D, int G, int kWarps = kDecodeWarps>
struct DecodeSmem {
  static constexpr int kRows = 8 * decode_row_blocks<G>();
  static constexpr bool kQSmem = D > 128;  // the A fragments from smem (QFrags)
  alignas(16) __nv_bfloat16 q[kRows][D];  // roped q of the current pair, rows >= the group zero
  uint2 q_frag[kQSmem ? D / 16 * kRows / 8 * 32 : 1];  // kQSmem: [D / 16][row blocks][32 lanes]
  alignas(16) __nv_bfloat16 k_new[D];  // the appended row (roped k, v), patched into its ring slot
  alignas(16) __nv_bfloat16 v_new[D];
  float2 rope[D / 2];  // (cos, sin) of the segment's position per frequency
  // Each warp's output of a segment, for the combine. Rows padded by 16 bytes: the float4 stores
  // of a quarter warp (rows g, g + 1, d = 16t + ...) then fall in 2-way bank conflicts, not 8.
  alignas(16) float o[kWarps][G][D + 4];
  float m[kWarps][kRows];
  float l[kWarps][kRows];
  uint64_t bar[kWarps][kDecodeMaxSlots];  // bulk-copy variant: one mbarrier per ring slot
  int last[2];
  // The ring follows at decode_ring_offset: [warp][slot][K, V][16 tokens][D] bf16.
};

template <int D, int G, int kWarps = kDecodeWarps>
constexpr int decode_ring_offset() {
  return static_cast<int>((sizeof(DecodeSmem<D, G, kWarps>) + 127) / 128 * 128);
}
template <int D>
constexpr int decode_slot_bytes() {
  return 2 * kDecodeStageTokens * D * 2;  // K and V of one 16-token stage
}
template <int D, int G, int kWarps = kDecodeWarps>
constexpr int decode_smem_bytes(int slots) {
  return decode_ring_offset<D, G, kWarps>() + kWarps * slots * decode_slot_bytes<D>();
}

namespace decode_detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; src_bytes = 0 zero-fills (tokens past the end of the split).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
// Hopper bulk copies (the TMA engine, no tensor map) completing on an mbarrier: one lane moves a
// whole stage, no per-thread requests.
__device__ __forceinline__ void bar_init(uint64_t* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bar_inval(uint64_t* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#endif
}
__device__ __forceinline__ void bar_expect_tx(uint64_t* bar, uint32_t bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}
// Bounded: a copy that never lands (a wrong byte count) traps within seconds instead of holding
// the GPU for the rest of a device call.
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
#if __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    if (polls == (1u << 22)) __trap();
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  }
#endif
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
#else
  __trap();  // the host never picks the bulk variant below sm_90
#endif
}
// Orders this thread's generic smem writes before later async-proxy (bulk copy) writes there.
__device__ __forceinline__ void fence_proxy_async() {
#if __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Timeline stamps (p.trace, bench_attention_trace): one word of tile `tile`'s row. P: DecodeParams or
// DecodeShortParams.
template <class P>
__device__ __forceinline__ void trace_put(const P& p, int tile, int w, unsigned long long v) {
  if (p.trace != nullptr) p.trace[int64_t(tile) * kDecodeTraceWords + w] = v;
}
template <class P>
__device__ __forceinline__ void trace_now(const P& p, int tile, int w) {
  if (p.trace == nullptr) return;
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(v));
  trace_put(p, tile, w, v);
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// c += A . B, A 16x16 (row), B 16x8 (col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Barrier of the tile's kThreads threads (named barrier 1): a persistent kernel with larger
// blocks lets its other threads skip the tile; barrier 0 (__syncthreads) stays the caller's.
template <int kThreads>
__device__ __forceinline__ void tile_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory"); }

__device__ __forceinline__ uint4 lds128(const __nv_bfloat16* p) { return *reinterpret_cast<const uint4*>(p); }

// Position of 16-byte chunk `chunk` of token row `token` in a ring slot: XOR of the low 3 chunk bits
// so that both fragment read patterns below (K: 2 tokens x 4 chunks per 8 lanes; V: 4 tokens x 2
// chunks) hit 8 distinct bank groups.
__device__ __forceinline__ int swizzle_chunk(int chunk, int token) {
  const int r = token & 7;
  return chunk ^ ((((r >> 1) & 3) << 1) ^ ((r & 1) << 2));
}

// Element offset of token `token` of pair (b * Hkv + h) in the K (or V) cache.
template <bool kPaged, int D>
__device__ __forceinline__ int64_t kv_offset(const DecodeParams& p, int pair, int token) {
  if constexpr (kPaged) {
    const int b = pair / p.num_kv_heads, h = pair - b * p.num_kv_heads;
    const int page = p.page_table[int64_t(b) * p.pages_per_seq + token / p.page_size];
    return ((int64_t(page) * p.num_kv_heads + h) * p.page_size + token % p.page_size) * D;
  } else {
    return (int64_t(pair) * p.max_seq_len + token) * D;
  }
}


// q of the group's heads as mma A fragments, kR row blocks of 8 heads. Fragment (s, i) of k-step s:
// i = 2r + h, row g + 8r, A columns 2t, 2t+1 (h = 0) or 2t+8, 2t+9 (h = 1), which hold
// d = 8c + 4h' + {0, 1} and {2, 3} of chunk c = t + 4 (s / 2), h' = s % 2 (the permuted head
// dimension: the K and V reads below take whole 16-byte chunks). Held in registers, or (kSmem: head
// dim 256, where 64 registers of q would spill the accumulators) in shared memory in fragment order,
// one conflict-free 8-byte load per fragment pair.
template <int D, int kR, bool kSmem>
struct QFrags {
  uint32_t a[D / 16][2 * kR];
  __device__ __forceinline__ uint2 at(int s, int r) const { return make_uint2(a[s][2 * r], a[s][2 * r + 1]); }
};
template <int D, int kR>
struct QFrags<D, kR, true> {
  const uint2* frag;  // [D / 16][kR][32 lanes]
  __device__ __forceinline__ uint2 at(int s, int r) const { return frag[(s * kR + r) * 32 + threadIdx.x % 32]; }
};
// Fragments (s, 2r) and (s, 2r + 1) of lane 4g + t, from q's rows of D bf16 (row = g + 8r).
template <int D>
__device__ __forceinline__ uint2 q_fragment(const __nv_bfloat16* q, int row, int s, int t) {
  const int d = 8 * (t + 4 * (s / 2)) + 4 * (s % 2);
  return *reinterpret_cast<const uint2*>(q + row * D + d);
}

// One 16-token stage of a warp's ring: its K and V rows (swizzled for cp.async, the global layout
// for bulk copies), `valid` of its tokens real.
struct StageRef {
  const __nv_bfloat16* ks;
  const __nv_bfloat16* vs;
  int valid;
};

// One warp's online-softmax step over kU stages: S = q K^T for the group's heads (rows of the mma
// tile: kR row blocks of 8; qa holds q as A fragments), the running max m (log2 domain) and this
// thread's share l of the row sum rescaled per row block (once for all kU stages), O = O * alpha +
// P V. Row block r of the accumulators is elements 2r, 2r + 1: rows g and g + 8.
template <int D, bool kBulk, int kR, bool kQSmem, int kU>
__device__ __forceinline__ void attend_units(const QFrags<D, kR, kQSmem>& qa, const StageRef (&st)[kU], float scale_log2,
                                             float (&o)[D / 8][4], float (&m)[kR], float (&l)[kR]) {
  static_assert(kR == 1 || kR == 2, "one or two row blocks");
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  auto chunk_at = [](int ch, int tok) { return kBulk ? ch : swizzle_chunk(ch, tok); };
  // S = q K^T: n-tile nt of stage u covers its tokens 8nt..8nt+7; this thread supplies token 8nt + g.
  // A fragments: rows g (a0, a2) and g + 8 (a1, a3; zero with one row block).
  float s[kU][2][4];
#pragma unroll
  for (int u = 0; u < kU; ++u)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[u][nt][0] = s[u][nt][1] = s[u][nt][2] = s[u][nt][3] = 0.f;
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    uint2 lo[2], hi[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lo[h] = qa.at(2 * j + h, 0);
      hi[h] = kR == 2 ? qa.at(2 * j + h, kR - 1) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int tok = 8 * nt + g;
        const uint4 kv = lds128(st[u].ks + tok * D + chunk_at(t + 4 * j, tok) * 8);
        mma_bf16(s[u][nt], lo[0].x, hi[0].x, lo[0].y, hi[0].y, kv.x, kv.y);
        mma_bf16(s[u][nt], lo[1].x, hi[1].x, lo[1].y, hi[1].y, kv.z, kv.w);
      }
  }

  // Online softmax of rows g + 8r over tokens 8nt + 2t + e (e < 2) of every stage; the quad (same g)
  // shares a row.
  uint32_t pa[kU][2][2];  // P as A fragments: [stage][row block][n-tile]
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    float x[kU][2][2], mx = -INFINITY;
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          x[u][nt][e] = 8 * nt + 2 * t + e < st[u].valid ? s[u][nt][2 * r + e] * scale_log2 : -INFINITY;
          mx = fmaxf(mx, x[u][nt][e]);
        }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[r], mx);  // finite: every stage holds at least one token
    const float alpha = exp2f(m[r] - m_new);
    float psum = 0.f;
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          x[u][nt][e] = exp2f(x[u][nt][e] - m_new);
          psum += x[u][nt][e];
        }
    l[r] = l[r] * alpha + psum;
    m[r] = m_new;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][2 * r] *= alpha;
      o[j][2 * r + 1] *= alpha;
    }
    // The S accumulator layout (row g, tokens 2t+{0,1} of n-tile 0 and 1) is exactly A columns
    // 2t+{0,1} and 2t+8+{0,1}.
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      pa[u][r][0] = pack_bf16(x[u][0][0], x[u][0][1]);
      pa[u][r][1] = pack_bf16(x[u][1][0], x[u][1][1]);
    }
  }

  // O += P V. B fragment of n-tile 8q + e, column g: element e of chunk g + 8q of tokens 2t, 2t+1
  // (b0) and 2t+8, 2t+9 (b1); zero-filled rows past `valid` meet p = 0.
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const __nv_bfloat16* vs = st[u].vs;
    const int valid = st[u].valid;
    const uint32_t pa1 = kR == 2 ? pa[u][1][0] : 0u, pa3 = kR == 2 ? pa[u][1][1] : 0u;
#pragma unroll
    for (int q = 0; q < D / 64; ++q) {
      const int ch = g + 8 * q;
      uint4 v0 = lds128(vs + (2 * t) * D + chunk_at(ch, 2 * t) * 8);
      uint4 v1 = lds128(vs + (2 * t + 1) * D + chunk_at(ch, 2 * t + 1) * 8);
      uint4 v2 = lds128(vs + (2 * t + 8) * D + chunk_at(ch, 2 * t + 8) * 8);
      uint4 v3 = lds128(vs + (2 * t + 9) * D + chunk_at(ch, 2 * t + 9) * 8);
      if constexpr (kBulk) {  // stale rows past `valid` may hold NaN, and 0 * NaN is NaN
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        if (2 * t >= valid) v0 = zero;
        if (2 * t + 1 >= valid) v1 = zero;
        if (2 * t + 8 >= valid) v2 = zero;
        if (2 * t + 9 >= valid) v3 = zero;
      }
      const uint32_t w0[4] = {v0.x, v0.y, v0.z, v0.w}, w1[4] = {v1.x, v1.y, v1.z, v1.w};
      const uint32_t w2[4] = {v2.x, v2.y, v2.z, v2.w}, w3[4] = {v3.x, v3.y, v3.z, v3.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t sel = (e & 1) ? 0x7632u : 0x5410u;  // high or low halves of the two words
        const uint32_t b0 = __byte_perm(w0[e / 2], w1[e / 2], sel);
        const uint32_t b1 = __byte_perm(w2[e / 2], w3[e / 2], sel);
        mma_bf16(o[8 * q + e], pa[u][0][0], pa1, pa[u][0][1], pa3, b0, b1);
      }
    }
  }
}
// One stage (the decode step's attention tiles call this).
template <int D, bool kBulk, int kR = 1, bool kQSmem = false>
__device__ __forceinline__ void attend_unit(const QFrags<D, kR, kQSmem>& qa, const __nv_bfloat16* ks,
                                            const __nv_bfloat16* vs, int valid, float scale_log2,
                                            float (&o)[D / 8][4], float (&m)[kR], float (&l)[kR]) {
  const StageRef st[1] = {{ks, vs, valid}};
  attend_units<D, kBulk, kR, kQSmem, 1>(qa, st, scale_log2, o, m, l);
}

template <int N = 0>
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
  if constexpr (N < kDecodeMaxSlots) {
    if (n == N) {
      cp_async_wait<N>();
      return;
    }
    cp_async_wait_dyn<N + 1>(n);
  }
}

// Rotate-half RoPE of the pair (x[i], x[i + D/2]) by the angle whose (cos, sin) is cs.
__device__ __forceinline__ void rope_pair(float2 cs, float& x1, float& x2) {
  const float y1 = x1 * cs.x - x2 * cs.y, y2 = x2 * cs.x + x1 * cs.y;
  x1 = y1;
  x2 = y2;
}

// RoPE of 16-byte chunk c of a row's first half (lo: d = 8c .. 8c + 7) with its partners in the
// second (hi: d + D/2), from the position's (cos, sin) per frequency; rounded to bf16.
__device__ __forceinline__ void rope_chunks(const float2* cs, int c, uint4& lo, uint4& hi) {
  uint32_t a[4] = {lo.x, lo.y, lo.z, lo.w}, b[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(&a[e]);
    const __nv_bfloat162 y = *reinterpret_cast<const __nv_bfloat162*>(&b[e]);
    float x0 = __low2float(x), x1 = __high2float(x), y0 = __low2float(y), y1 = __high2float(y);
    rope_pair(cs[8 * c + 2 * e], x0, y0);
    rope_pair(cs[8 * c + 2 * e + 1], x1, y1);
    a[e] = pack_bf16(x0, x1);
    b[e] = pack_bf16(y0, y1);
  }
  lo = make_uint4(a[0], a[1], a[2], a[3]);
  hi = make_uint4(b[0], b[1], b[2], b[3]);
}

// One pair and its units [u0, u1).
struct DecodePair {
  int pair, u0, u1, len;
};
// The tables: constant, or (kMaybeCut: the standalone op, whose plan may take its lengths on the
// device) written by the launch's cut kernel, then read through L2, not the read-only path. The
// executor's tiles never see a device cut: compiled without the branch, they keep their registers.
template <bool kMaybeCut>
__device__ __forceinline__ int2 pair_info_at(const DecodeParams& p, int i) {
  return kMaybeCut && p.cut ? __ldcg(&p.pair_info[i]) : __ldg(&p.pair_info[i]);
}
template <bool kMaybeCut>
__device__ __forceinline__ DecodePair next_pair(const DecodeParams& p, const DecodePair& c) {
  if (p.uniform_len > 0) return {c.pair + 1, c.u1, c.u1 + (c.u1 - c.u0), c.len};
  return {c.pair + 1, c.u1, pair_info_at<kMaybeCut>(p, c.pair + 2).x, pair_info_at<kMaybeCut>(p, c.pair + 1).y};
}
// The pair holding tile `tile`'s first unit u_lo.
template <bool kMaybeCut>
__device__ __forceinline__ DecodePair first_pair(const DecodeParams& p, int tile, int u_lo) {
  if (p.uniform_len > 0) {
    const int n = decode_units(p.uniform_len), pair = u_lo / n;
    return {pair, pair * n, pair * n + n, p.uniform_len};
  }
  const int4 f = kMaybeCut && p.cut ? __ldcg(&p.tile_first[tile]) : __ldg(&p.tile_first[tile]);
  return {f.x, f.y, f.z, f.w};
}
// The launch's cut: {tiles, units}.
template <bool kMaybeCut>
__device__ __forceinline__ int cut_tiles(const DecodeParams& p) {
  return kMaybeCut && p.cut ? __ldcg(&p.cut[0]) : p.num_tiles;
}
template <bool kMaybeCut>
__device__ __forceinline__ int cut_units(const DecodeParams& p) {
  return kMaybeCut && p.cut ? __ldcg(&p.cut[1]) : p.total_units;
}

// The rows a pair's prologue needs, loaded a segment ahead into registers so that a pair boundary
// does not stall on them: 16-byte chunk c of each half of a row (RoPE pairs i, i + D/2) per task.
// Task i = row * D/16 + c, rows 0 .. G-1 q's, row G k_new, row G + 1 v_new; thread tid holds tasks
// tid + kThreads j (one each, up to 8 heads at D <= 128 with 4 warps).
template <int D, int G, int kThreads>
struct DecodeRows {
  static constexpr int kC = D / 16;
  static constexpr int kPer = ((G + 2) * kC + kThreads - 1) / kThreads;
  uint4 lo[kPer], hi[kPer];
};
template <int D, int G, int kThreads>
__device__ __forceinline__ DecodeRows<D, G, kThreads> load_rows(const DecodeParams& p, int group, int pair) {
  using Rows = DecodeRows<D, G, kThreads>;
  DecodeRows<D, G, kThreads> r;
#pragma unroll
  for (int j = 0; j < Rows::kPer; ++j) {
    const int task = threadIdx.x + kThreads * j, row = task / Rows::kC, c = task % Rows::kC;
    const __nv_bfloat16* src = nullptr;
    if (row < group)
      src = p.q + (int64_t(pair) * group + row) * D;
    else if (p.k_new != nullptr && row <= group + 1)
      src = (row == group ? p.k_new : p.v_new) + int64_t(pair) * D;
    r.lo[j] = r.hi[j] = make_uint4(0, 0, 0, 0);
    if (src != nullptr) {
      r.lo[j] = __ldg(reinterpret_cast<const uint4*>(src + 8 * c));
      r.hi[j] = __ldg(reinterpret_cast<const uint4*>(src + D / 2 + 8 * c));
    }
  }
  return r;
}

// The prologue of a segment: roped q of the pair into smem; when the segment holds the pair's new
// token (position pos), the roped k and v are appended to the cache and kept in smem: the ring's
// copy of that row (maybe the stale row) is patched before use.
template <int D, int G, bool kPaged, int kThreads, class Smem>
__device__ __forceinline__ void setup_segment(const DecodeParams& p, Smem& sm, const DecodeRows<D, G, kThreads>& r,
                                              int group, int pair, int pos, bool appends) {
  using Rows = DecodeRows<D, G, kThreads>;
  // The angles once per segment, one sincosf per thread, shared by the q rows and k: eight or more
  // per thread in each row's task cost ~1 us of the prologue at D = 64 and ~3 us at D = 256 (a few
  // tokens' whole launch is ~4.5 / ~9 us), bench_attention_trace.
  if (p.rope) {
    for (int i = threadIdx.x; i < D / 2; i += kThreads) {
      float s, c;
      sincosf(float(pos) * __ldg(&p.inv_freq[i]), &s, &c);
      sm.rope[i] = make_float2(c, s);
    }
    tile_sync<kThreads>();
  }
#pragma unroll
  for (int j = 0; j < Rows::kPer; ++j) {
    const int task = threadIdx.x + kThreads * j, row = task / Rows::kC, c = task % Rows::kC;
    const bool is_q = row < group;
    const bool is_k = appends && row == group, is_v = appends && row == group + 1;
    if (!(is_q || is_k || is_v)) continue;
    uint4 vlo = r.lo[j], vhi = r.hi[j];
    if (!is_v && p.rope) rope_chunks(sm.rope, c, vlo, vhi);
    __nv_bfloat16* dst = is_q ? sm.q[row] : (is_k ? sm.k_new : sm.v_new);
    *reinterpret_cast<uint4*>(dst + 8 * c) = vlo;
    *reinterpret_cast<uint4*>(dst + D / 2 + 8 * c) = vhi;
    if (!is_q) {
      __nv_bfloat16* cache = (is_k ? p.k_cache : p.v_cache) + kv_offset<kPaged, D>(p, pair, pos);
      *reinterpret_cast<uint4*>(cache + 8 * c) = vlo;
      *reinterpret_cast<uint4*>(cache + D / 2 + 8 * c) = vhi;
    }
  }
  tile_sync<kThreads>();
}

__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float4 v) {
  uint2 u;
  u.x = pack_bf16(v.x, v.y);
  u.y = pack_bf16(v.z, v.w);
  *reinterpret_cast<uint2*>(dst) = u;
}

// Merges the partial outputs of `pair`, tiles c0 .. c0 + n - 1's (tile c0's is its second
// segment when shift), as the last of those tiles. The partials were written by other blocks in this
// launch (read through L2 after the caller's acquire). They are staged into `stage` (stage_bytes of
// free smem: the ring, or more, DecodeParams::merge_stage_bytes) in chunks by cp.async -- every
// 16-byte copy of a chunk in flight at once, no registers held. Per chunk, the heads' largest LSE
// and each partial's weight exp2(lse - max) are computed once in smem; each thread then sums
// weight x partial for its float4s e = tid + kThreads i of the group x D output (no dependent chain
// of exponentials) and folds the chunk into its running result. (Loads into registers, each warp a
// quarter of the partials, kept ~16 KiB in flight per SM: at head dim 256 a pair cut over 66 tiles
// took 86 us to merge, H200, bench_attention_trace.)
template <int D, int G, int kWarps>
__device__ void merge_pair(const DecodeParams& p, char* stage, int stage_bytes, int group, int pair, int c0, int n,
                           int shift) {
  constexpr int kThreads = kWarps * 32;
  constexpr int kPer = (G * D / 4 + kThreads - 1) / kThreads;  // float4s per thread (G: the group's bound)
  const int tid = threadIdx.x, nvec = group * D / 4;
  const int part_bytes = nvec * 16 + group * 4;  // a partial and its LSEs
  const int per_chunk = max(1, (stage_bytes - 64) / part_bytes);
  float4* o_s = reinterpret_cast<float4*>(stage);  // [per_chunk][nvec]
  float* w_s = reinterpret_cast<float*>(stage + int64_t(per_chunk) * nvec * 16);  // [per_chunk][group]
  float* max_s = w_s + per_chunk * group;  // [group]
  auto slot_of = [&](int s) { return 2 * int64_t(c0 + s) + (s == 0 ? shift : 0); };
  float m[kPer], sw[kPer];
  float4 acc[kPer];
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    m[r] = -INFINITY;
    sw[r] = 0.f;
    acc[r] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int c = 0; c < n; c += per_chunk) {
    const int nc = min(per_chunk, n - c);
    for (int i = tid; i < nc * nvec; i += kThreads) {
      const int s = i / nvec, e = i - s * nvec;
      cp_async16(o_s + i, p.o_part + slot_of(c + s) * group * D + 4 * e, 16);
    }
    cp_async_commit();
    for (int i = tid; i < nc * group; i += kThreads) {
      const int s = i / group;
      w_s[i] = __ldcg(p.lse_part + slot_of(c + s) * group + (i - s * group));
    }
    tile_sync<kThreads>();
    if (tid < group) {
      float mx = -INFINITY;
      for (int s = 0; s < nc; ++s) mx = fmaxf(mx, w_s[s * group + tid]);
      max_s[tid] = mx;
    }
    tile_sync<kThreads>();
    for (int i = tid; i < nc * group; i += kThreads) w_s[i] = exp2f(w_s[i] - max_s[i % group]);
    cp_async_wait<0>();
    tile_sync<kThreads>();
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      const int e = tid + kThreads * r, h = e / (D / 4);
      if (e < nvec) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        float ws = 0.f;
        for (int s = 0; s < nc; ++s) {
          const float w = w_s[s * group + h];
          const float4 v = o_s[s * nvec + e];
          a = make_float4(a.x + w * v.x, a.y + w * v.y, a.z + w * v.z, a.w + w * v.w);
          ws += w;
        }
        const float mn = fmaxf(m[r], max_s[h]), fo = exp2f(m[r] - mn), fc = exp2f(max_s[h] - mn);
        acc[r] = make_float4(acc[r].x * fo + a.x * fc, acc[r].y * fo + a.y * fc, acc[r].z * fo + a.z * fc,
                             acc[r].w * fo + a.w * fc);
        sw[r] = sw[r] * fo + ws * fc;
        m[r] = mn;
      }
    }
    tile_sync<kThreads>();  // the chunk is read: the stage may take the next one
  }
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int e = tid + kThreads * r;
    if (e < nvec) {
      const float inv = 1.f / sw[r];
      store_bf16x4(p.out + int64_t(pair) * group * D + 4 * e,
                   make_float4(acc[r].x * inv, acc[r].y * inv, acc[r].z * inv, acc[r].w * inv));
    }
  }
}

}  // namespace decode_detail

// kStandalone: compiled with the timeline (p.trace); without it the stamps are left out and their
// registers saved (the attention -> o_proj kernel is at its cap).
// G: 1..8 query heads per KV head exactly, or 16: any of 9..16 (p.group).
template <int D, int G, bool kPaged, bool kBulk, bool kStandalone = false, int kWarps = kDecodeWarps>
__device__ void decode_work_tile(const DecodeParams& p, int tile, char* smem) {
  constexpr int kThreads = kWarps * 32;
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert((G >= 1 && G <= 8) || G == kDecodeMaxGroup, "1..8 query heads per KV head, or up to 16");
  constexpr int kR = decode_row_blocks<G>();
  const int group = G <= 8 ? G : p.group;
  using namespace decode_detail;
  using Smem = DecodeSmem<D, G, kWarps>;
  constexpr int kChunks = D / 8;  // 16-byte chunks per token row
  constexpr int kStageElems = kDecodeStageTokens * D;
  static_assert(G * D * 4 + G * 4 + 64 <= kWarps * decode_slot_bytes<D>(), "a partial fits a one-slot ring (merge_pair)");
  Smem& sm = *reinterpret_cast<Smem*>(smem);
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem + decode_ring_offset<D, G, kWarps>());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row (head) g, column pair t
  const int slots = p.ring_slots;
  const bool tracing = kStandalone && p.trace != nullptr;  // timeline stamps (bench_attention_trace)
  auto stamp = [&](int w) {
    if (tracing) trace_now(p, tile, w);
  };
  if (threadIdx.x == 0 && tracing) {
    stamp(kDtEntry);
    uint32_t sm_id;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm_id));
    trace_put(p, tile, kDtSm, sm_id);
  }

  // The cut: the host's, or (lengths on the device: the standalone op only) the one the launch's cut
  // kernel wrote, read once that kernel is done. Tiles past it take no units.
  if constexpr (kStandalone)
    if (p.cut) runtime::grid_dependency_wait();
  const int num_tiles = cut_tiles<kStandalone>(p), total_units = cut_units<kStandalone>(p);
  if (kStandalone && tile >= num_tiles) {
    runtime::allow_next_launch();
    return;
  }
  const int u_lo = decode_tile_start(tile, num_tiles, total_units);
  const int u_hi = decode_tile_start(tile + 1, num_tiles, total_units);
  const DecodePair first = first_pair<kStandalone>(p, tile, u_lo);
  // This warp's stages: units u_lo + warp + 4k, k < my_n; stage k lives in ring slot k % slots.
  const int my_n = u_lo + warp < u_hi ? (u_hi - 1 - u_lo - warp) / kWarps + 1 : 0;
  auto unit_of = [&](int k) { return u_lo + warp + kWarps * k; };
  __nv_bfloat16* my_ring = ring + warp * slots * 2 * kStageElems;
  uint64_t* bars = sm.bar[warp];
  if constexpr (kBulk) {
    if (lane == 0)
      for (int i = 0; i < slots; ++i) bar_init(&bars[i]);
    __syncwarp();
  }

  // Smem position of 16-byte chunk ch of token row tok: swizzled for cp.async; the bulk copy keeps
  // the global layout (2-way conflicts on K reads, 4-way on V reads).
  auto chunk_at = [](int ch, int tok) { return kBulk ? ch : swizzle_chunk(ch, tok); };

  // The issue side walks the pairs on its own (it runs `slots` stages ahead of the math).
  DecodePair ip = first;
  auto issue = [&](int k) {
    if (k < my_n) {
      const int u = unit_of(k);
      while (u >= ip.u1) ip = next_pair<kStandalone>(p, ip);
      const int tok0 = (u - ip.u0) * kDecodeStageTokens;
      const int valid = min(kDecodeStageTokens, ip.len - tok0);
      const int64_t base = kv_offset<kPaged, D>(p, ip.pair, tok0);
      const __nv_bfloat16* kg = p.k_cache + base;
      const __nv_bfloat16* vg = p.v_cache + base;
      const int slot = k % slots;
      __nv_bfloat16* ks = my_ring + slot * 2 * kStageElems;
      __nv_bfloat16* vs = ks + kStageElems;
      if constexpr (kBulk) {
        // Only the valid rows: rows past them keep stale data, masked in the math below.
        if (lane == 0) {
          const uint32_t bytes = uint32_t(valid) * D * 2;
          bar_expect_tx(&bars[slot], 2 * bytes);
          bulk_copy(ks, kg, bytes, &bars[slot]);
          bulk_copy(vs, vg, bytes, &bars[slot]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kDecodeStageTokens * kChunks / 32; ++i) {
          const int c = lane + 32 * i, tok = c / kChunks, ch = c % kChunks;
          const int dst = tok * D + chunk_at(ch, tok) * 8;
          const bool ok = tok < valid;
          const int src = ok ? tok * D + ch * 8 : 0;
          cp_async16(ks + dst, kg + src, ok ? 16 : 0);  // zero-fills rows past the sequence
          cp_async16(vs + dst, vg + src, ok ? 16 : 0);
        }
      }
    }
    if constexpr (!kBulk) cp_async_commit();  // empty groups keep the group count uniform
  };

  // The first pair's rows are requested before the KV stream (behind it they would wait for the
  // whole GPU's backlog); the stream then fills the ring while they are roped. In an overlapped
  // launch each warp's first stage goes out before the wait for the kernel before (which may have
  // written q, k_new and v_new but not the cache rows read here); the next kernel may start once
  // this one is past that wait, so its early reads overlap this kernel alone.
  const bool early = kStandalone && p.overlap && !p.cut;
  if (early) issue(0);
  if constexpr (kStandalone) {
    runtime::grid_dependency_wait();
    runtime::allow_next_launch();
  }
  DecodePair sp = first;
  DecodeRows<D, G, kThreads> rows = load_rows<D, G, kThreads>(p, group, sp.pair);
  for (int k = early ? 1 : 0; k < slots; ++k) issue(k);
  for (int i = threadIdx.x; i < (Smem::kRows - group) * D; i += kThreads)
    sm.q[group + i / D][i % D] = __float2bfloat16(0.f);

  // Partial segments (at most the tile's first and last): their pair and units, merged at the end.
  DecodePair part[2] = {{-1, 0, 0, 0}, {-1, 0, 0, 0}};
  const int64_t out_stride = int64_t(group) * D;
  int k = 0;
  for (;;) {
    const int seg_lo = max(u_lo, sp.u0), seg_hi = min(u_hi, sp.u1);
    const int pos = sp.len - 1;  // the new token
    const int pos_unit = sp.u0 + pos / kDecodeStageTokens;
    const bool appends = p.k_new != nullptr && pos_unit >= seg_lo && pos_unit < seg_hi;
    setup_segment<D, G, kPaged, kThreads>(p, sm, rows, group, sp.pair, pos, appends);
    if (threadIdx.x == 0 && sp.pair == first.pair) stamp(kDtSetup);
    const bool more = seg_hi < u_hi;
    DecodePair np = sp;
    if (more) {
      np = next_pair<kStandalone>(p, sp);
      rows = load_rows<D, G, kThreads>(p, group, sp.pair + 1);
    }

    // q as A fragments (QFrags).
    QFrags<D, kR, Smem::kQSmem> qa;
    if constexpr (Smem::kQSmem) {
      for (int i = threadIdx.x; i < D / 16 * kR * 32; i += kThreads) {
        const int l = i % 32, r = (i / 32) % kR, s = i / (32 * kR);
        sm.q_frag[i] = q_fragment<D>(&sm.q[0][0], l / 4 + 8 * r, s, l % 4);
      }
      tile_sync<kThreads>();
      qa.frag = sm.q_frag;
    } else {
#pragma unroll
      for (int s = 0; s < D / 16; ++s)
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const uint2 f = q_fragment<D>(&sm.q[0][0], g + 8 * r, s, t);
          qa.a[s][2 * r] = f.x;
          qa.a[s][2 * r + 1] = f.y;
        }
    }

    // o[j]: output columns of n-tile j = 8q + e; this thread's c0, c1 hold head g at
    // d = 8 (2t + 8q) + e and d + 8, c2, c3 head g + 8 (zero rows with one row block).
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[kR], l[kR];  // per row block: running max (log2 domain) and this thread's share of the sum
#pragma unroll
    for (int r = 0; r < kR; ++r) m[r] = -INFINITY, l[r] = 0.f;

    // Stage kk, landed (the caller waited): its rows, the new token's row patched in.
    auto ready = [&](int kk) -> StageRef {
      __nv_bfloat16* ks = my_ring + (kk % slots) * 2 * kStageElems;
      __nv_bfloat16* vs = ks + kStageElems;
      const int tok0 = (unit_of(kk) - sp.u0) * kDecodeStageTokens;
      if (appends && pos >= tok0 && pos - tok0 < kDecodeStageTokens) {  // the new token's row: patch it
        const int r = pos - tok0;
        for (int c = lane; c < kChunks; c += 32) {
          const int dst = r * D + chunk_at(c, r) * 8;
          *reinterpret_cast<uint4*>(ks + dst) = *reinterpret_cast<const uint4*>(&sm.k_new[c * 8]);
          *reinterpret_cast<uint4*>(vs + dst) = *reinterpret_cast<const uint4*>(&sm.v_new[c * 8]);
        }
        if constexpr (kBulk) fence_proxy_async();  // before a bulk copy refills this slot
        __syncwarp();
      }
      return {ks, vs, min(kDecodeStageTokens, sp.len - tok0)};
    };
    // Two stages per softmax step while the warp has two left in the segment, at head dim 64: a
    // stage's math is short there beside its chain S -> max -> exp -> P V, which two stages then
    // share (H200, sweep seed 16: d = 64 B = 2, L = 19549 31.7 -> 30.1 us, B = 64 ragged 115.6 ->
    // 108.5). At 128 it went either way (B = 1, L = 32768 +3.9%, B = 16, L = 10897 -2.9%,
    // attention_two_stages_ab.json); at 256 a second S would spill the accumulators, and the
    // attention -> o_proj kernel is at its register cap.
    constexpr bool kTwo = D == 64 && kStandalone;
    for (; k < my_n && unit_of(k) < seg_hi;) {
      const bool two = kTwo && slots >= 2 && k + 1 < my_n && unit_of(k + 1) < seg_hi;
      if constexpr (kBulk) {
        bar_wait(&bars[k % slots], (k / slots) & 1);
        if (two) bar_wait(&bars[(k + 1) % slots], ((k + 1) / slots) & 1);
      } else {
        cp_async_wait_dyn(two ? slots - 2 : slots - 1);
        __syncwarp();
      }
      if (k == 0 && threadIdx.x == 0) stamp(kDtFirst);
      if constexpr (kTwo) {
        if (two) {
          const StageRef st[2] = {ready(k), ready(k + 1)};
          attend_units<D, kBulk, kR, Smem::kQSmem, 2>(qa, st, p.scale_log2, o, m, l);
        }
      }
      if (!two) {
        const StageRef st[1] = {ready(k)};
        attend_units<D, kBulk, kR, Smem::kQSmem, 1>(qa, st, p.scale_log2, o, m, l);
      }
      __syncwarp();  // every lane is done with the slots: refill them
      issue(k + slots);
      if (two) issue(k + 1 + slots);
      k += two ? 2 : 1;
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (lane == 0 && warp < 4) stamp(kDtWarpEnd + warp);  // the timeline keeps 4 warps' ends

    // Combine the warps (smem), then write the segment's result: the output when the segment is
    // the whole pair, else a partial in slot 2 * tile + (0: the tile's first segment, 1: its last).
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int row = g + 8 * r;
      if (row < group) {
#pragma unroll
        for (int j = 0; j < D / 8; j += 4) {  // n-tiles j .. j + 3 hold 4 consecutive columns
          const int d = 8 * (2 * t + 8 * (j / 8)) + j % 8;
          *reinterpret_cast<float4*>(&sm.o[warp][row][d]) =
              make_float4(o[j][2 * r], o[j + 1][2 * r], o[j + 2][2 * r], o[j + 3][2 * r]);
          *reinterpret_cast<float4*>(&sm.o[warp][row][d + 8]) =
              make_float4(o[j][2 * r + 1], o[j + 1][2 * r + 1], o[j + 2][2 * r + 1], o[j + 3][2 * r + 1]);
        }
        if (t == 0) {
          sm.m[warp][row] = m[r];
          sm.l[warp][row] = l[r];
        }
      }
    }
    tile_sync<kThreads>();
    const bool whole = seg_lo == sp.u0 && seg_hi == sp.u1;
    const int which = seg_lo > u_lo ? 1 : 0;
    const int64_t slot = 2 * int64_t(tile) + which;
    for (int i = threadIdx.x; i < group * D / 4; i += kThreads) {
      const int gg = i / (D / 4), d = (i % (D / 4)) * 4;
      float mmax = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mmax = fmaxf(mmax, sm.m[w][gg]);
      float sum = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(sm.m[w][gg] - mmax);  // 0 for a warp that had no stage
        const float4 v = *reinterpret_cast<const float4*>(&sm.o[w][gg][d]);
        sum += sm.l[w][gg] * f;
        acc.x += f * v.x;
        acc.y += f * v.y;
        acc.z += f * v.z;
        acc.w += f * v.w;
      }
      const float inv = 1.f / sum;
      acc = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (whole) {
        store_bf16x4(p.out + sp.pair * out_stride + gg * D + d, acc);
      } else {
        *reinterpret_cast<float4*>(&p.o_part[(slot * group + gg) * D + d]) = acc;
        if (d == 0) p.lse_part[slot * group + gg] = mmax + log2f(sum);
      }
    }
    if (!whole) (which ? part[1] : part[0]) = sp;
    if (tracing && threadIdx.x == 0) trace_put(p, tile, kDtSegments, sp.pair - first.pair + 1);
    if (!more) break;
    sp = np;
  }
  if constexpr (kBulk) {
    __syncwarp();
    if (lane == 0)
      for (int i = 0; i < slots; ++i) bar_inval(&bars[i]);
  } else {
    cp_async_wait<0>();
  }

  if (threadIdx.x == 0) stamp(kDtSegsDone);
  // The last tile to finish a pair merges it (fence, count, fence): no tile waits for another.
  // Threads 0 and 32 count the tile's two partials at once.
  int merges = 0;
  auto tiles_of = [&](const DecodePair& pt) {  // the tiles holding a part of pair pt
    return decode_tile_of(pt.u1 - 1, num_tiles, total_units) - decode_tile_of(pt.u0, num_tiles, total_units) + 1;
  };
  if (part[0].pair >= 0 || part[1].pair >= 0) {
    // Release: the barrier orders every thread's partial writes before threads 0 and 32's fences
    // (cumulativity, as in a grid barrier), each of which then counts one partial. Acquire: the
    // counting thread's fence after the count, then the barrier, before anyone reads partials.
    tile_sync<kThreads>();
    if (lane == 0 && warp < 2) {
      const DecodePair pt = warp == 0 ? part[0] : part[1];
      int last = 0;
      if (pt.pair >= 0) {
        int* count = p.merge_count + pt.pair;
        __threadfence();
        last = atomicAdd(count, 1) == tiles_of(pt) - 1;
        if (last) {
          *count = 0;  // ready for the next launch
          __threadfence();
        }
      }
      sm.last[warp] = last;
    }
    tile_sync<kThreads>();
    if (threadIdx.x == 0) stamp(kDtCounted);
#pragma unroll
    for (int w = 0; w < 2; ++w)
      if (sm.last[w]) {
        const DecodePair& pt = part[w];
        const int c0 = decode_tile_of(pt.u0, num_tiles, total_units);
        // Tile c0's part of this pair is its second segment when the tile starts in an earlier pair.
        const int shift = decode_tile_start(c0, num_tiles, total_units) < pt.u0 ? 1 : 0;
        const int ring_bytes = kWarps * slots * decode_slot_bytes<D>();
        merge_pair<D, G, kWarps>(p, reinterpret_cast<char*>(ring), max(ring_bytes, p.merge_stage_bytes), group,
                                 pt.pair, c0, tiles_of(pt), shift);
        ++merges;
      }
  }
  if (threadIdx.x == 0 && tracing) {
    trace_put(p, tile, kDtMerges, merges);
    stamp(kDtExit);
  }
  fence_proxy_async();  // this tile's generic smem writes before the next tile's bulk copies
}

// ---- the cut on the device (lengths given at run time) ----
// One block, before each launch of a plan made without lengths (DecodeAttention(shape)): checks the
// lengths (1 .. capacity) and the page ids in use (0 .. num_pages - 1), then writes plan_decode's
// tables for them (graph/attention_graph.cpp: the same even cut of the units, over at most max_tiles
// tiles of at least min_units). Bad input cancels the launch rather than reading or writing outside
// the caches: out is filled with NaN, no tile runs (cut[0] = 0), and error[] keeps the first bad
// value for the host (DecodeAttention::take_device_error).
template <int kThreads>
__device__ void decode_cut(const DecodeCutArgs& a) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "one block");
  constexpr int kWarps = kThreads / 32;
  __shared__ int warp_sum[kWarps];
  __shared__ int s_carry, s_bad;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (tid == 0) s_carry = 0, s_bad = 0;
  __syncthreads();
  auto report = [&](int kind, int index, int value) {
    s_bad = 1;
    if (atomicCAS(&a.error[0], 0, kind) == 0) a.error[1] = index, a.error[2] = value;
  };
  for (int b = tid; b < a.batch; b += kThreads) {
    const int len = __ldcg(&a.seq_lens[b]);
    if (len < 1 || len > a.capacity) report(kDecodeBadLength, b, len);
  }
  if (a.page_table != nullptr)
    for (int64_t i = tid; i < int64_t(a.batch) * a.pages_per_seq; i += kThreads) {
      const int b = int(i / a.pages_per_seq), j = int(i - int64_t(b) * a.pages_per_seq);
      const int len = __ldcg(&a.seq_lens[b]);
      if (len < 1 || len > a.capacity || j * a.page_size >= len) continue;
      const int page = __ldcg(&a.page_table[i]);
      if (page < 0 || page >= a.num_pages) report(kDecodeBadPage, int(i), page);
    }
  __syncthreads();
  if (s_bad) {
    const __nv_bfloat16 nan = __ushort_as_bfloat16(0x7FC0);
    for (int64_t i = tid; i < a.out_elems; i += kThreads) a.out[i] = nan;
    if (tid == 0) a.cut[0] = 0, a.cut[1] = 0;
    return;
  }

  // Pair i = b * Hkv + h starts after the units of every pair before it: a block-wide scan over the
  // sequences, kThreads at a time.
  for (int b0 = 0; b0 < a.batch; b0 += kThreads) {
    const int b = b0 + tid;
    const int len = b < a.batch ? __ldcg(&a.seq_lens[b]) : 0;
    const int units = b < a.batch ? decode_units(len) : 0;
    int v = units * a.num_kv_heads;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {  // inclusive, within the warp
      const int u = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += u;
    }
    if (lane == 31) warp_sum[warp] = v;
    __syncthreads();
    if (warp == 0) {
      int w = lane < kWarps ? warp_sum[lane] : 0;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const int u = __shfl_up_sync(0xffffffffu, w, o);
        if (lane >= o) w += u;
      }
      if (lane < kWarps) warp_sum[lane] = w;
    }
    __syncthreads();
    const int first = s_carry + (warp > 0 ? warp_sum[warp - 1] : 0) + v - units * a.num_kv_heads;
    if (b < a.batch)
      for (int h = 0; h < a.num_kv_heads; ++h) a.pair_info[b * a.num_kv_heads + h] = make_int2(first + h * units, len);
    __syncthreads();  // every thread has read s_carry
    if (tid == 0) s_carry += warp_sum[kWarps - 1];
    __syncthreads();
  }
  const int npairs = a.batch * a.num_kv_heads, total = s_carry;
  const int tiles = max(1, min(a.max_tiles, (total + a.min_units - 1) / a.min_units));
  if (tid == 0) {
    a.pair_info[npairs] = make_int2(total, 0);
    a.cut[0] = tiles;
    a.cut[1] = total;
  }
  __syncthreads();  // the block's pair_info writes, before it searches them
  for (int c = tid; c < tiles; c += kThreads) {
    const int u = decode_tile_start(c, tiles, total);
    int lo = 0, hi = npairs - 1;  // the last pair starting at or before u (every pair holds a unit)
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (__ldcg(&a.pair_info[mid].x) <= u) lo = mid; else hi = mid - 1;
    }
    const int2 f = __ldcg(&a.pair_info[lo]);
    a.tile_first[c] = make_int4(lo, f.x, __ldcg(&a.pair_info[lo + 1].x), f.y);
  }
}

}  // namespace tw::kernels
