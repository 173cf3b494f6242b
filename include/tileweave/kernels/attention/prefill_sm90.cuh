// Prefill attention tile body for sm_90a (ops/prefill_attention.hpp is the op;
// docs/prefill_attention.md the design). Persistent blocks, one per SM, each taking (query tile,
// query head) items, or a unit of the last round's items split over key ranges (PrefillParams'
// tail: its pieces one after another, a split item's last piece merging its partials);
// 128 x (1 + kWGs) threads:
//   warpgroup 0: one thread streams Q once, then K and V tiles of kBN keys (64 at d = 256, 128 or
//     160 at d = 128, 128 at d = 64) through TMA
//     into rings of kStages stages each (K and V on barriers of their own: S = QK^T starts before
//     V lands, and a K slot is refilled as soon as its S GEMM is done);
//   warpgroups 1 .. kWGs (2, or 3 at d = 64): 64 query rows each. Per key tile j: S_j = Q K_j^T
//     (wgmma, both operands in shared memory) is issued, then O += P_{j-1} V_{j-1} (wgmma with P in
//     registers, V read MN-major); the softmax of S_j runs while the PV GEMM is in flight, O is
//     rescaled once it completes. fp32 online softmax in exp2 units, row sums reduced once.
// kFp8: e4m3 Q, K and V^T (prefill_fp8_quant.cuh writes them and their scales), both GEMMs k = 32
// e4m3 wgmma; the scales fold into the softmax's per-row factor (Q per token, K per key tile) and the
// epilogue (V per channel).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include <cuda/atomic>

#include "tileweave/graph/prefill_attention_graph.hpp"  // kPrefillFp8KeyBlock
#include "tileweave/kernels/sm90/arch.cuh"
#include "tileweave/kernels/sm90/tma.cuh"
#include "tileweave/kernels/sm90/wgmma.cuh"

namespace tw::kernels {

struct PrefillParams {
  const int* cu_q = nullptr;    // [batch + 1]
  const int* cu_k = nullptr;    // [batch + 1]
  const int* tiles = nullptr;   // {seq, q_tile, kv_tiles} per query tile (graph/prefill_attention_graph.hpp)
  int num_tiles = 0;            // query tiles per head
  int num_work = 0;             // draws: whole items, then the tail's units (num_tiles * heads_q items without one)
  int* work_counter = nullptr;  // zero before a launch; the launch leaves it zero
  // The tail (PrefillWork; the standalone kernel only): draws [num_whole, num_work) take unit
  // d - num_whole, whose pieces are unit_pieces[unit_offsets[u] ..], kPieceInts ints each. A split
  // item's pieces write partials to split_ws and count on split_count (zero between launches).
  int num_whole = 0;
  const int* unit_offsets = nullptr;
  const int* unit_pieces = nullptr;
  float* split_ws = nullptr;
  int* split_count = nullptr;
  int heads_q = 0;
  int group = 1;  // query heads per KV head
  int causal = 0;
  int total_q = 0;
  float scale_log2 = 0.f;  // softmax scale * log2(e)
  __nv_bfloat16* out = nullptr;
  float* lse = nullptr;
  // FP8 only (prefill_fp8_quant.cuh): each sequence's first row in the quantized K / V^T, the
  // scales (Q [total_q][heads_q]; K [heads_kv][k_blocks], a block per key tile) and V's channel
  // amax [heads_kv][D] (its scale is fp8_scale(amax)).
  const int* cu_k_pad = nullptr;
  const float* q_scale = nullptr;
  const float* k_scale = nullptr;
  const float* v_amax = nullptr;
  int k_blocks = 0;
};

constexpr float kFp8Max = 448.f;  // the largest finite e4m3
// The dequantization factor of a block whose largest magnitude is amax (an all-zero block: 1).
__host__ __device__ inline float fp8_scale(float amax) { return amax > 0.f ? amax / kFp8Max : 1.f; }
// Four fp32 -> four e4m3 in one register, the first in the low byte (saturating): the kernel's P and
// the quantizer's outputs (prefill_fp8_quant.cuh).
__device__ __forceinline__ uint32_t pack_e4m3(float a, float b, float c, float d) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

template <int kD, int kBN_ = 128, int kWGs_ = 2, bool kFp8_ = false>
struct PrefillConfig {
  static_assert(kD == 64 || kD == 128 || kD == 256, "head_dim 64, 128 or 256");
  static_assert(!kFp8_ || (kD == 128 && kBN_ % 64 == 0 && kBN_ % kPrefillFp8KeyBlock == 0),
                "fp8: head_dim 128, key tiles of whole 64-key V^T chunks and K scale blocks");
  static constexpr bool kFp8 = kFp8_;
  static constexpr int kHeadDim = kD;
  static constexpr int kElem = kFp8 ? 1 : 2;  // bytes per element
  static_assert(kBN_ % 16 == 0 && kBN_ <= 256, "keys per tile: a multiple of 16, a TMA box of <= 256 rows");
  static_assert(kWGs_ == 2 || kWGs_ == 3, "two or three consumer warpgroups");
  static constexpr int kWGs = kWGs_;                    // consumer warpgroups, 64 query rows each
  static constexpr int kBM = 64 * kWGs, kBN = kBN_;  // graph/prefill_attention_graph.hpp's prefill_block_m
  static constexpr int kChunks = kD * kElem / 128;  // 128-B swizzle rows per operand row
  static constexpr int kChunkElems = 128 / kElem;
  static constexpr int kKSteps = kD * kElem / 32;   // wgmma k-steps (16 bf16 or 32 e4m3: 32 B) over D
  // fp8 gives the PV GEMM 8 more B rows of ones (kVRows, filled once at the start, never loaded):
  // O's columns kD .. kD + 7 are then P's row sums, as P was rounded to e4m3, and the softmax drops
  // its adds (one of ~8 instructions an element).
  static constexpr int kVRows = kFp8 ? kD + 8 : kD;
  static constexpr int kOAcc = kVRows / 2;  // O accumulators a thread
  // fp8 V^T tile: kBN / 64 chunks of [kVRows rows][64 keys], 64-B swizzle (a 128-B box would need
  // the tile's keys in multiples of 128).
  static constexpr int kVChunks = kFp8 ? kBN_ / 64 : kChunks, kVChunkBytes = kFp8 ? kVRows * 64 : kBN_ * 128;
  static constexpr int kVChunkElems = kFp8 ? 64 : kChunkElems;
  static constexpr int kScaleBlocks = kFp8 ? kBN_ / kPrefillFp8KeyBlock : 1;  // K scales per key tile
  // The consumer warpgroups take turns issuing their GEMMs (bf16: ~1%, measured). fp8 runs freer
  // without: 718 -> 756 TFLOP/s at H 24 L 8704, causal 662 -> 685 (H200, one call, 2026-11-25): the
  // softmax is as long as the GEMMs there, and a warpgroup ready to issue waited for its turn.
  static constexpr bool kTurns = !kFp8;
  // d = 128: Q 32 KiB + 2 x (K + V): 160 KiB at 128 keys, 192 at 160; d = 64: 16 + 4 x 32 KiB;
  // d = 256: Q 64 KiB + 2 x (32 + 32) at 64 keys.
  // Three stages at d = 128 (225 KiB) measured 2-3% slower than two (H200, L 4608-14034).
  // fp8: 24 KiB a tile at 192 keys, Q 16 KiB: 3 stages 160 KiB.
  static constexpr int kStages = kFp8 ? 3 : kD >= 128 ? 2 : 4;
  static constexpr int kQBytes = kBM * kD * kElem;
  static constexpr int kTileBytes = kBN * kD * kElem;  // one K or one V tile (the bytes TMA brings)
  static constexpr int kVSlotBytes = kFp8 ? kVChunks * kVChunkBytes : kTileBytes;  // a V slot, with the ones
  static constexpr int kThreads = 128 * (kWGs + 1);
  // setmaxnreg budgets (x 128 threads: producer + consumers <= 64K). 176 keys per tile spilled
  // even at 232 and ran no faster than 160.
  // d = 256: O alone is 128 registers a consumer thread; 232 of them (the producer's 40 suffice).
  static constexpr int kProducerRegs = kWGs == 3 ? 32 : kD == 256 ? 40 : 56;
  static constexpr int kConsumerRegs = kWGs == 3 ? 160 : kD == 256 ? 232 : 224;
  static constexpr int kConsumerWarps = 4 * kWGs;
  static constexpr int kSmemBytes = kQBytes + kStages * (kTileBytes + kVSlotBytes) + 256 + 1024;  // + barriers, slack
  static_assert((2 + 4 * kStages) * 8 + 64 <= 256, "barriers and the item slot (a PrefillItem) fit their 256 B");
};

// The softmax's arithmetic, shared by this kernel and prefill_sm80.cuh's (any sm_80+ target).
namespace prefill_detail {
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
}  // namespace prefill_detail

#if TW_SM90_ENABLED
namespace prefill_detail {

// Online-softmax state of the two rows a thread holds (row g and g + 8 of its warp's 16).
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};  // running max of scale_log2 * s
  float l[2] = {0.f, 0.f};              // this thread's share of the row sums, in units of 2^m
};

// Measured on the H200 (2026-11-24, A/B in one call): slack 8 against 0, +1-3% (d = 128 causal
// +3%): most tiles then skip the 64 multiplies of O's rescale.
constexpr float kRescaleSlack = 8.f;
// FP8: P <= 2^(2 + 6) = 256; the rescale still skipped for a max that moves by <= 4x.
constexpr float kFp8Slack = 2.f, kFp8POffset = 6.f;

// S (m64nkBN accumulators: s[4i + 2h + c] is row g + 8h, key 8i + 2(lane % 4) + c) -> P = 2^(S' - m)
// in place, m and l updated; alpha gets the factors the rows' earlier O must be scaled by, and the
// result says whether any is not 1. The running max moves only when a tile's exceeds it by more
// than `slack` (log2 units): P stays <= 2^slack (finite in fp32 and bf16 for slack <= 64), O / l
// is the same whatever m is, and most tiles then need no rescale of O at all.
// P is 2^(S' - m + p_offset) (l too, in the same units): the FP8 path stores P in e4m3, whose
// smallest normal is 2^-6, and lifts the small probabilities out of its subnormals this way
// (P <= 2^(slack + p_offset) must stay <= 448).
// scale_log2[h][b]: row h's factor for keys of block b (kBN / kBlocks keys each; fp8: the K block
// scales differ): the max is taken per block, scaled, then across blocks.
template <int kBN, int kBlocks = 1, bool kRowSum = true>
__device__ __forceinline__ bool softmax_tile(float (&s)[kBN / 2], RowState& st, const float (&scale_log2)[2][kBlocks],
                                             float slack, float p_offset, float (&alpha)[2]) {
  constexpr int kPer = kBN / 8 / kBlocks;  // 8-key groups a block
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    // Four independent chains for the max and the sum: one chain of kBN / 4 dependent ops would
    // leave the softmax latency-bound (one warp per scheduler runs it).
    float mx = -INFINITY;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      float mx4[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
#pragma unroll
      for (int i = b * kPer; i < (b + 1) * kPer; ++i)
        mx4[i % 4] = fmaxf(mx4[i % 4], fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
      mx = fmaxf(mx, fmaxf(fmaxf(mx4[0], mx4[1]), fmaxf(mx4[2], mx4[3])) * scale_log2[h][b]);
    }
    const float m_row = quad_max(mx);
    const float m_new = m_row > st.m[h] + slack ? m_row : st.m[h];
    // A row that has seen only masked keys keeps m = -inf: subtract 0 instead (no inf - inf).
    const float base = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = ex2(st.m[h] - base);
    const float shift = base - p_offset;
    float sum4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[4 * i + 2 * h + c];
        x = ex2(fmaf(x, scale_log2[h][i / kPer], -shift));
        if constexpr (kRowSum) sum4[(2 * i + c) % 4] += x;
      }
    if constexpr (kRowSum) st.l[h] = st.l[h] * alpha[h] + ((sum4[0] + sum4[1]) + (sum4[2] + sum4[3]));
    st.m[h] = m_new;
  }
  return alpha[0] != 1.f || alpha[1] != 1.f;
}

}  // namespace prefill_detail
#endif

// One work item: query rows [q_tile * kBM, + kBM) of sequence seq's query head `head` against its key
// tiles kv_first .. kv_first + n_kv - 1; k_row is the sequence's first row in the K / V tensors read
// (the padded ones for fp8). split >= 0: a piece of a split item, its entry in the params'
// unit_pieces (the epilogue reads its counter and slots there: fewer registers held over the item).
struct PrefillItem {
  int head, q_tile, n_kv, q_begin, len_q, k_begin, len_k, k_row;
  int kv_first = 0, split = -1;
};
// A piece in the params' unit_pieces: item, kv_first, kv_tiles, group, slot, first_slot, parts
// (graph/prefill_attention_graph.hpp's PrefillPiece).
constexpr int kPieceInts = 7;
// A split piece's partial, per consumer thread, in float4s: O's accumulators (D / 2 a thread; fp8 8
// columns more, its row sums: PrefillConfig::kVRows), then one of the rows' m and l. The op sizes
// split_ws with it (x 128 threads x the consumer warpgroups x the slots).
__host__ __device__ constexpr int prefill_partial_vec4(int head_dim, bool fp8) {
  return (fp8 ? head_dim + 8 : head_dim) / 8 + 1;
}
// Item w: query tile w % num_tiles of head w / num_tiles (PrefillParams::tiles).
template <bool kFp8>
__device__ __forceinline__ PrefillItem prefill_item(const PrefillParams& p, int w) {
  PrefillItem it;
  const int t = w % p.num_tiles;
  it.head = w / p.num_tiles;
  const int seq = p.tiles[3 * t];
  it.q_tile = p.tiles[3 * t + 1];
  it.n_kv = p.tiles[3 * t + 2];
  it.q_begin = p.cu_q[seq];
  it.len_q = p.cu_q[seq + 1] - it.q_begin;
  it.k_begin = p.cu_k[seq];
  it.len_k = p.cu_k[seq + 1] - it.k_begin;
  it.k_row = kFp8 ? p.cu_k_pad[seq] : it.k_begin;
  return it;
}

// Piece `i` of the params' unit_pieces as the item its consumers run.
template <bool kFp8>
__device__ __forceinline__ PrefillItem prefill_piece(const PrefillParams& p, int i) {
  const int* q = p.unit_pieces + kPieceInts * i;
  PrefillItem it = prefill_item<kFp8>(p, q[0]);
  it.kv_first = q[1];
  it.n_kv = q[2];
  it.split = q[3] >= 0 ? i : -1;
  return it;
}

// The shared memory of the attention's tile body: Q (1024-B aligned, as the swizzle needs), the K and
// V rings after it, and their barriers wherever the kernel keeps them (kBarrierWords words).
template <class C>
struct PrefillSmem {
  static constexpr int kDataBytes = C::kQBytes + C::kStages * (C::kTileBytes + C::kVSlotBytes);
  static constexpr int kBarrierWords = 2 + 4 * C::kStages;
  uint8_t *sq, *sk, *sv;  // sq: [chunk][kBM rows][128 B]; sk: [stage][chunk][kBN keys][128 B]; sv: the same
                          // (fp8: [stage][chunk][kVRows d][64 B] of V^T)
  uint64_t *q_full, *q_empty, *k_full, *v_full, *k_empty, *v_empty;
  __device__ PrefillSmem(uint8_t* data, uint64_t* bars)
      : sq(data), sk(data + C::kQBytes), sv(data + C::kQBytes + C::kStages * C::kTileBytes), q_full(bars),
        q_empty(bars + 1), k_full(bars + 2), v_full(bars + 2 + C::kStages), k_empty(bars + 2 + 2 * C::kStages),
        v_empty(bars + 2 + 3 * C::kStages) {}
#if TW_SM90_ENABLED
  // One thread, before the block's first barrier.
  __device__ void init() const {
    namespace ptx = cuda::ptx;
    using tw::sm90::mbar_init;
    mbar_init(q_full, 1);
    // Every consumer thread arrives: each has read the item (the standalone kernel's slot), and an
    // arrive releases only its own thread's accesses (one lane per warp after __syncwarp left
    // compute-sanitizer's racecheck reporting the item slot's reuse as a hazard).
    mbar_init(q_empty, C::kConsumerWarps * 32);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&v_full[s], 1);
      mbar_init(&k_empty[s], C::kConsumerWarps);
      mbar_init(&v_empty[s], C::kConsumerWarps);
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // visible to the async proxy
  }
#endif
};

#if TW_SM90_ENABLED
// Producer, one thread: item it's Q into sq, completing on q_full (the caller has seen q_empty of the
// item before), then its K and V tiles through the rings. k_it / v_it count the K / V tiles this
// block has loaded so far (slot n % kStages, each slot's uses alternating parity).
template <class C>
__device__ __forceinline__ void prefill_load_item(const PrefillSmem<C>& sm, const PrefillParams& p, const PrefillItem& it,
                                                  const CUtensorMap& map_q, const CUtensorMap& map_k,
                                                  const CUtensorMap& map_v, uint32_t& k_it, uint32_t& v_it,
                                                  uint64_t pol_q, uint64_t pol_kv) {
  namespace ptx = cuda::ptx;
  using namespace tw::sm90;
  constexpr int kBM = C::kBM, kBN = C::kBN, kStages = C::kStages;
  constexpr bool kFp8 = C::kFp8;
  uint8_t *sq = sm.sq, *sk = sm.sk, *sv = sm.sv;
  uint64_t *q_full = sm.q_full, *k_full = sm.k_full, *v_full = sm.v_full, *k_empty = sm.k_empty, *v_empty = sm.v_empty;
  // Box coordinates (x, y, z) of the map; `chunks` boxes, box c at x + c * chunk_elems, chunk_bytes
  // apart in the slot.
  auto load = [&](uint8_t* ring, int slot_bytes, const CUtensorMap* map, uint64_t* full, uint64_t* empty, uint32_t n,
                  int x, int y, int z, int chunks, int chunk_bytes, int chunk_elems) {
    const uint32_t s = n % kStages;
    if (n >= kStages) mbar_wait(&empty[s], ((n / kStages) + 1) & 1, "kv_empty");
    ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &full[s], C::kTileBytes);
#pragma unroll
    for (int c = 0; c < chunks; ++c)
      tma_load_3d(ring + s * slot_bytes + c * chunk_bytes, map, x + c * chunk_elems, y, z, &full[s], pol_kv);
  };
  const int kv_head = it.head / p.group;
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, q_full, C::kQBytes);
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c)
    tma_load_3d(sq + c * kBM * 128, &map_q, c * C::kChunkElems, it.head, it.q_begin + it.q_tile * kBM, q_full,
                pol_q);
  // K_j is freed when S_j is done, V_j only when O += P_j V_j is, half an iteration later: K
  // goes one tile ahead of V (K_j, then V_{j-1}) so that a late V slot never holds up a K load.
  // V is [rows][heads][D] (bf16) or V^T [heads][D][rows] (fp8).
  auto load_v = [&](int j) {
    const int row = it.k_row + (it.kv_first + j) * kBN;
    load(sv, C::kVSlotBytes, &map_v, v_full, v_empty, v_it++, kFp8 ? row : 0, kFp8 ? 0 : kv_head,
         kFp8 ? kv_head : row, C::kVChunks, C::kVChunkBytes, C::kVChunkElems);
  };
  for (int j = 0; j < it.n_kv; ++j) {
    load(sk, C::kTileBytes, &map_k, k_full, k_empty, k_it++, 0, kv_head, it.k_row + (it.kv_first + j) * kBN,
         C::kChunks, kBN * 128, C::kChunkElems);
    if (j > 0) load_v(j - 1);
  }
  load_v(it.n_kv - 1);
}

// A piece of a split item, after its last PV GEMM: its partial (O unnormalised in units of 2^m, each
// row's m and sum l) goes to its slot, then each warp counts on its own counter (a warp's 16 rows are
// its own in every piece of the item, so warps merge apart and never wait). The item's last piece
// to count takes the others' partials into o, m and l and returns true (the caller stores the
// rows); the others return false. No piece waits for another: no deadlock, whatever the order.
template <class C>
__device__ __forceinline__ bool merge_split_piece(const PrefillParams& p, const PrefillItem& it, int cw, int tid,
                                                  float (&o)[C::kOAcc], float (&m)[2], float (&l)[2]) {
  using prefill_detail::ex2;
  constexpr int kVec = prefill_partial_vec4(C::kHeadDim, C::kFp8);  // thread-minor: coalesced
  static_assert(kVec == C::kOAcc / 4 + 1, "o's float4s, then {m0, m1, l0, l1}");
  const int* const piece = p.unit_pieces + kPieceInts * it.split;
  const int group = piece[3], slot = piece[4], first_slot = piece[5], parts = piece[6];
  auto part = [&](int s) {
    return reinterpret_cast<float4*>(p.split_ws) + (int64_t(s) * C::kWGs + cw) * (128 * kVec) + tid;
  };
  float4* const mine = part(slot);
#pragma unroll
  for (int i = 0; i < C::kOAcc / 4; ++i)
    __stcg(mine + 128 * i, make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]));
  __stcg(mine + 128 * (kVec - 1), make_float4(m[0], m[1], l[0], l[1]));
  // The warp's stores, then lane 0's release (cumulative over them through the warp barrier); the
  // last piece's acquire, then the barrier, orders the warp's loads of the others' partials after it.
  __syncwarp();
  int last = 0;
  if (tid % 32 == 0) {
    cuda::atomic_ref<int, cuda::thread_scope_device> count(p.split_count[(group * C::kWGs + cw) * 4 + tid / 32]);
    last = count.fetch_add(1, cuda::memory_order_acq_rel) == parts - 1;
    if (last) count.store(0, cuda::memory_order_relaxed);  // zero for the next launch: every piece has counted
  }
  last = __shfl_sync(0xffffffffu, last, 0);
  __syncwarp();
  if (!last) return false;
  // Every piece's partial, its own too, read back in slot order: the sum is the same whichever piece
  // is last (graph and stream launches give the same bits).
  float mx[2] = {m[0], m[1]};
  for (int k = 0; k < parts; ++k) {
    const float4 st = __ldcg(part(first_slot + k) + 128 * (kVec - 1));
    mx[0] = fmaxf(mx[0], st.x);
    mx[1] = fmaxf(mx[1], st.y);
  }
  // A row no piece has seen a key of keeps m = -inf (l = 0): scale by 2^(m - 0) = 0 instead of NaN.
  const float base[2] = {mx[0] == -INFINITY ? 0.f : mx[0], mx[1] == -INFINITY ? 0.f : mx[1]};
  l[0] = l[1] = 0.f;
#pragma unroll
  for (int i = 0; i < C::kOAcc; ++i) o[i] = 0.f;
  for (int k = 0; k < parts; ++k) {
    const float4* const other = part(first_slot + k);
    const float4 st = __ldcg(other + 128 * (kVec - 1));
    const float f0 = ex2(st.x - base[0]), f1 = ex2(st.y - base[1]);
    l[0] += st.z * f0, l[1] += st.w * f1;
#pragma unroll
    for (int i = 0; i < C::kOAcc / 4; ++i) {
      const float4 v = __ldcg(other + 128 * i);
      o[4 * i] += v.x * f0, o[4 * i + 1] += v.y * f0, o[4 * i + 2] += v.z * f1, o[4 * i + 3] += v.w * f1;
    }
  }
  m[0] = base[0], m[1] = base[1];
  return true;
}

// Consumer warpgroup cw (0 .. kWGs - 1): its 64 query rows of item `it`, whose Q the caller has seen
// land (q_full). Arrives on q_empty once its last S GEMM has read Q, and on the K / V slots' empty
// barriers as it finishes with them; writes its rows of p.out (and p.lse). k_it / v_it: the K / V
// tiles this block's consumers have taken so far.
template <class C>
__device__ __forceinline__ void prefill_attend_item(const PrefillSmem<C>& sm, const PrefillParams& p, const PrefillItem& it,
                                                    int cw, uint32_t my_turn, uint32_t other_turn, uint32_t& k_it,
                                                    uint32_t& v_it) {
  using namespace tw::sm90;
  using namespace prefill_detail;
  constexpr int kD = C::kHeadDim, kBM = C::kBM, kBN = C::kBN, kStages = C::kStages;
  constexpr bool kFp8 = C::kFp8;
  uint8_t *sq = sm.sq, *sk = sm.sk, *sv = sm.sv;
  uint64_t *q_empty = sm.q_empty, *k_full = sm.k_full, *v_full = sm.v_full, *k_empty = sm.k_empty,
           *v_empty = sm.v_empty;
  (void)sq;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const uint64_t q_desc = make_desc_sw128(sm.sq + cw * 64 * 128);
  const int r0 = it.q_tile * kBM + cw * 64 + warp * 16 + lane / 4;  // rows r0 and r0 + 8 of the sequence
  const int diag = it.len_k - it.len_q;                             // causal: key <= row + diag
  RowState st;
  float o[C::kOAcc];
  // The softmax's factor per row: scale * log2(e), times the rows' Q scales and the key tile's K
  // scale for fp8 (q_sc[h] * k_scale[tile]).
  float q_sc[2] = {p.scale_log2, p.scale_log2};
  const int kv_head = it.head / p.group;
  if constexpr (kFp8) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (r0 + 8 * h < it.len_q) q_sc[h] *= p.q_scale[int64_t(it.q_begin + r0 + 8 * h) * p.heads_q + it.head];
  }
  constexpr int kSB = C::kScaleBlocks;
  const float* k_scale = kFp8 ? p.k_scale + int64_t(kv_head) * p.k_blocks + it.k_row / kPrefillFp8KeyBlock : nullptr;
  // The tile's K scales, loaded before the waits of its tile so their latency hides under them.
  auto k_tile_scale = [&](int j, float(&ks)[kSB]) {
#pragma unroll
    for (int b = 0; b < kSB; ++b) ks[b] = kFp8 ? k_scale[kSB * (it.kv_first + j) + b] : 1.f;
  };
  auto row_scale = [&](const float(&ks)[kSB], float(&sc)[2][kSB]) {
#pragma unroll
    for (int b = 0; b < kSB; ++b) {
      sc[0][b] = q_sc[0] * ks[b];
      sc[1][b] = q_sc[1] * ks[b];
    }
  };
  constexpr float kSlack = kFp8 ? kFp8Slack : kRescaleSlack, kPOffset = kFp8 ? kFp8POffset : 0.f;
  constexpr int kPSteps = kBN * C::kElem / 32;  // PV k-steps: 16 keys (bf16) or 32 (e4m3)
  if (it.n_kv > 0) {
    auto issue_s = [&](float(&s)[kBN / 2], uint32_t stage) {
      const uint64_t k_desc = make_desc_sw128(sk + stage * C::kTileBytes);
#pragma unroll
      for (int kk = 0; kk < C::kKSteps; ++kk) {
        const uint32_t off_q = (kk / 4) * kBM * 128 + (kk % 4) * 32, off_k = (kk / 4) * kBN * 128 + (kk % 4) * 32;
        if constexpr (kFp8)
          WgmmaFp8<kBN>::mma(s, desc_add(q_desc, off_q), desc_add(k_desc, off_k), kk > 0);
        else
          Wgmma<kBN>::mma(s, desc_add(q_desc, off_q), desc_add(k_desc, off_k), kk > 0);
      }
      wgmma_commit();
    };
    // bf16: V [keys][D] read MN-major; fp8: V^T [D][keys] read K-major, 32 keys (32 B) a step.
    auto issue_pv = [&](const uint32_t(&pf)[kPSteps][4], uint32_t stage, bool first) {
      if constexpr (kFp8) {
        const uint64_t v_desc = make_desc_sw64(sv + stage * C::kVSlotBytes);
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)
          WgmmaFp8RS<C::kVRows>::mma(o, pf[kk], desc_add(v_desc, (kk / 2) * C::kVChunkBytes + (kk % 2) * 32),
                                     !first || kk > 0);
      } else {
        const uint64_t v_desc = make_desc_sw128_mn(sv + stage * C::kTileBytes, kBN * 128);
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)
          WgmmaRS<kD, 1>::mma(o, pf[kk], desc_add(v_desc, kk * 16 * 128), !first || kk > 0);
      }
      wgmma_commit();
    };
    // Keys of tile j that the mask hides from some row of this warpgroup: the last (ragged)
    // tile, and under the causal mask the tiles crossing the diagonal.
    auto mask = [&](float(&s)[kBN / 2], int j_local) {
      const int j = it.kv_first + j_local, first_row = it.q_tile * kBM + cw * 64;
      const bool ragged = (j + 1) * kBN > it.len_k;
      const bool diagonal = p.causal && (j + 1) * kBN - 1 > first_row + diag;
      if (!ragged && !diagonal) return;
#pragma unroll
      for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int key = j * kBN + 8 * i + 2 * (lane % 4) + c;
            const bool hidden = key >= it.len_k || (p.causal && key > r0 + 8 * h + diag);
            if (hidden) s[4 * i + 2 * h + c] = -INFINITY;
          }
    };
    // bf16: P's A fragments are S's accumulators packed pairwise. e4m3: register r of k-step kk
    // holds row g + 8 (r % 2) at K positions 4t .. 4t + 3 (+16 for r >= 2, t = lane % 4), but the
    // thread's accumulators of that row are keys 2t, 2t + 1, 2t + 8, 2t + 9 (+16): K position
    // 4t + i stands for key 2t + (i % 2) + 8 (i / 2) of its 16, and the quantizer stores V^T's
    // keys in that order (prefill_fp8_quant.cuh, fp8_key_position), so no shuffle is needed.
    auto to_p = [](const float(&s)[kBN / 2], uint32_t(&pf)[kPSteps][4]) {
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (kFp8) {
            const int b = 16 * kk + 2 * (r % 2) + 8 * (r / 2);
            pf[kk][r] = pack_e4m3(s[b], s[b + 1], s[b + 4], s[b + 5]);
          } else {
            pf[kk][r] = pack_bf16(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
          }
        }
    };

    float s[kBN / 2];
    uint32_t pf[kPSteps][4];
    float alpha[2], sc[2][kSB], ks[kSB];
    k_tile_scale(0, ks);
    {
      const uint32_t sk0 = k_it % kStages;
      mbar_wait(&k_full[sk0], (k_it / kStages) & 1, "k_full");
      if (C::kTurns) named_bar_sync(my_turn, 256);
      wgmma_fence();
      issue_s(s, sk0);
      if (C::kTurns) named_bar_arrive(other_turn, 256);
      wgmma_wait<0>();
      fence_operands(s);
      if (lane == 0) mbar_arrive(&k_empty[sk0]);
      if (it.n_kv == 1) mbar_arrive(q_empty);  // the item's last S GEMM has read Q
      ++k_it;
    }
    mask(s, 0);
    row_scale(ks, sc);
    softmax_tile<kBN, kSB, !kFp8>(s, st, sc, kSlack, kPOffset, alpha);
    to_p(s, pf);
    for (int j = 1; j < it.n_kv; ++j) {
      const uint32_t sj = k_it % kStages, sp = v_it % kStages;
      k_tile_scale(j, ks);
      mbar_wait(&k_full[sj], (k_it / kStages) & 1, "k_full");
      mbar_wait(&v_full[sp], (v_it / kStages) & 1, "v_full");
      if (C::kTurns) named_bar_sync(my_turn, 256);
      wgmma_fence();
      issue_s(s, sj);
      issue_pv(pf, sp, j == 1);
      if (C::kTurns) named_bar_arrive(other_turn, 256);
      wgmma_wait<1>();  // S_j done; PV_{j-1} may still run
      fence_operands(s);
      if (lane == 0) mbar_arrive(&k_empty[sj]);
      if (j == it.n_kv - 1) mbar_arrive(q_empty);
      ++k_it;
      mask(s, j);
      row_scale(ks, sc);
      const bool rescale = __any_sync(0xffffffffu, softmax_tile<kBN, kSB, !kFp8>(s, st, sc, kSlack, kPOffset, alpha));
      wgmma_wait<0>();
      fence_operands(o);
#pragma unroll
      for (int kk = 0; kk < kPSteps; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) fence_operand(pf[kk][r]);  // P_{j-1} stays live until its GEMM is done
      if (lane == 0) mbar_arrive(&v_empty[sp]);
      ++v_it;
      if (rescale) {
#pragma unroll
        for (int i = 0; i < C::kOAcc / 4; ++i) {
          o[4 * i + 0] *= alpha[0];
          o[4 * i + 1] *= alpha[0];
          o[4 * i + 2] *= alpha[1];
          o[4 * i + 3] *= alpha[1];
        }
      }
      to_p(s, pf);
    }
    const uint32_t sl = v_it % kStages;
    mbar_wait(&v_full[sl], (v_it / kStages) & 1, "v_full");
    if (C::kTurns) named_bar_sync(my_turn, 256);
    wgmma_fence();
    issue_pv(pf, sl, it.n_kv == 1);
    if (C::kTurns) named_bar_arrive(other_turn, 256);
    wgmma_wait<0>();
    fence_operands(o);
    if (lane == 0) mbar_arrive(&v_empty[sl]);
    ++v_it;
  } else {
    mbar_arrive(q_empty);
#pragma unroll
    for (int i = 0; i < C::kOAcc; ++i) o[i] = 0.f;
  }

  // Epilogue: rows past the sequence (the tile's overhang into the next one, or past the
  // tensor's end) are computed but not stored.
  const int row_stride = p.heads_q * kD;
  // fp8: O's columns times V's channel scales (the thread's columns 8i + 2t, + 1).
  float2 v_sc[kD / 8];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) {
    v_sc[i] = make_float2(1.f, 1.f);
    if constexpr (kFp8) {
      const float2 a =
          *reinterpret_cast<const float2*>(p.v_amax + int64_t(kv_head) * kD + 8 * i + 2 * (lane % 4));
      v_sc[i] = make_float2(fp8_scale(a.x), fp8_scale(a.y));
    }
  }
  // fp8: the row sum is O's column kD + 2t, the whole row's (the GEMM summed over the keys).
  float l_rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) l_rows[h] = kFp8 ? o[kD / 2 + 2 * h] : quad_sum(st.l[h]);
  // (fp8: O's row-sum columns merge with the rest, and l_rows with them.)
  if (it.split >= 0 && !merge_split_piece<C>(p, it, cw, tid, o, st.m, l_rows)) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    const float l = l_rows[h];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (row >= it.len_q) continue;
    __nv_bfloat16* dst = p.out + int64_t(it.q_begin + row) * row_stride + it.head * kD + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < kD / 8; ++i)
      *reinterpret_cast<uint32_t*>(dst + 8 * i) =
          pack_bf16(o[4 * i + 2 * h] * inv * v_sc[i].x, o[4 * i + 2 * h + 1] * inv * v_sc[i].y);
    if (p.lse && lane % 4 == 0)
      p.lse[int64_t(it.head) * p.total_q + it.q_begin + row] =
          l > 0.f ? (st.m[h] + __log2f(l) - kPOffset) * 0.69314718f : -INFINITY;
  }
}
#endif

template <int kD, int kBN_, int kWGs_, bool kFp8 = false>
__global__ void __launch_bounds__(PrefillConfig<kD, kBN_, kWGs_, kFp8>::kThreads, 1)
    prefill_attention_sm90(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                           const __grid_constant__ CUtensorMap map_v, const PrefillParams p) {
#if TW_SM90_ENABLED
  using namespace tw::sm90;
  using C = PrefillConfig<kD, kBN_, kWGs_, kFp8>;
  using Smem = PrefillSmem<C>;

  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const Smem sm(smem, reinterpret_cast<uint64_t*>(smem + Smem::kDataBytes));
  PrefillItem* s_item = reinterpret_cast<PrefillItem*>(sm.v_empty + C::kStages);  // the item whose Q is in sq
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) sm.init();
  if constexpr (kFp8) {
    // V^T's rows of ones (e4m3 1.0 = 0x38) in every chunk of every slot; any swizzle of bytes that
    // are all equal is the same. wgmma reads them through the async proxy: fence the writes.
    constexpr int kOnes = 8 * 64 / 4, kWords = C::kStages * C::kVChunks * kOnes;
    for (int i = threadIdx.x; i < kWords; i += blockDim.x) {
      const int chunk = i / kOnes;
      *reinterpret_cast<uint32_t*>(sm.sv + chunk * C::kVChunkBytes + kD * 64 + 4 * (i % kOnes)) = 0x38383838u;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  __syncthreads();

  // Persistent: the producer of each block takes the next work item from a global counter (items of
  // unequal length under the causal mask balance themselves) and hands it to its consumers with
  // the item's Q (q_full; an item whose rows see no key, and the end, with a plain arrive). Item w
  // is query tile w % num_tiles of head w / num_tiles, the plan's longest tiles first within a
  // head, so the blocks running side by side share a head's K/V in L2. The producer runs ahead into
  // the next item (its Q and first K/V tiles) while the consumers finish the current one.
  if (wg == 0) {
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x != 0) return;
    // Q is read by one block alone; K/V by every query tile of the head (evict_last keeps them
    // for the blocks of the same head that run beside this one).
    const uint64_t pol_q = l2_evict_first(), pol_kv = l2_evict_last();
    uint32_t k_it = 0, v_it = 0, q_count = 0;  // K/V tiles loaded, items handed over
    for (;;) {
      const int w = atomicAdd(p.work_counter, 1);
      // Every block fetches until it gets past the end: the launch fetches num_work + gridDim.x
      // times, and the last fetch resets the counter for the next launch on the stream.
      if (w == p.num_work + int(gridDim.x) - 1) *p.work_counter = 0;
      // A draw is a whole item, or a unit of the tail: its pieces one after another.
      const bool unit = w < p.num_work && w >= p.num_whole && p.unit_offsets != nullptr;
      const int first = unit ? p.unit_offsets[w - p.num_whole] : 0;
      const int pieces = w >= p.num_work ? 1 : unit ? p.unit_offsets[w - p.num_whole + 1] - first : 1;
      for (int k = 0; k < pieces; ++k) {
        PrefillItem it{};
        it.head = -1;  // the end
        if (w < p.num_work) it = unit ? prefill_piece<kFp8>(p, first + k) : prefill_item<kFp8>(p, w);
        if (q_count > 0) mbar_wait(sm.q_empty, (q_count + 1) & 1, "q_empty");
        ++q_count;
        *s_item = it;
        if (it.head < 0 || it.n_kv == 0) {
          mbar_arrive(sm.q_full);
          continue;
        }
        prefill_load_item<C>(sm, p, it, map_q, map_k, map_v, k_it, v_it, pol_q, pol_kv);
      }
      if (w >= p.num_work) break;
    }
    return;
  }

  setmaxnreg_inc<C::kConsumerRegs>();
  const int cw = wg - 1;  // this warpgroup's 64 rows of the tile
  // The consumer warpgroups take turns issuing their GEMMs (kTurns), round robin (named barrier 1 + c is
  // warpgroup c's turn: it waits on its own, then arrives on the next one's), so the tensor cores
  // run one warpgroup's GEMMs while the others compute their softmax (worth only ~1% with two at
  // d = 128 on the H200, A/B 2026-11-24; at d = 64 three warpgroups, each softmax under two
  // others' GEMMs, ran 1.18x two). The last warpgroup lets warpgroup 0 go first; all take
  // n_kv + 1 turns per item, and warpgroup 0 takes one more wait at the very end to match the
  // opening arrive (no arrival left pending when the block ends).
  const uint32_t my_turn = 1 + cw, other_turn = 1 + (cw + 1) % C::kWGs;
  if (C::kTurns && cw == C::kWGs - 1) named_bar_arrive(1, 256);
  uint32_t k_it = 0, v_it = 0, q_count = 0;
  for (;;) {
    mbar_wait(sm.q_full, q_count & 1, "q_full");
    ++q_count;
    // A copy: the producer writes the next item here once every consumer thread has read Q.
    const PrefillItem it = *s_item;
    if (it.head < 0) break;
    prefill_attend_item<C>(sm, p, it, cw, my_turn, other_turn, k_it, v_it);
  }
  if (C::kTurns && cw == 0) named_bar_sync(my_turn, 256);
#else
  __trap();  // dispatched only on sm_90a (ops/prefill_attention.cu checks the device)
#endif
}

}  // namespace tw::kernels
