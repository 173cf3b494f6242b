// FP8 inputs of the prefill attention kernel (prefill_sm90.cuh, kFp8): bf16 Q, K, V in the packed
// THD layout -> e4m3 with the scales the kernel folds back in:
//   Q  [total_q][Hq][D], one scale per (token, head): a row's scale multiplies the softmax factor
//      of that row, so it costs nothing per element;
//   K  [rows_pad][Hkv][D], one scale per (block of kPrefillFp8KeyBlock keys, head): a factor per
//      block of the kernel's key tile; each sequence starts on a tile (prefill_fp8_key_offsets);
//   V^T [Hkv][D][rows_pad], one scale per (head, channel) from the channel's amax over all keys:
//      it multiplies O's column in the epilogue. e4m3 wgmma reads B K-major only, so V goes in
//      transposed, its keys within each 16 in the order the kernel's P fragments hold them.
// Keys past a sequence's end in its last block are zero in K and V^T (a NaN pattern there would
// survive P = 0).
// Q and K are rotated first by the same orthogonal matrix R = diag(signs) H / sqrt(D) (H the
// Walsh-Hadamard matrix): (QR)(KR)^T = QK^T, and a channel many times larger than the others is
// spread over all D, so it no longer sets the scale and the rounding of every product
// ("incoherent processing", FlashAttention-3). Simulated with e4m3 rounding on Gaussian inputs
// with four channels 8x larger, L = 8192: cosine to fp32 0.976 -> 0.997; on plain noise no change.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "tileweave/graph/prefill_attention_graph.hpp"  // kPrefillFp8KeyBlock
#include "tileweave/kernels/attention/prefill_sm90.cuh"    // fp8_scale, pack_e4m3

namespace tw::kernels {

struct PrefillFp8QuantParams {
  const __nv_bfloat16* q = nullptr;  // [total_q][heads_q][D]
  const __nv_bfloat16* k = nullptr;  // [total_k][heads_kv][D]
  const __nv_bfloat16* v = nullptr;
  uint8_t* q8 = nullptr;   // e4m3, as q
  uint8_t* k8 = nullptr;   // e4m3 [rows_pad][heads_kv][D]
  uint8_t* vt8 = nullptr;  // e4m3 [heads_kv][D][rows_pad]
  float* q_scale = nullptr;  // [total_q][heads_q]
  float* k_scale = nullptr;  // [heads_kv][k_blocks]
  float* v_amax = nullptr;   // [heads_kv][D]: zeroed before fp8_v_amax, which max-reduces into it
  const int* cu_k = nullptr;       // [batch + 1]
  const int* cu_k_pad = nullptr;   // [batch + 1], multiples of the block
  const int* block_seq = nullptr;  // [k_blocks]: the sequence of each key block
  int total_q = 0, total_k = 0, heads_q = 0, heads_kv = 0, k_blocks = 0, rows_pad = 0;
};

// Where key i (0..15) of a 16-key group sits in V^T: the kernel's e4m3 A fragment reads K position
// 4t + j as key 2t + (j % 2) + 8 (j / 2) (prefill_sm90.cuh, to_p); this is the inverse.
__host__ __device__ constexpr int fp8_key_position(int i) { return 4 * ((i % 8) / 2) + (i % 2) + 2 * (i / 8); }
constexpr bool fp8_key_position_inverts_fragment() {
  for (int pos = 0; pos < 16; ++pos) {
    const int t = pos / 4, j = pos % 4;
    if (fp8_key_position(2 * t + (j % 2) + 8 * (j / 2)) != pos) return false;
  }
  return true;
}
static_assert(fp8_key_position_inverts_fragment(), "V^T's key order must be the inverse of the A fragment's");

// The rotation's sign of channel c (a fixed pseudo-random pattern, the same for Q and K).
__device__ __forceinline__ float rotation_sign(int c) { return ((uint32_t(c) * 0x9E3779B1u) >> 31) ? -1.f : 1.f; }

// Walsh-Hadamard butterflies over the index bits a thread holds (x[i] is channel base + i): the
// stages of the bits above go through shuffles (hadamard_lane_stage).
template <int kN>
__device__ __forceinline__ void hadamard_in_thread(float (&x)[kN]) {
#pragma unroll
  for (int h = 1; h < kN; h *= 2)
#pragma unroll
    for (int i = 0; i < kN; ++i)
      if (!(i & h)) {
        const float a = x[i], b = x[i + h];
        x[i] = a + b;
        x[i + h] = a - b;
      }
}
// One stage across lanes: the partner lane ^ lane_bit holds the channels `bit` away; the lower
// one keeps a + b, the upper b's place a - b.
template <int kN>
__device__ __forceinline__ void hadamard_lane_stage(float (&x)[kN], int lane_bit, bool upper) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float y = __shfl_xor_sync(0xffffffffu, x[i], lane_bit);
    x[i] = upper ? y - x[i] : x[i] + y;
  }
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// V's per-channel amax: block (chunk of kTokens tokens, kv head), 256 threads; thread t reads 8
// channels (16 B) of token t / 16 + 16 i, the block reduces over its tokens in shared memory and
// makes one atomicMax per channel (non-negative floats order as their bit patterns).
template <int kD>
__global__ void __launch_bounds__(256) fp8_v_amax(const PrefillFp8QuantParams p) {
  static_assert(kD == 128, "16 channel groups of 8");
  constexpr int kTokens = 128;
  __shared__ float s_m[16][kD + 1];
  const int head = blockIdx.y, g = threadIdx.x % 16, row = threadIdx.x / 16;
  const int t0 = blockIdx.x * kTokens;
  float m[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  uint4 raw[kTokens / 16];
#pragma unroll
  for (int i = 0; i < kTokens / 16; ++i) {
    const int t = t0 + row + 16 * i;
    raw[i] = t < p.total_k ? *reinterpret_cast<const uint4*>(p.v + (int64_t(t) * p.heads_kv + head) * kD + 8 * g)
                           : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int i = 0; i < kTokens / 16; ++i) {
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw[i]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h2[j]);
      m[2 * j] = fmaxf(m[2 * j], fabsf(f.x));
      m[2 * j + 1] = fmaxf(m[2 * j + 1], fabsf(f.y));
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) s_m[row][8 * g + j] = m[j];
  __syncthreads();
  if (threadIdx.x < kD) {
    float r = 0.f;
#pragma unroll
    for (int i = 0; i < 16; ++i) r = fmaxf(r, s_m[i][threadIdx.x]);
    atomicMax(reinterpret_cast<unsigned*>(p.v_amax + head * kD + threadIdx.x), __float_as_uint(r));
  }
}

// Q: four lanes per (token, head) row of kD = 128, 32 channels each (eight rows a warp): the
// rotation's first five stages stay in the thread and only two cross lanes (a lane per row held
// 32 shuffles a row and the shuffles bound the kernel), then the row's amax over its four lanes.
template <int kD>
__global__ void __launch_bounds__(256) fp8_quantize_q(const PrefillFp8QuantParams p) {
  static_assert(kD == 128, "32 channels a lane");
  const int lane = threadIdx.x % 32, part = lane % 4, c0 = 32 * part;
  const int64_t rows = int64_t(p.total_q) * p.heads_q;
  float sign[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) sign[j] = rotation_sign(c0 + j) * 0.08838834764831845f;  // / sqrt(128)
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 4; r - lane / 4 < rows;
       r += int64_t(gridDim.x) * blockDim.x / 4) {
    const bool live = r < rows;
    uint4 raw[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      raw[i] = live ? *reinterpret_cast<const uint4*>(p.q + r * kD + c0 + 8 * i) : make_uint4(0, 0, 0, 0);
    float x[32];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw[i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h2[j]);
        x[8 * i + 2 * j] = f.x * sign[8 * i + 2 * j];
        x[8 * i + 2 * j + 1] = f.y * sign[8 * i + 2 * j + 1];
      }
    }
    hadamard_in_thread(x);
    hadamard_lane_stage(x, 1, part & 1);
    hadamard_lane_stage(x, 2, part & 2);
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) m = fmaxf(m, fabsf(x[i]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    const float scale = fp8_scale(m), inv = 1.f / scale;
    if (!live) continue;
    uint4 out[2];
    uint32_t* w = reinterpret_cast<uint32_t*>(out);
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = pack_e4m3(x[4 * j] * inv, x[4 * j + 1] * inv, x[4 * j + 2] * inv, x[4 * j + 3] * inv);
    *reinterpret_cast<uint4*>(p.q8 + r * kD + c0) = out[0];
    *reinterpret_cast<uint4*>(p.q8 + r * kD + c0 + 16) = out[1];
    if (part == 0) p.q_scale[r] = scale;
  }
}

// K and V of one block of kPrefillFp8KeyBlock = 64 keys and one kv head, 128 threads. K: thread t
// on key t / 2, channels 64 (t % 2) .. + 63 (two lanes a row for the rotation); the block's amax,
// then its rows. V: warp w on channels 32w + 16 (l / 16) .. + 15 (lane l), keys {2j, 2j + 1,
// 2j + 8, 2j + 9} + 16 ((l / 4) % 4) (j = l % 4), which fp8_key_position puts at the four bytes
// 4j .. 4j + 3 of their group: one 4-byte store per channel into the transposed tile (a thread per
// key and byte stores: 140 us at H = 24, L = 8704 on the H200); then V^T's kD rows of 64 keys go
// out in 16-B pieces.
template <int kD>
__global__ void __launch_bounds__(128) fp8_quantize_kv(const PrefillFp8QuantParams p) {
  static_assert(kD == 128 && kPrefillFp8KeyBlock == 64, "a thread per half key row");
  constexpr int kB = kPrefillFp8KeyBlock;
  __shared__ float s_max[4];
  __shared__ float s_vinv[kD];  // 1 / V's channel scales
  __shared__ __align__(16) uint8_t s_vt[kD][kB];
  const int b = blockIdx.x, head = blockIdx.y, t = threadIdx.x;
  const int seq = p.block_seq[b];
  const int first = (b - p.cu_k_pad[seq] / kB) * kB;  // the block's first key in the sequence
  const int len = p.cu_k[seq + 1] - p.cu_k[seq];
  const int key = t / 2, c0 = 64 * (t % 2);
  const bool live = first + key < len;
  const int64_t src = (int64_t(p.cu_k[seq] + first + key) * p.heads_kv + head) * kD + c0;
  const int64_t row_pad = int64_t(p.cu_k_pad[seq]) + first + key;
  s_vinv[t] = 1.f / fp8_scale(p.v_amax[head * kD + t]);  // read after the K part's barrier

  // K
  float x[64];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (live) raw = *reinterpret_cast<const uint4*>(p.k + src + 8 * i);
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(h2[j]);
      x[8 * i + 2 * j] = f.x;
      x[8 * i + 2 * j + 1] = f.y;
    }
  }
  // The rotation: channels c0 .. c0 + 63 here, the other half in lane ^ 1.
#pragma unroll
  for (int i = 0; i < 64; ++i) x[i] *= rotation_sign(c0 + i) * 0.08838834764831845f;
  hadamard_in_thread(x);
  hadamard_lane_stage(x, 1, t % 2);
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) m = fmaxf(m, fabsf(x[i]));
  m = warp_max(m);
  if (t % 32 == 0) s_max[t / 32] = m;
  __syncthreads();
  m = fmaxf(fmaxf(s_max[0], s_max[1]), fmaxf(s_max[2], s_max[3]));
  const float k_scale = fp8_scale(m), k_inv = 1.f / k_scale;
  uint8_t* k_dst = p.k8 + (row_pad * p.heads_kv + head) * kD + c0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint4 out;
    uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float* e = x + 16 * i + 4 * j;
      w[j] = pack_e4m3(e[0] * k_inv, e[1] * k_inv, e[2] * k_inv, e[3] * k_inv);
    }
    *reinterpret_cast<uint4*>(k_dst + 16 * i) = out;
  }
  if (t == 0) p.k_scale[int64_t(head) * p.k_blocks + b] = k_scale;

  // V
  {
    const int w = t / 32, l = t % 32, j = l % 4, g = (l / 4) % 4, cbase = 32 * w + 16 * (l / 16);
    const int keys[4] = {16 * g + 2 * j, 16 * g + 2 * j + 1, 16 * g + 2 * j + 8, 16 * g + 2 * j + 9};
    uint4 raw[4][2];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        raw[k][h] = make_uint4(0, 0, 0, 0);
        if (first + keys[k] < len)
          raw[k][h] = *reinterpret_cast<const uint4*>(
              p.v + (int64_t(p.cu_k[seq] + first + keys[k]) * p.heads_kv + head) * kD + cbase + 8 * h);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        const int c = cbase + 8 * h + e;
        float f[4][2];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 v2 = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(&raw[k][h])[e / 2]);
          f[k][0] = v2.x * s_vinv[c];
          f[k][1] = v2.y * s_vinv[c + 1];
        }
        *reinterpret_cast<uint32_t*>(&s_vt[c][16 * g + 4 * j]) = pack_e4m3(f[0][0], f[1][0], f[2][0], f[3][0]);
        *reinterpret_cast<uint32_t*>(&s_vt[c + 1][16 * g + 4 * j]) = pack_e4m3(f[0][1], f[1][1], f[2][1], f[3][1]);
      }
  }
  __syncthreads();
  // kD rows of 64 B: 4 x 16 B each, 512 stores of 16 B over 128 threads.
  const int64_t col = int64_t(p.cu_k_pad[seq]) + first;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = t + 128 * i, d = idx / 4, part = idx % 4;
    *reinterpret_cast<uint4*>(p.vt8 + (int64_t(head) * kD + d) * p.rows_pad + col + 16 * part) =
        *reinterpret_cast<const uint4*>(&s_vt[d][16 * part]);
  }
}

}  // namespace tw::kernels
