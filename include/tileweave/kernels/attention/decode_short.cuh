// Few-token decode attention: one block per (sequence, KV head) pair, for caches of at most
// kDecodeShortTokens tokens (decode_units.hpp), where a launch's time is its chain of dependent
// steps, not its bytes. The stream-K tile (decode.cuh) pays for a general plan there: table loads,
// the rows a segment ahead, a ring stage, a combine over 8 warps, partials; here each step of the
// chain happens once:
//   1. every K/V row of the pair is requested at once by cp.async into shared memory (one 16-token
//      unit per warp, the ring's swizzled slot layout), with the rows of q, k_new and v_new; the
//      lengths come from the parameters and a paged pair's (at most 4) page ids are loaded first;
//   2. while they fly: RoPE's (cos, sin) table, q roped straight into mma A-fragment order, roped
//      k_new and v_new appended to the cache and written into their unit's slot (that row is never
//      read from the cache, so there is nothing to patch);
//   3. warp w runs its unit with decode.cuh's attend_units (all G heads of the group as mma rows);
//   4. one unit: warp 0 writes the output from its registers. More: each warp leaves its (max, sum)
//      and accumulators in its own slot, and the warps combine them by 64-column blocks.
// Same arithmetic as the stream-K tile: RoPE rotate-half with fp32 angles from the same inv_freq
// table, roped q and k rounded to bf16, fp32 scores and softmax (base 2), bf16 output.
#pragma once

#include "tileweave/kernels/attention/decode.cuh"

namespace tw::kernels {

// kR: mma row blocks of 8 heads (1: groups of 1..8, 2: 9..16); the group itself is read at run time.
template <int D, int kR>
struct DecodeShortSmem {
  uint2 q_frag[D / 16 * kR * 32];  // roped q as QFrags<D, kR, true> reads it; rows past the group zero
  float2 rope[D / 2];              // (cos, sin) of the new token's position per frequency
  float2 ml[kDecodeWarps][kR][32];  // each warp's running (max, sum) per lane and row block
  // The K/V units follow at decode_short_kv_offset: [unit][K, V][16 tokens][D] bf16 (ring slots).
};
// A block whose pairs hold up to L tokens needs this + decode_units(L) x decode_slot_bytes<D>().
template <int D, int kR>
constexpr int decode_short_kv_offset() {
  return static_cast<int>((sizeof(DecodeShortSmem<D, kR>) + 127) / 128 * 128);
}

namespace decode_detail {

// Rows g and g + 8r of output columns [64 q + 16 t, + 16) from the 8 n-tiles of column block q
// (c[e] = accumulators of n-tile 8q + e, attend_units' layout), scaled by 1 / sum: two 16-byte stores
// per row.
template <int D, int kR>
__device__ __forceinline__ void store_column_block(__nv_bfloat16* out, int group, int q, const float (*c)[4],
                                                   const float (&inv)[kR]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (g + 8 * r >= group) continue;
    uint32_t w[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w[h][e] = pack_bf16(c[2 * e][2 * r + h] * inv[r], c[2 * e + 1][2 * r + h] * inv[r]);
    __nv_bfloat16* dst = out + (g + 8 * r) * D + 64 * q + 16 * t;
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0][0], w[0][1], w[0][2], w[0][3]);
    *reinterpret_cast<uint4*>(dst + 8) = make_uint4(w[1][0], w[1][1], w[1][2], w[1][3]);
  }
}

}  // namespace decode_detail

// Block `pair` of kDecodeWarps warps computes pair (b, h) = (pair / Hkv, pair % Hkv) whole, in the
// shared memory decode_short_kv_offset names.
template <int D, int kR, bool kPaged>
__device__ void decode_short_pair(const DecodeShortParams& p, int pair, char* smem) {
  static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
  static_assert(kR == 1 || kR == 2, "one or two row blocks of 8 heads");
  static_assert(kDecodeShortTokens <= 255, "lengths travel as bytes");
  using namespace decode_detail;
  constexpr int kThreads = kDecodeThreads;
  constexpr int kChunks = D / 8;   // 16-byte chunks per token row
  constexpr int kHalf = D / 16;    // ... per half row: RoPE pairs chunk c with c + kHalf
  constexpr int kStageElems = kDecodeStageTokens * D;
  constexpr int kRows = 8 * kR;
  constexpr int kPages = kDecodeShortTokens / kDecodeStageTokens;  // a pair's pages at most (page >= 16)
  static_assert(kThreads % kChunks == 0, "a thread's K/V chunks share one column");
  using Smem = DecodeShortSmem<D, kR>;
  Smem& sm = *reinterpret_cast<Smem*>(smem);
  __nv_bfloat16* kv = reinterpret_cast<__nv_bfloat16*>(smem + decode_short_kv_offset<D, kR>());
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int group = p.group;
  const int b = pair / p.num_kv_heads, h = pair - b * p.num_kv_heads;
  const int len = p.uniform_len > 0 ? p.uniform_len : p.len[b];
  const int pos = len - 1, units = decode_units(len);
  const bool appends = p.k_new != nullptr;
  const bool tracing = p.trace != nullptr;
  auto stamp = [&](int w) {
    if (tracing) trace_now(p, pair, w);
  };
  if (tid == 0 && tracing) {
    stamp(kDtEntry);
    uint32_t sm_id;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm_id));
    trace_put(p, pair, kDtSm, sm_id);
  }

  // Element offset of token tok in the K (or V) cache; a paged pair's page ids in registers (<= 4,
  // loaded at once: one round trip before the K/V requests, not one per request).
  int page[kPages] = {};
  if constexpr (kPaged) {
    const int* row = p.page_table + int64_t(b) * p.pages_per_seq;
#pragma unroll
    for (int i = 0; i < kPages; ++i)
      if (i * p.page_size < len) page[i] = __ldg(row + i);
  }
  auto offset = [&](int tok) -> int64_t {
    if constexpr (kPaged) {
      const int i = tok / p.page_size;
      const int pg = i == 0 ? page[0] : i == 1 ? page[1] : i == 2 ? page[2] : page[3];
      return ((int64_t(pg) * p.num_kv_heads + h) * p.page_size + (tok - i * p.page_size)) * D;
    } else {
      return (int64_t(pair) * p.max_seq_len + tok) * D;
    }
  };

  // The rows of q (kRows of them, zero past the group), k_new and v_new: task = row * kHalf + c loads
  // chunk c of the row's first half and its RoPE partner in the second.
  constexpr int kTasks = (kRows + 2) * kHalf;
  constexpr int kPer = (kTasks + kThreads - 1) / kThreads;
  uint4 lo[kPer], hi[kPer];
  auto load_rows = [&] {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int task = tid + kThreads * j, row = task / kHalf, c = task % kHalf;
      const __nv_bfloat16* src = nullptr;
      if (row < group)
        src = p.q + (int64_t(pair) * group + row) * D;
      else if (appends && (row == kRows || row == kRows + 1))
        src = (row == kRows ? p.k_new : p.v_new) + int64_t(pair) * D;
      lo[j] = hi[j] = make_uint4(0u, 0u, 0u, 0u);
      if (task < kTasks && src != nullptr) {
        lo[j] = __ldg(reinterpret_cast<const uint4*>(src + 8 * c));
        hi[j] = __ldg(reinterpret_cast<const uint4*>(src + D / 2 + 8 * c));
      }
    }
  };

  // Every K/V row of the pair in one cp.async group: rows past the length zero-filled (the masked
  // scores meet zeros in P V, never the poison of an unwritten cache), the new token's row left to
  // the prologue when appending.
  auto request_kv = [&] {
    const int n = units * kDecodeStageTokens * kChunks, ch = tid % kChunks;
#pragma unroll
    for (int k = 0; k < kDecodeShortTokens * kChunks / kThreads; ++k) {
      const int i = tid + kThreads * k, tok = i / kChunks;
      if (i >= n || (appends && tok == pos)) continue;
      const int r = tok % kDecodeStageTokens;
      __nv_bfloat16* dst = kv + (tok / kDecodeStageTokens) * 2 * kStageElems + r * D + swizzle_chunk(ch, r) * 8;
      const bool ok = tok < len;
      const int64_t src = ok ? offset(tok) + ch * 8 : 0;
      cp_async16(dst, p.k_cache + src, ok ? 16 : 0);
      cp_async16(dst + kStageElems, p.v_cache + src, ok ? 16 : 0);
    }
    cp_async_commit();
  };

  // The rows first: the prologue needs them before the math needs K/V. In an overlapped launch K/V
  // go out before the wait for the kernel before (which writes q, k_new and v_new but no earlier
  // cache rows and no page table) and the rows after it.
  if (!p.overlap) load_rows();
  request_kv();
  runtime::grid_dependency_wait();
  runtime::allow_next_launch();
  if (p.overlap) load_rows();

  const bool rope = p.inv_freq != nullptr;
  if (rope) {
    for (int i = tid; i < D / 2; i += kThreads) {
      float s, c;
      sincosf(float(pos) * __ldg(&p.inv_freq[i]), &s, &c);
      sm.rope[i] = make_float2(c, s);
    }
    __syncthreads();
  }
  // q straight into fragment order: chunk C of row g + 8r holds k-steps 2 (C / 4) and + 1 of lane
  // 4g + C % 4 (q_fragment's layout). k and v go to the cache and to their unit's slot.
  const int pu = pos / kDecodeStageTokens, pr = pos % kDecodeStageTokens;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int task = tid + kThreads * j, row = task / kHalf, c = task % kHalf;
    if (task >= kTasks || (row >= kRows && !appends)) continue;
    uint4 x = lo[j], y = hi[j];
    if (rope && row != kRows + 1) rope_chunks(sm.rope, c, x, y);
    if (row < kRows) {
      const int r = row / 8, l = 4 * (row % 8);
      auto put = [&](int C, uint4 v) {
        const int s = 2 * (C / 4);
        sm.q_frag[(s * kR + r) * 32 + l + C % 4] = make_uint2(v.x, v.y);
        sm.q_frag[((s + 1) * kR + r) * 32 + l + C % 4] = make_uint2(v.z, v.w);
      };
      put(c, x);
      put(c + kHalf, y);
    } else {
      const bool is_k = row == kRows;
      __nv_bfloat16* slot = kv + pu * 2 * kStageElems + (is_k ? 0 : kStageElems) + pr * D;
      *reinterpret_cast<uint4*>(slot + swizzle_chunk(c, pr) * 8) = x;
      *reinterpret_cast<uint4*>(slot + swizzle_chunk(c + kHalf, pr) * 8) = y;
      __nv_bfloat16* cache = (is_k ? p.k_cache : p.v_cache) + offset(pos);
      *reinterpret_cast<uint4*>(cache + 8 * c) = x;
      *reinterpret_cast<uint4*>(cache + D / 2 + 8 * c) = y;
    }
  }
  if (tid == 0) stamp(kDtSetup);
  cp_async_wait<0>();
  __syncthreads();
  if (tid == 0) stamp(kDtFirst);

  __nv_bfloat16* out = p.out + int64_t(pair) * group * D;
  if (warp < units) {
    __nv_bfloat16* ks = kv + warp * 2 * kStageElems;
    const StageRef st[1] = {{ks, ks + kStageElems, min(kDecodeStageTokens, len - warp * kDecodeStageTokens)}};
    const QFrags<D, kR, true> qa{sm.q_frag};
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[kR], l[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) m[r] = -INFINITY, l[r] = 0.f;
    attend_units<D, false, kR, true, 1>(qa, st, p.scale_log2, o, m, l);
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (lane == 0) stamp(kDtWarpEnd + warp);
    if (units == 1) {  // the whole pair: no combine, no barrier
      float inv[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) inv[r] = 1.f / l[r];
#pragma unroll
      for (int q = 0; q < D / 64; ++q) store_column_block<D, kR>(out, group, q, &o[8 * q], inv);
    } else {
      // Into this warp's own slot (its reads are done): [n-tile][lane] float4s, conflict-free both ways.
      __syncwarp();
      float4* part = reinterpret_cast<float4*>(ks);
#pragma unroll
      for (int j = 0; j < D / 8; ++j) part[j * 32 + lane] = make_float4(o[j][0], o[j][1], o[j][2], o[j][3]);
#pragma unroll
      for (int r = 0; r < kR; ++r) sm.ml[warp][r][lane] = make_float2(m[r], l[r]);
    }
  } else if (lane == 0) {
    stamp(kDtWarpEnd + warp);  // no unit: done
  }
  if (units > 1) {
    // Every lane holds the same rows and columns in every warp: the combine is elementwise, cut by
    // 64-column blocks over the warps (1, 2 or 4 blocks at head dim 64, 128, 256).
    __syncthreads();
    for (int q = warp; q < D / 64; q += kDecodeWarps) {
      float f[kDecodeWarps][kR], inv[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float mx = -INFINITY, sum = 0.f;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w)
          if (w < units) mx = fmaxf(mx, sm.ml[w][r][lane].x);
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w) {
          const float2 ml = w < units ? sm.ml[w][r][lane] : make_float2(-INFINITY, 0.f);
          f[w][r] = exp2f(ml.x - mx);  // 0 for a warp with no unit
          sum += f[w][r] * ml.y;
        }
        inv[r] = 1.f / sum;
      }
      float acc[8][4];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        acc[e][0] = acc[e][1] = acc[e][2] = acc[e][3] = 0.f;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w) {
          if (w >= units) continue;
          const float4 v = reinterpret_cast<const float4*>(kv + w * 2 * kStageElems)[(8 * q + e) * 32 + lane];
          acc[e][0] += f[w][0] * v.x;
          acc[e][1] += f[w][0] * v.y;
          acc[e][2] += f[w][kR - 1] * v.z;
          acc[e][3] += f[w][kR - 1] * v.w;
        }
      }
      store_column_block<D, kR>(out, group, q, acc, inv);
    }
  }
  if (tid == 0 && tracing) {  // the timeline's words as the stream-K tile's: one segment, no merge
    stamp(kDtSegsDone);
    trace_put(p, pair, kDtSegments, 1);
    stamp(kDtExit);
  }
}

}  // namespace tw::kernels
