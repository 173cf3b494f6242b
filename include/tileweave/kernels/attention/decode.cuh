// Split-KV decode attention tiles (flash-decoding with GQA), callable from a standalone kernel or
// from the persistent executor:
//   decode_partial_tile<D, G, paged, bulk>(p, b, hkv, split): one split of one sequence's KV head
//     for all G query heads of the group (one pass over K/V), with the fused prologue (RoPE on q;
//     the split holding the new token ropes k_new, appends k_new/v_new to the cache and uses that
//     row from smem). Writes a normalised partial output + LSE, or the final output when the
//     sequence has one split.
//   decode_merge_tile<D, G>(p, b, hkv): LSE-weighted sum of the (b, hkv) partial outputs.
// Both run on threads 0 .. kDecodeThreads-1 of the block (others must skip them) and need
// decode_smem_bytes<D>() bytes of shared memory; the caller syncs before reusing that memory.
//
// Inside a tile each of the 4 warps streams its own 16-token stages (stage w, w+4, ...) through a
// private smem ring, so the main loop has no block barrier. The ring is filled either by 16-byte
// cp.async (any sm_80+; swizzled, zero-filled tails) or, with `bulk`, by one lane's Hopper bulk
// copies completing on a per-slot mbarrier (sm_90). QK^T and PV run on mma.sync m16n8k16 with the
// group's heads as rows 0..7 (rows 8..15 are zero): tensor cores keep the FMA and register cost of
// G = 8 heads off the memory stream. The K and V fragments are read with
// 16-byte loads by permuting the head dimension (the dot product and the output columns do not care
// about order; the output is un-permuted on the way out).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "tileweave/kernels/attention/decode_params.hpp"

namespace tw::kernels {

template <int D>
struct DecodeSmem {
  // Per warp: kStages ring slots of K and V (8 KiB each at D = 128), two in flight while one is used.
  static constexpr int kStages = 3 * 128 / D;
  static constexpr int kStageElems = kDecodeStageTokens * D;
  __nv_bfloat16 ring[kDecodeWarps][kStages][2][kStageElems];
  alignas(16) __nv_bfloat16 q[kDecodeMaxGroup][D];  // roped q of the group, rows >= G zero
  alignas(16) __nv_bfloat16 k_new[D];  // the appended row (roped k, v), patched into its ring slot
  alignas(16) __nv_bfloat16 v_new[D];
  float m[kDecodeWarps][kDecodeMaxGroup];
  float l[kDecodeWarps][kDecodeMaxGroup];
  uint64_t bar[kDecodeWarps][kStages];  // bulk-copy variant: one mbarrier per ring slot
};

template <int D>
constexpr int decode_smem_bytes() {
  return static_cast<int>(sizeof(DecodeSmem<D>));
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

// Barrier of the tile's kDecodeThreads threads (named barrier 1): a persistent kernel with larger
// blocks lets its other threads skip the tile; barrier 0 (__syncthreads) stays the caller's.
__device__ __forceinline__ void tile_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kDecodeThreads) : "memory"); }

__device__ __forceinline__ uint4 lds128(const __nv_bfloat16* p) { return *reinterpret_cast<const uint4*>(p); }

// Position of 16-byte chunk `chunk` of token row `token` in a ring slot: XOR of the low 3 chunk bits
// so that both fragment read patterns below (K: 2 tokens x 4 chunks per 8 lanes; V: 4 tokens x 2
// chunks) hit 8 distinct bank groups.
__device__ __forceinline__ int swizzle_chunk(int chunk, int token) {
  const int r = token & 7;
  return chunk ^ ((((r >> 1) & 3) << 1) ^ ((r & 1) << 2));
}

template <bool kPaged, int D>
__device__ __forceinline__ int64_t kv_offset(const DecodeParams& p, int b, int hkv, int token) {
  if constexpr (kPaged) {
    const int page = p.page_table[int64_t(b) * p.pages_per_seq + token / p.page_size];
    return ((int64_t(page) * p.num_kv_heads + hkv) * p.page_size + token % p.page_size) * D;
  } else {
    return ((int64_t(b) * p.num_kv_heads + hkv) * p.max_seq_len + token) * D;
  }
}

// Rotate-half RoPE of the pair (x[i], x[i + D/2]) at position pos.
__device__ __forceinline__ void rope_pair(const DecodeParams& p, int pos, int i, float& x1, float& x2) {
  if (!p.rope) return;
  float s, c;
  sincosf(float(pos) * p.inv_freq[i], &s, &c);
  const float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
  x1 = y1;
  x2 = y2;
}

// The fused prologue: roped q of the group into smem; the split holding position pos appends the
// new token (roped k, v) to the cache and keeps the row in smem: its copy of that row from the
// cache (issued before the prologue, so it may hold the stale row) is patched before use.
template <int D, int G, bool kPaged>
__device__ __forceinline__ void prologue(const DecodeParams& p, DecodeSmem<D>& sm, int b, int hkv, int pos,
                                         bool appends) {
  constexpr int kHalf = D / 2;
  const int64_t q_row = (int64_t(b) * p.num_kv_heads + hkv) * G;
  for (int i = threadIdx.x; i < kDecodeMaxGroup * kHalf; i += kDecodeThreads) {
    const int g = i / kHalf, r = i % kHalf;
    float x1 = 0.f, x2 = 0.f;
    if (g < G) {
      const __nv_bfloat16* q = p.q + (q_row + g) * D;
      x1 = __bfloat162float(q[r]);
      x2 = __bfloat162float(q[r + kHalf]);
      rope_pair(p, pos, r, x1, x2);
    }
    sm.q[g][r] = __float2bfloat16(x1);
    sm.q[g][r + kHalf] = __float2bfloat16(x2);
  }
  if (appends) {
    const int64_t dst = kv_offset<kPaged, D>(p, b, hkv, pos);
    const int64_t src = (int64_t(b) * p.num_kv_heads + hkv) * D;
    for (int r = threadIdx.x; r < kHalf; r += kDecodeThreads) {
      float x1 = __bfloat162float(p.k_new[src + r]), x2 = __bfloat162float(p.k_new[src + r + kHalf]);
      rope_pair(p, pos, r, x1, x2);
      const __nv_bfloat16 k1 = __float2bfloat16(x1), k2 = __float2bfloat16(x2);
      const __nv_bfloat16 v1 = p.v_new[src + r], v2 = p.v_new[src + r + kHalf];
      p.k_cache[dst + r] = k1;
      p.k_cache[dst + r + kHalf] = k2;
      p.v_cache[dst + r] = v1;
      p.v_cache[dst + r + kHalf] = v2;
      sm.k_new[r] = k1;
      sm.k_new[r + kHalf] = k2;
      sm.v_new[r] = v1;
      sm.v_new[r + kHalf] = v2;
    }
  }
  tile_sync();
}

__device__ __forceinline__ void store_bf16x4(__nv_bfloat16* dst, float4 v) {
  uint2 u;
  u.x = pack_bf16(v.x, v.y);
  u.y = pack_bf16(v.z, v.w);
  *reinterpret_cast<uint2*>(dst) = u;
}

}  // namespace decode_detail

template <int D, int G, bool kPaged, bool kBulk>
__device__ void decode_partial_tile(const DecodeParams& p, int b, int hkv, int split, char* smem) {
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static_assert(G >= 1 && G <= kDecodeMaxGroup, "1..8 query heads per KV head");
  using namespace decode_detail;
  using Smem = DecodeSmem<D>;
  constexpr int kStages = Smem::kStages;
  constexpr int kChunks = D / 8;  // 16-byte chunks per token row
  static_assert(kDecodeWarps * G * D * 4 <= int(sizeof(Smem::ring)), "combine scratch fits in the ring");
  Smem& sm = *reinterpret_cast<Smem*>(smem);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates: row (head) g, column pair t

  const int len = p.seq_lens[b];
  const int pos = len - 1;  // the new token
  // The split's tokens in 64-token blocks (one 16-token stage per warp). Contiguous splits take
  // blocks [split * split_tokens / 64, ...); interleaved splits take blocks split, split + n,
  // split + 2n, ... so that the n tiles of a sequence read one dense window that slides through
  // the cache together (DRAM page locality, as the floor kernel deals its chunks).
  constexpr int kBlock = kDecodeStageTokens * kDecodeWarps;
  const int n = decode_num_splits(len, p.split_tokens);
  int first, step, end;  // this warp's first stage token, stride between its stages, end of its tokens
  if (p.interleave) {
    first = split * kBlock + warp * kDecodeStageTokens;
    step = n * kBlock;
    end = len;
  } else {
    first = split * p.split_tokens + warp * kDecodeStageTokens;
    step = kBlock;
    end = min(len, (split + 1) * p.split_tokens);
  }
  const int my_stages = first < end ? (end - 1 - first) / step + 1 : 0;
  auto stage_token = [&](int k) { return first + k * step; };
  const bool appends = p.k_new != nullptr && (p.interleave ? (pos / kBlock) % n == split
                                                           : pos / p.split_tokens == split);

  // Smem position of 16-byte chunk ch of token row tok: swizzled for cp.async; the bulk copy keeps
  // the global layout (2-way conflicts on K reads, 4-way on V reads).
  auto chunk_at = [](int ch, int tok) { return kBulk ? ch : swizzle_chunk(ch, tok); };
  uint64_t* bars = sm.bar[warp];
  if constexpr (kBulk) {
    if (lane == 0)
      for (int i = 0; i < kStages; ++i) bar_init(&bars[i]);
    __syncwarp();
  }

  // Stage k of this warp -> ring slot k % kStages. Stages start at multiples of 16 tokens and pages
  // hold multiples of 16, so a stage is one contiguous run of K (and of V).
  auto issue = [&](int k) {
    if (k < my_stages) {
      const int tok0 = stage_token(k);
      const int valid = min(kDecodeStageTokens, end - tok0);
      const int64_t base = kv_offset<kPaged, D>(p, b, hkv, tok0);
      const __nv_bfloat16* kg = p.k_cache + base;
      const __nv_bfloat16* vg = p.v_cache + base;
      __nv_bfloat16* ks = sm.ring[warp][k % kStages][0];
      __nv_bfloat16* vs = sm.ring[warp][k % kStages][1];
      if constexpr (kBulk) {
        // Only the valid rows: rows past them keep stale data, masked in the math below.
        if (lane == 0) {
          const uint32_t bytes = uint32_t(valid) * D * 2;
          bar_expect_tx(&bars[k % kStages], 2 * bytes);
          bulk_copy(ks, kg, bytes, &bars[k % kStages]);
          bulk_copy(vs, vg, bytes, &bars[k % kStages]);
        }
      } else {
#pragma unroll
        for (int i = 0; i < kDecodeStageTokens * kChunks / 32; ++i) {
          const int c = lane + 32 * i, tok = c / kChunks, ch = c % kChunks;
          const int dst = tok * D + chunk_at(ch, tok) * 8;
          const bool ok = tok < valid;
          const int src = ok ? tok * D + ch * 8 : 0;
          cp_async16(ks + dst, kg + src, ok ? 16 : 0);  // zero-fills rows past the split
          cp_async16(vs + dst, vg + src, ok ? 16 : 0);
        }
      }
    }
    if constexpr (!kBulk) cp_async_commit();  // empty groups keep the group count uniform
  };

  // o[j]: output columns of n-tile j = 8q + e; this thread's c0, c1 hold head g at
  // d = 8 (2t + 8q) + e and d + 8 (c2, c3 belong to the zero rows 8..15).
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m = -INFINITY, l = 0.f;  // running max (log2 domain) and this thread's share of the sum

  // The KV stream starts first; the prologue's loads and RoPE overlap it.
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  prologue<D, G, kPaged>(p, sm, b, hkv, pos, appends);

  // q as A fragments. k-step s = 2j + h pairs with chunk c = t + 4j of this thread's K row, half h:
  // A column 2t, 2t+1 <- d = 8c + 4h + {0, 1};  A column 2t+8, 2t+9 <- d = 8c + 4h + {2, 3}.
  uint32_t qa[D / 16][2];
#pragma unroll
  for (int s = 0; s < D / 16; ++s) {
    const int d = 8 * (t + 4 * (s / 2)) + 4 * (s % 2);
    qa[s][0] = *reinterpret_cast<const uint32_t*>(&sm.q[g][d]);
    qa[s][1] = *reinterpret_cast<const uint32_t*>(&sm.q[g][d + 2]);
  }

  for (int k = 0; k < my_stages; ++k) {
    issue(k + kStages - 1);
    if constexpr (kBulk) {
      bar_wait(&bars[k % kStages], (k / kStages) & 1);
    } else {
      cp_async_wait<kStages - 1>();
      __syncwarp();
    }
    __nv_bfloat16* ks = sm.ring[warp][k % kStages][0];
    __nv_bfloat16* vs = sm.ring[warp][k % kStages][1];
    const int tok0 = stage_token(k);
    const int valid = min(kDecodeStageTokens, end - tok0);
    if (appends && pos - tok0 < kDecodeStageTokens) {  // this stage holds the new token: patch its row
      const int r = pos - tok0;
      for (int c = lane; c < kChunks; c += 32) {
        const int dst = r * D + chunk_at(c, r) * 8;
        *reinterpret_cast<uint4*>(ks + dst) = *reinterpret_cast<const uint4*>(&sm.k_new[c * 8]);
        *reinterpret_cast<uint4*>(vs + dst) = *reinterpret_cast<const uint4*>(&sm.v_new[c * 8]);
      }
      if constexpr (kBulk) fence_proxy_async();  // before a bulk copy refills this slot
      __syncwarp();
    }

    // S = q K^T: n-tile nt covers tokens 8nt..8nt+7; this thread supplies token 8nt + g.
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
      const int tok = 8 * nt + g;
#pragma unroll
      for (int j = 0; j < D / 32; ++j) {
        const uint4 kv = lds128(ks + tok * D + chunk_at(t + 4 * j, tok) * 8);
        mma_bf16(s[nt], qa[2 * j][0], 0u, qa[2 * j][1], 0u, kv.x, kv.y);
        mma_bf16(s[nt], qa[2 * j + 1][0], 0u, qa[2 * j + 1][1], 0u, kv.z, kv.w);
      }
    }

    // Online softmax of row g over tokens 8nt + 2t + e (e < 2); the quad (same g) shares the row.
    float x[2][2], mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        x[nt][e] = 8 * nt + 2 * t + e < valid ? s[nt][e] * p.scale_log2 : -INFINITY;
        mx = fmaxf(mx, x[nt][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);  // finite: every stage holds at least one token
    const float alpha = exp2f(m - m_new);
    float psum = 0.f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        x[nt][e] = exp2f(x[nt][e] - m_new);
        psum += x[nt][e];
      }
    l = l * alpha + psum;
    m = m_new;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= alpha;
      o[j][1] *= alpha;
    }
    // P as the A fragment: the S accumulator layout (row g, tokens 2t+{0,1} of n-tile 0 and 1) is
    // exactly A columns 2t+{0,1} and 2t+8+{0,1}.
    const uint32_t pa0 = pack_bf16(x[0][0], x[0][1]), pa2 = pack_bf16(x[1][0], x[1][1]);

    // O += P V. B fragment of n-tile 8q + e, column g: element e of chunk g + 8q of tokens 2t, 2t+1
    // (b0) and 2t+8, 2t+9 (b1); zero-filled rows past `valid` meet p = 0.
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
        mma_bf16(o[8 * q + e], pa0, 0u, pa2, 0u, b0, b1);
      }
    }
    __syncwarp();  // the slot is refilled by the next issue
  }
  if constexpr (kBulk) {
    __syncwarp();
    if (lane == 0)
      for (int i = 0; i < kStages; ++i) bar_inval(&bars[i]);
  } else {
    cp_async_wait<0>();
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // Combine the 4 warps (smem), then write the split's result.
  tile_sync();  // every warp is done with its ring: reuse it as scratch
  float* wo = reinterpret_cast<float*>(&sm.ring[0][0][0][0]);  // [warp][G][D]
  if (g < G) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int d = 8 * (2 * t + 8 * (j / 8)) + j % 8;
      wo[(warp * G + g) * D + d] = o[j][0];
      wo[(warp * G + g) * D + d + 8] = o[j][1];
    }
    if (t == 0) {
      sm.m[warp][g] = m;
      sm.l[warp][g] = l;
    }
  }
  tile_sync();
  const int64_t head0 = (int64_t(b) * p.num_kv_heads + hkv) * G;
  const int64_t slot = (int64_t(b) * p.num_kv_heads + hkv) * p.max_splits + split;
  for (int i = threadIdx.x; i < G * D / 4; i += kDecodeThreads) {
    const int gg = i / (D / 4), d = (i % (D / 4)) * 4;
    float mmax = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mmax = fmaxf(mmax, sm.m[w][gg]);
    float sum = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float f = exp2f(sm.m[w][gg] - mmax);  // 0 for a warp that had no stage
      const float4 v = *reinterpret_cast<const float4*>(&wo[(w * G + gg) * D + d]);
      sum += sm.l[w][gg] * f;
      acc.x += f * v.x;
      acc.y += f * v.y;
      acc.z += f * v.z;
      acc.w += f * v.w;
    }
    const float inv = 1.f / sum;
    acc = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    if (n == 1) {
      store_bf16x4(p.out + (head0 + gg) * D + d, acc);
    } else {
      *reinterpret_cast<float4*>(&p.o_part[(slot * G + gg) * D + d]) = acc;
      if (d == 0) p.lse_part[slot * G + gg] = mmax + log2f(sum);
    }
  }
  fence_proxy_async();  // this tile's generic smem writes before the next tile's bulk copies
}

// Merges the partial outputs of (b, hkv); a no-op for a sequence with one split. The partial tiles'
// results are read with ld.global.cg (L2), as other blocks wrote them in this launch.
template <int D, int G>
__device__ void decode_merge_tile(const DecodeParams& p, int b, int hkv, char* smem) {
  using namespace decode_detail;
  const int n = decode_num_splits(p.seq_lens[b], p.split_tokens);
  if (n <= 1) return;
  float* w = reinterpret_cast<float*>(smem);                 // [n][G] lse, then weights
  float* stat = w + kDecodeMaxSplits * kDecodeMaxGroup;      // [0, 8): max; [8, 16): 1 / sum
  static_assert((kDecodeMaxSplits + 2) * kDecodeMaxGroup * 4 <= decode_smem_bytes<D>(), "merge scratch fits");
  const int64_t slot0 = (int64_t(b) * p.num_kv_heads + hkv) * p.max_splits;
  for (int i = threadIdx.x; i < n * G; i += kDecodeThreads) w[i] = __ldcg(p.lse_part + slot0 * G + i);
  tile_sync();
  if (threadIdx.x < G) {
    float mmax = -INFINITY, sum = 0.f;
    for (int s = 0; s < n; ++s) mmax = fmaxf(mmax, w[s * G + threadIdx.x]);
    for (int s = 0; s < n; ++s) sum += exp2f(w[s * G + threadIdx.x] - mmax);
    stat[threadIdx.x] = mmax;
    stat[kDecodeMaxGroup + threadIdx.x] = 1.f / sum;
  }
  tile_sync();
  for (int i = threadIdx.x; i < n * G; i += kDecodeThreads)
    w[i] = exp2f(w[i] - stat[i % G]) * stat[kDecodeMaxGroup + i % G];
  tile_sync();
  const int64_t head0 = (int64_t(b) * p.num_kv_heads + hkv) * G;
  for (int i = threadIdx.x; i < G * D / 4; i += kDecodeThreads) {
    const int gg = i / (D / 4), d = (i % (D / 4)) * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const float* src = p.o_part + (slot0 * G + gg) * D + d;
#pragma unroll 8
    for (int s = 0; s < n; ++s) {
      const float ws = w[s * G + gg];
      const float4 v = __ldcg(reinterpret_cast<const float4*>(src + int64_t(s) * G * D));
      acc.x += ws * v.x;
      acc.y += ws * v.y;
      acc.z += ws * v.z;
      acc.w += ws * v.w;
    }
    store_bf16x4(p.out + (head0 + gg) * D + d, acc);
  }
  fence_proxy_async();
}

}  // namespace tw::kernels
