// The decode step's executor kernel: one persistent CTA per SM takes tickets in schedule order and
// runs each ticket's tile by its op kind (decode_step_sm90.hpp: embedding, QKV, attention, o_proj /
// down with the residual, gate/up, LM head, sampling). Private to src/ops; instantiated per head dim
// in decode_step_d64.cu / decode_step_d128.cu.
//
// Roles, as in the fused FFN (ffn_sm90.cu): warp 0 is the executor and the only copy engine user. It
// takes tickets, pushes each tile to an 8-deep queue for the two consumer warpgroups, and streams the
// tile's operands through one shared-memory ring of stages: packed weights (and, for o_proj and down,
// their act-layout activations) for weight tiles, cached K/V rows for attention tiles. The norm
// consumers (qkv, gate/up, LM head) write their stages' activations themselves, from the fp32
// residual stream (consume_weight_tile). What depends on nothing goes out before the tile waits on
// its producers' counters: a weight tile's first stage, an attention tile's K/V (the QKV tiles leave
// q|k|v as sums in qkv_acc, which the attention's consumers finish: finish_qkv). The ring runs on
// across tiles and across op kinds, so the next tile's operands stream while the consumers finish
// this one.
//
// Dependencies. The producer warp polls the tile's counters (acquire), fences the async proxy and
// only then issues the copies of produced data. Consumers that read produced data with ordinary
// loads (the residual stream, tokens, the maxima) first wait on the queue entry's `ready`
// barrier, which the producer arrives on after its acquire: other CTA's release -> producer's acquire
// -> producer's arrive (release, CTA) -> consumer's wait (acquire, CTA), so they see those writes.
// Such data is read with ld.global.cg (L1 is not coherent with other SMs).
//
// Timelines (opt.trace): besides the executor's words, a gate/up or LM head tile stamps kTraceMark1
// when its split arrives and kTraceMark2 once it has the split's sums; an attention tile's
// kTraceComputed is the end of its stages (before the pair counts and merges), and where its warps
// share the stages, kTraceMark1 is q finished at its first stage (finish_qkv) and kTraceMark2 the units
// of its last segment done (before that segment's combine).
//
// No deadlock: inside a CTA the producer issues every stage of a tile before it touches the next
// tile, and arrives on `ready` as soon as it has acquired the tile's producers (before the stages that
// wait for ring slots), so a tile the consumers have popped never waits on the producer for
// anything that waits on them; the producer's own waits
// (queue slot, ring slot, counters, a held tile's publication) are released by the consumers
// finishing earlier tiles or by other CTAs. Across CTAs the executor's argument holds (runtime/executor.cuh): one CTA per SM, all
// resident, tickets in topological order, the next ticket drawn only after the current tile is issued.
#pragma once

#include <cuda_bf16.h>

#include <cuda/atomic>

#include <string>

#include "decode_step_sm90.hpp"
#include "decode_step_stage_trace.cuh"
#include "tileweave/util/cuda_check.hpp"
#include "tileweave/kernels/activation.cuh"
#include "tileweave/kernels/attention/decode.cuh"
#include "tileweave/kernels/sm90/mainloop.cuh"
#include "tileweave/runtime/executor.cuh"

namespace tw::step {

using bf16 = __nv_bfloat16;

constexpr int kQueue = 8;          // tiles the producer may run ahead of the consumers
constexpr int kConsumers = 256;    // consumer threads
// Consumer scratch: the attention combine's (max, sum) per warp and row, the merge's per-group sums
// ([groups][G D / 4] float4 and float2, groups x G D / 4 <= kConsumers).
constexpr int kScratchBytes = kConsumers * (16 + 8);
// Shared memory for the ring: the opt-in limit less the scratch and the static shared memory
// (queue, descriptors, per-row tables; checked at run time by prepare_kernel).
constexpr int kStaticReserve = 10240;
constexpr int kMaxStages = 8;
// A consumer warp's mail (StepShared::mail): entries posted and not yet taken are at most the ring's
// stages (a stage is posted once armed, taken before its release) and one end per tile the producer
// is ahead of the warp (the queue), so the producer never waits for room.
constexpr int kMail = kMaxStages + kQueue;
constexpr uint32_t kMailEnd = ~0u;

template <int R>
struct StepConfig {
  static constexpr int kKAtoms = sm90::step_stage_cols(R) / 64;
  static constexpr int kStageBytes = kKAtoms * (sm90::kTileRows + R) * 128;
  static constexpr int kFit = (sm90::kMaxDynSmem - 1024 - 512 - kScratchBytes - kStaticReserve) / kStageBytes;
  using Cfg = sm90::MainloopConfig<R, kKAtoms, 1, (kFit < kMaxStages ? kFit : kMaxStages)>;
  static_assert(Cfg::kStageBytes == kStageBytes, "stage layout");
  static constexpr int kSmemBytes = Cfg::kSmemBytes + kScratchBytes + 128;
};

// Tokens of K and V per attention stage: the stage holds K[T][D], V[T][D] and the q of a pair's
// group (at most 8 x 128 bf16 = 2 KiB), T a multiple of 16 up to 128.
__host__ __device__ constexpr int attention_tokens(int stage_bytes, int d) {
  const int t = (stage_bytes - 2048) / (4 * d) / 16 * 16;
  return t < 128 ? t : 128;
}

// One attention stage, written by the producer before it arms the stage (the arrive releases it).
struct AttnChunk {
  int32_t pair, tok0, ntok, len;  // K/V rows [tok0, tok0 + ntok) of pair (b * Hkv + h), length len
  int32_t flags;                  // kSegFirst | kSegLast | kWhole | kWhich
  int32_t pu0, pu1;               // the pair's units
  int32_t unit0;                  // units of this segment before this stage (round-robin over the warps)
  // The tiles holding part of the pair (first, count), for its merge, and whether the first of them
  // holds the pair's first part as its second partial (kShift). Worked out by the producer, so that
  // the consumers divide by nothing: a 64-bit division or a float division's slow path is a call,
  // and a call holds the consumers' registers to the kernel's entry budget (168).
  int32_t first_tile, tiles;
};
constexpr int32_t kSegFirst = 1, kSegLast = 2, kWhole = 4, kWhich = 8, kShift = 16;
// A stage of a tile run a segment per warp (StepParams::attn_warp_segments): the owning consumer warp
// in bits 8-10 (warp_of), for the producer's post_mail.
__host__ __device__ constexpr int warp_of(int32_t flags) { return (flags >> 8) & 7; }
// Compiled only at 128 rows (B > 64): the path's registers spill into the attention code of the tile
// heights it is compiled for, and at 64 rows that cost more than it saved (Llama-3-8B B = 64 8236 ->
// 9206-9457 us, Llama-3.2-1B 2079 -> 2429-2450; H200, session 25); at 128 rows the kernel spills as
// much without it.
template <class Cfg>
constexpr bool kWarpSegments = Cfg::kMPad >= 128;

// Walks one attention tile's stages (one thread): segment by segment (a segment is the tile's part
// of one pair), each in stages of up to `stage_tokens` tokens.
struct ChunkWalk {
  int tile_u0, u_hi, total;  // the tile's units, all units
  int tiles;                 // tiles that take units (StepShared::attn_tiles); the rest stay empty
  int b, h;                  // the current pair
  int pu0, pu1;              // its units
  int seg_u0, seg_u1;        // the segment's units
  int tok, tok_end;          // next token of the segment, its end
  int seg_units;             // units of the segment already walked
  int first_tile, ntiles;    // the tiles holding the pair's units (set at the segment's first stage)
  bool shift;
  bool per_pair;             // the tiles are cut pair by pair (seq_tiles): first_tile / ntiles set by walk_begin
};

// A consumer warp's segment in a tile run a segment per warp (SegmentRoundRobin): its stages' common
// fields and its next token, in shared memory (8 walks would not fit the producer's registers). A
// stage is then a copy and three fields; walking the segment in shared memory had taken ~0.5 us of the
// producer's one thread a stage, its pace at B = 128 (per-stage timestamps, H200, session 27).
struct WarpSegment {
  AttnChunk chunk;     // the fields common to the segment's stages (flags: kWhole, kWhich, kShift, the warp)
  int tok, tok_end;    // its next token, its end
  int units;           // units of it already out
};

struct StepShared {
  runtime::BlockSlots slots;
  DeviceTile tile[kQueue];
  int32_t id[kQueue], count[kQueue];
  bool by_warp[kQueue];  // an attention tile run a segment per warp (its stages reach their warps by mail)
  uint64_t full[kQueue], empty[kQueue], ready[kQueue];
  uint64_t released;  // a tile of a held kind has published (one phase per such tile: run_producer)
  AttnChunk chunk[kMaxStages];
  // The cache lengths of the launch (constant while it runs) and the units before each sequence,
  // filled by the producer at its first attention tile.
  int32_t seq_len[kMaxRows];
  int32_t seq_units[kMaxRows + 1];
  // The attention tiles that take units this launch (load_lengths). Unequal sequences with no more
  // pairs than tiles: sequence b's pairs get seq_tiles[b + 1] - seq_tiles[b] of them, split evenly
  // among its KV heads; else seq_tiles[0] < 0 and the units are cut evenly over attn_tiles.
  int32_t attn_tiles;
  int32_t seq_tiles[kMaxRows + 1];
  // Per activation row, for the consumers' epilogues: the norm's scale (or a slice's sums of squares).
  float rstd[kMaxRows];
  uint32_t flag, last[2];
  AttnChunk part[2];  // an attention tile's partial segments: its first and its last,
  uint64_t part_tag[2];  // each valid for the tile whose tag (attention_tag) it holds
  WarpSegment lanes[8];  // each consumer warp's segment, where the tile runs a segment per warp
  ChunkWalk next_segment;  // the tile's next segment no warp has had (SegmentRoundRobin)
  // Per consumer warp, the stages of such a tile that are its own, by index in the tile (kMailEnd ends
  // the tile): a ring of kMail entries (post_mail), `posted` counted by the producer, `taken` by the warp.
  uint32_t mail[8][kMail];
  uint32_t posted[8], taken[8];
};

#if TW_SM90_ENABLED
using namespace sm90;

__device__ __forceinline__ void consumer_sync() { named_bar_sync(1, kConsumers); }

// The K slices a ticket covers: all of its tile's where it runs them as one (run_slices_whole: a
// split op's tile with no arrival counter, the whole waves of gate/up), else its own one.
__device__ __forceinline__ int slices_of(const StepOpArgs& o, const DeviceTile& t) {
  return o.split > 1 && t.arrive < 0 ? o.split : 1;
}
// A slice whose partial sums meet the others' in L2 (split-K, not run whole).
__device__ __forceinline__ bool split_slice(const StepOpArgs& o, const DeviceTile& t) { return o.split > 1 && t.arrive >= 0; }
__device__ __forceinline__ int stages_of(const StepOpArgs& o, const DeviceTile& t) {
  return o.slice_start[t.ks + slices_of(o, t)] - o.slice_start[t.ks];
}
// Norm consumers stage their activations themselves, from the fp32 residual stream (up to 32 rows:
// step_bf16_stream).
__device__ __forceinline__ bool stages_residual(int kind) { return kind == kQkv || kind == kGateUp || kind == kLmHead; }
// The residual-stream buffer of writer w (decode_step_sm90.hpp); w may run past this launch's writers.
__device__ __forceinline__ uint32_t stream_slot(const StepParams& p, uint32_t epoch, int w) {
  return (epoch * uint32_t(p.writers) + uint32_t(w)) % kResidualBuffers;  // mod 2^32, a multiple of 4
}
__device__ __forceinline__ float* residual_buffer(const StepParams& p, uint32_t epoch, int w) {
  return p.xres + int64_t(stream_slot(p, epoch, w)) * p.x_blocks * p.batch * p.x_cols;
}
// Batches above 32 (step_bf16_stream: R >= 64, so smaller tiles compile without it).
template <class Cfg>
__device__ __forceinline__ bool bf16_stream(const StepParams& p) {
  if constexpr (Cfg::kMPad >= 64) return p.bf16_stream != 0;
  else return false;
}
// Batches above 32: writer w's bf16 copy (act layout) and its rows' sums of squares per atom.
__device__ __forceinline__ bf16* stream_bf16(const StepParams& p, uint32_t epoch, int w) {
  return p.xa + int64_t(stream_slot(p, epoch, w)) * p.xa_stride;
}
__device__ __forceinline__ float* stream_sums(const StepParams& p, uint32_t epoch, int w) {
  return p.xss + int64_t(stream_slot(p, epoch, w)) * p.x_atoms * p.batch;
}
// Rank q's copy of `local`, an address in this rank's exchange region (collectives in the launch).
template <class T>
__device__ __forceinline__ T* on_rank(const StepParams& p, int q, T* local) {
  return reinterpret_cast<T*>(p.region[q] + (reinterpret_cast<const char*>(local) - reinterpret_cast<const char*>(p.xres)));
}
// Element (m, col) of a residual-stream buffer (< 2^31: DecodeStep refuses a batch x padded hidden over it).
__device__ __forceinline__ int residual_at(const StepParams& p, int m, int col) {
  const int blk = col / p.x_cols;
  return (blk * p.batch + m) * p.x_cols + (col - blk * p.x_cols);
}

// Offset of KV head 0's row `tok` of sequence b in a layer's cache; heads are `kv_head_stride` apart.
__device__ __forceinline__ int64_t kv_row(const StepParams& p, int b, int tok) {
  if (p.page_table == nullptr) return (int64_t(b) * p.num_kv_heads * p.max_seq_len + tok);
  const int page = __ldg(&p.page_table[int64_t(b) * p.pages_per_seq + tok / p.page_size]);
  return int64_t(page) * p.num_kv_heads * p.page_size + tok % p.page_size;
}
__device__ __forceinline__ int64_t kv_head_stride(const StepParams& p) {
  return p.page_table == nullptr ? p.max_seq_len : p.page_size;
}


// floor(x / d) for 0 <= x < 2^44 and 0 < d < 2^31 without a 64-bit division, which compiles to a call,
// and any call in the kernel holds every role to the kernel's entry register budget (168; the
// consumers need more). Two float estimates, each shrinking the error by ~2^-21 (so it is at most 2
// after them), then exact fix-ups (written out: a loop would be turned back into a division).
__device__ __forceinline__ int64_t div_floor(int64_t x, int64_t d) {
  const float r = __fdividef(1.f, float(d));
  int64_t q = int64_t(float(x) * r);
  q += int64_t(float(x - q * d) * r);
  int64_t rem = x - q * d;
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const int64_t down = rem < 0 ? 1 : 0, up = rem >= d ? 1 : 0;
    q += up - down;
    rem += (down - up) * d;
  }
  return q;
}
// kernels/attention/decode_units.hpp's tile arithmetic, with div_floor.
__device__ __forceinline__ int tile_start(int c, int tiles, int total) { return int(div_floor(int64_t(c) * total, tiles)); }
__device__ __forceinline__ int tile_of(int u, int tiles, int total) {
  return int(div_floor(int64_t(u + 1) * tiles - 1, total));
}

// ---- the attention plan of the launch ----
// Pair i = b * Hkv + h holds units(len_b + 1) 16-token units; tile c of P takes units [c U / P,
// (c + 1) U / P) of all pairs' units in a row (kernels/attention/decode_units.hpp), every tile the
// same bytes whatever the lengths. The lengths are the launch's: read once per CTA (the sample tile
// advances them after every reader).
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int u = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += u;
  }
  return v;
}
__device__ __forceinline__ void load_lengths(const StepParams& p, StepShared& sh) {
  const int lane = threadIdx.x % 32;
  int carry = 0, first = -1;
  bool equal = true;
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    const int len = b < p.batch ? __ldcg(&p.seq_lens[b]) : 0;
    int units = b < p.batch ? kernels::decode_units(len + 1) * p.num_kv_heads : 0;
    if (first < 0) first = __shfl_sync(0xffffffffu, units, 0);
    equal = __all_sync(0xffffffffu, equal && (b >= p.batch || units == first));
    units = warp_inclusive_sum(units, lane);
    if (b < p.batch) {
      sh.seq_len[b] = len;
      sh.seq_units[b + 1] = carry + units;
    }
    carry += __shfl_sync(0xffffffffu, units, 31);
  }
  if (lane == 0) sh.seq_units[0] = 0;
  __syncwarp();
  // Unequal lengths, no more pairs than tiles: each pair 1 tile plus its share of the tiles left, in
  // proportion to its units (at most one per attn_min_units units), so that every tile holds part of
  // one pair; the even cut would put parts of two pairs in most tiles.
  const int total = sh.seq_units[p.batch], pairs = p.batch * p.num_kv_heads;
  const bool ragged = !equal && pairs <= p.attn_tiles;
  carry = 0;
  for (int b0 = 0; ragged && b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    int tiles = 0;
    if (b < p.batch) {
      const int u = kernels::decode_units(sh.seq_len[b] + 1);
      const int share = 1 + int(int64_t(p.attn_tiles - pairs) * u / total);
      tiles = min(share, max(1, u / p.attn_min_units)) * p.num_kv_heads;
    }
    tiles = warp_inclusive_sum(tiles, lane);
    if (b < p.batch) sh.seq_tiles[b + 1] = carry + tiles;
    carry += __shfl_sync(0xffffffffu, tiles, 31);
  }
  __syncwarp();
  // At most P tiles (the plan's), no fewer than attn_min_units units each (kMinAttentionUnits); tiles
  // hold units in a row with no empty tile in between (a pair's merge counts the tiles holding its
  // parts). Equal sequences: the count aligned to the pairs as DecodeAttention's planner aligns it
  // (decode_aligned_tiles), so that no tile holds parts of two pairs (one q, one combine, one partial
  // each) and with a pair per tile there is nothing to merge.
  if (lane == 0) {
    sh.seq_tiles[0] = ragged ? 0 : -1;
    const int most = max(1, min(p.attn_tiles, (total + p.attn_min_units - 1) / p.attn_min_units));
    sh.attn_tiles = ragged ? sh.seq_tiles[p.batch] : equal ? kernels::decode_aligned_tiles(pairs, most) : most;
  }
  __syncwarp();
}

__device__ __forceinline__ void walk_segment(const StepShared& sh, ChunkWalk& w, int num_kv_heads) {
  const int units = kernels::decode_units(sh.seq_len[w.b] + 1);
  w.pu0 = sh.seq_units[w.b] + w.h * units;
  w.pu1 = w.pu0 + units;
  w.seg_u0 = max(w.tile_u0, w.pu0);
  w.seg_u1 = min(w.u_hi, w.pu1);
  w.tok = (w.seg_u0 - w.pu0) * kernels::kDecodeStageTokens;
  w.tok_end = min((w.seg_u1 - w.pu0) * kernels::kDecodeStageTokens, sh.seq_len[w.b] + 1);
  w.seg_units = 0;
}
__device__ __forceinline__ ChunkWalk walk_begin(const StepParams& p, const StepShared& sh, int tile) {
  ChunkWalk w;
  w.total = sh.seq_units[p.batch];
  w.tiles = sh.attn_tiles;
  w.tok = w.tok_end = 0;
  w.tile_u0 = w.u_hi = w.seg_u1 = 0;
  w.per_pair = sh.seq_tiles[0] == 0;
  if (tile >= w.tiles) return w;  // no units for this tile (fewer units than tiles)
  if (w.per_pair) {
    // Sequence b's tiles [seq_tiles[b], seq_tiles[b + 1]): n per KV head, each an even part of one pair.
    int lo = 0, hi = p.batch - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (sh.seq_tiles[mid] <= tile) lo = mid; else hi = mid - 1;
    }
    const int n = (sh.seq_tiles[lo + 1] - sh.seq_tiles[lo]) / p.num_kv_heads, r = tile - sh.seq_tiles[lo];
    const int h = r / n, j = r - h * n, u = kernels::decode_units(sh.seq_len[lo] + 1);
    const int pu0 = sh.seq_units[lo] + h * u;
    w.tile_u0 = pu0 + int(int64_t(u) * j / n);
    w.u_hi = pu0 + int(int64_t(u) * (j + 1) / n);
    w.first_tile = sh.seq_tiles[lo] + h * n;
    w.ntiles = n;
  } else {
    w.tile_u0 = tile_start(tile, w.tiles, w.total);
    w.u_hi = tile_start(tile + 1, w.tiles, w.total);
  }
  w.seg_u1 = w.u_hi;
  int lo = 0, hi = p.batch - 1;       // the last sequence whose units start at or before the tile's
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (sh.seq_units[mid] <= w.tile_u0) lo = mid; else hi = mid - 1;
  }
  w.b = lo;
  w.h = (w.tile_u0 - sh.seq_units[lo]) / kernels::decode_units(sh.seq_len[lo] + 1);
  walk_segment(sh, w, p.num_kv_heads);
  return w;
}
// To the tile's next segment; false when w's was its last.
__device__ __forceinline__ bool walk_next_segment(const StepParams& p, const StepShared& sh, ChunkWalk& w) {
  if (w.seg_u1 >= w.u_hi) return false;
  if (++w.h == p.num_kv_heads) w.h = 0, ++w.b;
  walk_segment(sh, w, p.num_kv_heads);
  return true;
}
// The even cut's tiles holding units [pu0, pu1) of a pair: the first, their count, and whether the
// first holds the pair's first part as its second partial (kShift).
__device__ __forceinline__ void even_cut_parts(int pu0, int pu1, int tiles, int total, int& first, int& n, bool& shift) {
  first = tile_of(pu0, tiles, total);
  n = tile_of(pu1 - 1, tiles, total) - first + 1;
  shift = tile_start(first, tiles, total) < pu0;
}
// At a segment's first stage: the tiles holding its pair, for the merge. Once per segment: the
// producer is one thread, and these 64-bit divisions per stage (with a second walk of every stage to
// count them) held it to one attention stage per 1.3 us at B = 16 (timestamps per stage, H200),
// slower than the consumers and the memory.
__device__ __forceinline__ void walk_pair_tiles(ChunkWalk& w) {
  if (w.per_pair) w.shift = false;  // walk_begin set the pair's tiles: each holds part of this pair only
  else even_cut_parts(w.pu0, w.pu1, w.tiles, w.total, w.first_tile, w.ntiles, w.shift);
}
// The tiles holding pair (b, h), from the launch's cut (load_lengths), as the attention tiles walk it:
// for o_proj's merge (merge_slice).
__device__ __forceinline__ void pair_parts(const StepParams& p, const StepShared& sh, int b, int h, int& first, int& n,
                                           bool& shift) {
  if (sh.seq_tiles[0] == 0) {  // walk_begin's per-pair cut: n tiles per KV head of sequence b
    n = (sh.seq_tiles[b + 1] - sh.seq_tiles[b]) / p.num_kv_heads;
    first = sh.seq_tiles[b] + h * n;
    shift = false;
  } else {
    const int u = kernels::decode_units(sh.seq_len[b] + 1), pu0 = sh.seq_units[b] + h * u;
    even_cut_parts(pu0, pu0 + u, sh.attn_tiles, sh.seq_units[p.batch], first, n, shift);
  }
}
// The fields of c that are the same at every stage of w's segment (walk_pair_tiles done).
__device__ __forceinline__ void segment_fields(const StepParams& p, const StepShared& sh, const ChunkWalk& w, AttnChunk& c) {
  c.pair = w.b * p.num_kv_heads + w.h;
  c.len = sh.seq_len[w.b] + 1;
  c.pu0 = w.pu0;
  c.pu1 = w.pu1;
  c.first_tile = w.first_tile;
  c.tiles = w.ntiles;
  c.flags = (w.seg_u0 == w.pu0 && w.seg_u1 == w.pu1 ? kWhole : 0) | (w.seg_u0 > w.tile_u0 ? kWhich : 0) |
            (w.shift ? kShift : 0);
}
// The tile's next stage into c; false when the tile is done.
__device__ __forceinline__ bool walk_next(const StepParams& p, const StepShared& sh, ChunkWalk& w, int stage_tokens, AttnChunk& c) {
  if (w.tok >= w.tok_end && !walk_next_segment(p, sh, w)) return false;
  if (w.seg_units == 0) walk_pair_tiles(w);
  const int n = min(stage_tokens, w.tok_end - w.tok);
  segment_fields(p, sh, w, c);
  c.tok0 = w.tok;
  c.ntok = n;
  c.unit0 = w.seg_units;
  c.flags |= (w.seg_units == 0 ? kSegFirst : 0) | (w.tok + n >= w.tok_end ? kSegLast : 0);
  w.tok += n;
  w.seg_units += kernels::decode_units(n);
  return true;
}

// The tile's stages, counted segment by segment (walk_next's cut without building the chunks).
__device__ __forceinline__ int walk_count(const StepParams& p, const StepShared& sh, ChunkWalk w, int stage_tokens) {
  for (int n = 0;;) {
    if (w.tok_end > w.tok) n += (w.tok_end - w.tok + stage_tokens - 1) / stage_tokens;
    if (!walk_next_segment(p, sh, w)) return n;
  }
}
// The tile's segments (0: no units).
__device__ __forceinline__ int walk_segments(const StepParams& p, const StepShared& sh, ChunkWalk w) {
  if (w.tok >= w.tok_end) return 0;
  int n = 1;
  while (walk_next_segment(p, sh, w)) ++n;
  return n;
}

// A tile of at least attn_warp_segments segments runs a segment per consumer warp: its stages go out
// round-robin over up to 8 of its segments at a time, each with its warp in the flags, and a warp's
// next segment starts once its last stage is out (the ring is in order: the warp finishes one before
// it starts the next). Each warp then works alone -- its q, all units of its stages, its output or
// partial -- so a pair costs no consumer barrier and no combine across warps, and the ring's stages
// feed as many warps as it holds. A warp's segment lives in shared memory as a WarpSegment.
struct SegmentRoundRobin {
  ChunkWalk& next;  // the tile's next segment no warp has had (StepShared::next_segment)
  bool more;       // next is one
  uint32_t live;   // warps with a segment
  int w;           // the next warp to serve
};
// Warp k's next segment: the one r.next is at (a segment has units: walk_segment).
__device__ __forceinline__ void round_robin_assign(const StepParams& p, StepShared& sh, SegmentRoundRobin& r, int k) {
  WarpSegment& s = sh.lanes[k];
  walk_pair_tiles(r.next);
  segment_fields(p, sh, r.next, s.chunk);
  s.chunk.flags |= k << 8;
  s.tok = r.next.tok, s.tok_end = r.next.tok_end, s.units = 0;
  r.live |= 1u << k;
  r.more = walk_next_segment(p, sh, r.next);
}
__device__ __forceinline__ void round_robin_begin(const StepParams& p, StepShared& sh, SegmentRoundRobin& r,
                                                  const ChunkWalk& first) {
  r.next = first, r.more = true, r.live = 0, r.w = 0;
  for (int k = 0; k < 8 && r.more; ++k) round_robin_assign(p, sh, r, k);
}
__device__ __forceinline__ bool round_robin_next(const StepParams& p, StepShared& sh, SegmentRoundRobin& r,
                                                 int stage_tokens, AttnChunk& c) {
  if (!r.live) return false;
  while (!((r.live >> r.w) & 1u)) r.w = (r.w + 1) & 7;
  const int w = r.w;
  WarpSegment& s = sh.lanes[w];
  const int tok = s.tok, units = s.units, n = min(stage_tokens, s.tok_end - tok);
  const bool last = tok + n >= s.tok_end;
  c = s.chunk;
  c.tok0 = tok;
  c.ntok = n;
  c.unit0 = units;
  c.flags |= (units == 0 ? kSegFirst : 0) | (last ? kSegLast : 0);
  s.tok = tok + n, s.units = units + kernels::decode_units(n);
  if (last) {
    if (r.more) round_robin_assign(p, sh, r, w);
    else r.live &= ~(1u << w);
  }
  r.w = (w + 1) & 7;
  return true;
}

// A tile run a segment per warp reaches each warp through its mail, not through every stage: a warp
// that had to wait for and pass each of the other seven warps' stages in ring order spent ~1 us a
// stage doing so (per-stage timestamps, Llama-3-8B B = 128, H200): a stage was released only when the
// slowest warp had passed it, and at B = 128 the attention took 1.3-1.5 us a stage, its units 0.9 us a
// warp. Now only the owner waits for its stage's data and releases the slot (one arrive counting for
// all consumer warps), and each warp moves its ring position past the tile's stages at the end.
//
// No deadlock, no stale entry: the producer posts a stage after arming it, so the warp's wait is for
// a phase in progress (its slot's previous use completed before the producer acquired it); a warp
// reads its entries waiting for nothing but the producer's posts, and the mail never fills (kMail).
//
// An entry is its post's number (low 16 bits) over its value (a stage index, or kMailEnd's low half),
// one 32-bit word: the warp polls the entry itself, so nothing orders two locations and the post needs
// no release fence (a `posted` counter stored with release compiled to a MEMBAR.ALL.CTA per stage).
// What the stage holds reaches the warp through its full barrier. A tile's stage indices must stay
// below 0xffff (kMailEnd's half): a tile of more stages (over a million tokens) runs in ring order.
__device__ __forceinline__ void post_mail(StepShared& sh, int w, uint32_t v) {
  const uint32_t n = sh.posted[w]++;
  cuda::atomic_ref<uint32_t, cuda::thread_scope_block>(sh.mail[w][n % kMail])
      .store((n << 16) | (v & 0xffffu), cuda::memory_order_relaxed);
}
// Warp w's next entry (lane 0 reads, the warp gets it).
__device__ __forceinline__ uint32_t take_mail(StepShared& sh, int w, int lane) {
  uint32_t v = 0;
  if (lane == 0) {
    const uint32_t n = sh.taken[w]++;
    cuda::atomic_ref<uint32_t, cuda::thread_scope_block> entry(sh.mail[w][n % kMail]);
    v = entry.load(cuda::memory_order_relaxed);
    if ((v >> 16) != (n & 0xffffu)) {
      const long long t0 = clock64();
      while (((v = entry.load(cuda::memory_order_relaxed)) >> 16) != (n & 0xffffu))
        if (clock64() - t0 > TW_SM90_SPIN_LIMIT_CYCLES) fail_wait();
    }
    v &= 0xffffu;
  }
  v = __shfl_sync(0xffffffffu, v, 0);
  return v == 0xffffu ? kMailEnd : v;
}

// ---- producer (warp 0) ----

template <class Cfg>
__device__ __forceinline__ int acquire_stage(const Ring<Cfg>& ring, PipeState<Cfg>& ps) {
  const int s = ps.stage;
  mbar_wait(&ring.empty[s], ps.phase ^ 1, "empty");  // a fresh barrier: the first pass is free
  ps.advance();
  return s;
}
template <class Cfg>
__device__ __forceinline__ void arm_stage(const Ring<Cfg>& ring, int s, uint32_t bytes) {
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &ring.full[s], bytes);
}
// A stage's weights. A tile's packed atoms are rounded up to 2, so where a stage holds 3 or 4 (8-32
// rows: sm90::step_stage_cols) the tile's last one may hold fewer: the rest come from zero_atoms (L2), so
// that the stage's bytes, and its wgmmas, are the same as a whole one's (a wgmma skipped on a runtime
// count had ptxas serialise them all, C7520), and its activations there are zeros (act_elems).
template <class Cfg>
__device__ __forceinline__ void issue_weights(const StepParams& p, const Ring<Cfg>& ring, int s, const StepOpArgs& o,
                                              int tn, int kst, uint64_t policy) {
  const bf16* src = o.w + (int64_t(tn) * o.packed_atoms + kst * Cfg::kKAtoms) * (kTileRows * 64);
  int atoms = Cfg::kKAtoms;  // up to 2 atoms a stage, every stage is whole
  if constexpr (Cfg::kKAtoms > 2) atoms = min(atoms, o.packed_atoms - kst * Cfg::kKAtoms);
  bulk_load(ring.w_atom(s, 0), src, atoms * Cfg::kWAtomBytes, &ring.full[s], policy);
  if (atoms < Cfg::kKAtoms)
    bulk_load(ring.w_atom(s, atoms), p.zero_atoms, (Cfg::kKAtoms - atoms) * Cfg::kWAtomBytes, &ring.full[s],
              l2_evict_last());
}
// The activations of stage kst: o.act, or for a norm consumer above 32 rows its input's bf16 copy.
template <class Cfg>
__device__ __forceinline__ void issue_acts(const StepParams& p, const Ring<Cfg>& ring, int s, const StepOpArgs& o,
                                           uint32_t epoch, int kst, uint64_t policy) {
  const bf16* act = bf16_stream<Cfg>(p) && stages_residual(o.kind) ? stream_bf16(p, epoch, o.x_in) : o.act;
  // One copy for the stage's atoms: they are contiguous in the act layout and in the slot, and the
  // buffers are padded to whole stages (act_elems). An SM's bulk copies finish at about a fixed rate
  // per copy (stream_patterns.json), so four 1 KiB copies beside a 64 KiB one at 8 rows cost more
  // than their bytes.
  bulk_load(ring.x_atom(s, 0), act + int64_t(kst) * Cfg::kKAtoms * Cfg::kMPad * 64, Cfg::kKAtoms * Cfg::kXAtomBytes,
            &ring.full[s], policy);
}
// An attention stage: K at the stage's start, V after `stage_tokens` rows of K, then the q rows of
// the pair's group (bf16, written by the consumers: finish_qkv). The copies bring the cached rows of
// earlier tokens; the stage's last row, when it is the new token's, is the consumers' to write.
__device__ __forceinline__ bool holds_new_row(const AttnChunk& c) { return c.tok0 + c.ntok == c.len; }
__device__ __forceinline__ int cached_rows(const AttnChunk& c) { return c.ntok - (holds_new_row(c) ? 1 : 0); }
template <int D>
__device__ __forceinline__ uint32_t attention_stage_bytes(const AttnChunk& c) {
  return uint32_t(4 * cached_rows(c) * D);
}
template <class Cfg, int D>
__device__ __forceinline__ void issue_kv(const StepParams& p, const Ring<Cfg>& ring, int s, const StepOpArgs& o,
                                         const AttnChunk& c, int stage_tokens, float inv_kv_heads) {
  // pair / Hkv through a float reciprocal, corrected to the exact quotient: the integer division's ~20
  // dependent instructions were a visible part of the cost per stage of the producer, whose one thread
  // sets the attention's pace (session 27).
  int b = int(float(c.pair) * inv_kv_heads);
  b += (b + 1) * p.num_kv_heads <= c.pair ? 1 : 0;
  b -= b * p.num_kv_heads > c.pair ? 1 : 0;
  const int h = c.pair - b * p.num_kv_heads;
  const bf16* k_cache = o.k_cache;  // both loads before the copies (each asm's memory clobber would
  const bf16* v_cache = o.v_cache;  // reload them one after another)
  uint8_t* k_dst = ring.w_atom(s, 0);
  uint8_t* v_dst = k_dst + stage_tokens * D * 2;
  const int64_t hs = int64_t(h) * kv_head_stride(p);
  const uint64_t policy = l2_evict_first();
  const int tok_end = c.tok0 + cached_rows(c);
  for (int tok = c.tok0; tok < tok_end;) {  // page by page (one piece when contiguous)
    const int end = p.page_table ? min(tok_end, (tok / p.page_size + 1) * p.page_size) : tok_end;
    const int64_t row = kv_row(p, b, tok) + hs;
    const uint32_t bytes = uint32_t(end - tok) * D * 2, at = uint32_t(tok - c.tok0) * D * 2;
    bulk_load(k_dst + at, k_cache + row * D, bytes, &ring.full[s], policy);
    bulk_load(v_dst + at, v_cache + row * D, bytes, &ring.full[s], policy);
    tok = end;
  }
}
// A norm consumer's stage holds, in its activation bytes, the stage's block of the residual stream:
// fp32 [B][stage columns], one bulk copy (columns >= K are zero: never written); the consumers
// convert it to the act layout in place (consume_weight_tile). One copy, not one per row: a copy
// per row (16 at B = 16) made the LM head's stages 30% slower on the H200.
template <class Cfg>
__device__ __forceinline__ uint32_t residual_stage_bytes(const StepParams& p) {
  return uint32_t(p.batch) * uint32_t(Cfg::kKAtoms * 64) * 4u;
}
template <class Cfg>
__device__ __forceinline__ void issue_residual_block(const StepParams& p, const Ring<Cfg>& ring, int s, const float* x,
                                                     int kst, uint64_t policy) {
  bulk_load(ring.x_atom(s, 0), x + int64_t(kst) * p.batch * p.x_cols, residual_stage_bytes<Cfg>(p), &ring.full[s], policy);
}

template <class Cfg, int D>
__device__ void run_producer(const Ring<Cfg>& ring, StepShared& sh, const StepParams& p) {
  const runtime::ExecParams& ep = p.ep;
  const int lane = threadIdx.x;
  const uint64_t w_policy = l2_evict_first(), x_policy = l2_evict_last();
  constexpr int kStageTokens = attention_tokens(Cfg::kStageBytes, D);
  PipeState<Cfg> ps;
  int qs = 0;
  uint32_t qphase = 0;
  bool lengths_loaded = false;
  int prev_kind = -1;
  uint32_t held = 0;  // tiles of the held kinds waited for (the phase of `released`)
  for (bool first = true;; first = false) {
    __syncwarp();  // lane 0's prefetch (slots.next*) is visible to the warp
    int32_t id = sh.slots.next_id;
    if (id >= 0 && !first && ep.spin_limit && *reinterpret_cast<volatile uint32_t*>(&ep.state->error)) id = -1;
    const DeviceTile t = sh.slots.next;
    const StepOpArgs& o = p.ops[id >= 0 ? t.op : 0];
    const int kind = id >= 0 ? o.kind : -1;
    const bool weights = kind == kQkv || kind == kResidual || kind == kGateUp || kind == kLmHead;
    const bool staged = stages_residual(kind) && !bf16_stream<Cfg>(p);  // activations: rows of the fp32 residual stream
    auto stage_bytes = [&](int kst) {
      return staged ? uint32_t(Cfg::kKAtoms * Cfg::kWAtomBytes) + residual_stage_bytes<Cfg>(p) : uint32_t(Cfg::kStageBytes);
    };
    const int kst0 = weights ? o.slice_start[t.ks] : 0, n = weights ? stages_of(o, t) : 0;
    // After a tile of a kind in `p.hold_kinds`, nothing of the next tile goes out before that tile has
    // published. A gpu-scope fence, and so every release, waits until every bulk copy its SM has in
    // flight has landed (sync_latency.json: 0.3-0.4 us alone, 2.6 behind one 64 KiB copy, 6.5 behind three;
    // on an SM with none in flight while the others stream, the same as alone), and loads wait about half as long:
    // with the next tile's weights issued ahead of them, a tile's reductions and release reached L2
    // late and its consumers saw it late (Llama-3.2-1B B = 1: gate/up's mean wait for its producers
    // 6.3 -> 1.5 us with o_proj and down held). The weights then start later. Measured (H200,
    // decode_step_hold_kinds_ab.json): after o_proj and down always; after every QKV, attention and
    // gate/up tile too at B <= 16 (hold_every_tile_max_batch), where the chain's hops are the time:
    // Qwen2-0.5B -4.3%, Llama-3.2-3B -2.0%, Llama-3-8B -1.3% (B = 4 -1.6%), Llama-3.2-1B -1.45%;
    // at B = 8 and 16 0.2-1.0% faster (decode_step_hold_b16_ab.json), and at B = 64, where the
    // ring's lead is the bandwidth, +2.4%.
    if (prev_kind >= 0 && ((p.hold_kinds >> prev_kind) & 1)) {
      if (lane == 0) mbar_wait(&sh.released, held & 1u, "released");
      ++held;
      __syncwarp();
    }
    prev_kind = kind;
    const int s0 = ps.stage;
    // Weights depend on nothing: a weight tile's first stage goes out before the tile is queued or
    // polls its producers (in an overlapped launch, before the wait for the previous kernel). A ring's
    // worth there instead measured slower everywhere (H200: 1B B = 1 931 -> 971 us, 8B 4203 -> 4232; a
    // TP-2 rank's 66 launches of the 8B shard 3885 -> 4062: decode_step_early_ring_ab.json): the SM's
    // copies in flight delay its later loads, the tile's activations among them.
    if (lane == 0 && n > 0) {
      const int s = acquire_stage(ring, ps);
      arm_stage(ring, s, stage_bytes(kst0));
      issue_weights(p, ring, s, o, t.tn, kst0, w_policy);
    }
    if (first) {
      runtime::grid_dependency_wait();  // from here on the previous kernel has finished
      if (lane == 0) runtime::enter_launch(ep, sh.slots);
      if (blockIdx.x == 0 && lane == 0)  // the collective before this launch (tensor parallelism) is done
        for (int i = 0; i < p.num_signal_tiles; ++i)
          cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(ep.signals[ep.tiles[p.signal_tiles[i]].signal])
              .fetch_add(1u, cuda::memory_order_release);
      __syncwarp();
    }
    const float* xres = staged ? residual_buffer(p, sh.slots.epoch, o.x_in) : nullptr;  // after enter_launch
    int count = n;
    ChunkWalk walk{};
    bool by_warp = false;
    // The launch's cut, for attention tiles and for o_proj's merge (pair_parts).
    if (!lengths_loaded && (kind == kAttention || (kind == kResidual && o.merges))) load_lengths(p, sh), lengths_loaded = true;
    if (kind == kAttention) {
      if (lane == 0) {
        walk = walk_begin(p, sh, t.tn);
        count = walk_count(p, sh, walk, kStageTokens);
        // A second walk over the segments (once a tile): folding the count into walk_count moved ptxas's
        // allocation of the head-dim 64, 128-row kernel from 252 to 872 B of spills a thread.
        if constexpr (kWarpSegments<Cfg>)
          by_warp = count < 0xffff && p.attn_warp_segments > 0 && walk_segments(p, sh, walk) >= p.attn_warp_segments;
      }
    }
    if (lane == 0) {
      mbar_wait(&sh.empty[qs], qphase ^ 1, "queue empty");
      sh.tile[qs] = id >= 0 ? t : DeviceTile{-1, 0, 0, 0, 0, 0, 0, -1};
      sh.id[qs] = id;
      sh.count[qs] = count;
      sh.by_warp[qs] = by_warp;
      mbar_arrive(&sh.full[qs]);  // the epoch (written above) reaches the consumers with the entry
      if (id >= 0) runtime::trace_mark(ep, id, runtime::kTraceSm), runtime::trace_mark(ep, id, runtime::kTraceTaken);
    }
    const int entry = qs;
    if (++qs == kQueue) qs = 0, qphase ^= 1;
    if (id < 0) break;

    // Usually a tile's producers finished long ago: one poll, made while the first stage is on its
    // way, says so. (A wait that expires, in tests with bounded waits, has flagged the launch failed;
    // the copies below still go out, since their stages are armed for them.)
    const bool ready = runtime::counters_ready_warp(ep, sh.slots.epoch, t);
    if (weights) {
      // Producers done: every stage gets weights and activations together. Otherwise a ring's worth
      // of weights goes out before the wait and their activations after it.
      const int pre = ready ? 1 : min(n, ps.count);
      if (lane == 0)
        for (int j = 1; j < pre; ++j) {
          const int s = acquire_stage(ring, ps);
          arm_stage(ring, s, stage_bytes(kst0 + j));
          issue_weights(p, ring, s, o, t.tn, kst0 + j, w_policy);
        }
      if (!ready) runtime::wait_counters_warp(ep, sh.slots.epoch, t);
      if (lane == 0) {
        runtime::trace_mark(ep, id, runtime::kTraceReady);
        mbar_arrive(&sh.ready[entry]);
        ptx::fence_proxy_async(ptx::space_global);  // produced activations, read by the async proxy
        for (int j = 0, s = s0; j < pre; ++j, s = (s + 1 == ps.count ? 0 : s + 1)) {
          if (staged) issue_residual_block(p, ring, s, xres, kst0 + j, x_policy);
          else issue_acts(p, ring, s, o, sh.slots.epoch, kst0 + j, x_policy);
        }
        for (int j = pre; j < n; ++j) {
          const int s = acquire_stage(ring, ps);
          arm_stage(ring, s, stage_bytes(kst0 + j));
          issue_weights(p, ring, s, o, t.tn, kst0 + j, w_policy);
          if (staged) issue_residual_block(p, ring, s, xres, kst0 + j, x_policy);
          else issue_acts(p, ring, s, o, sh.slots.epoch, kst0 + j, x_policy);
        }
      }
    } else if (kind == kAttention) {
      // The copies bring cached rows of earlier tokens only (q and the new row come from the QKV tiles'
      // sums, which the consumers read after `ready`): nothing here depends on this launch's tiles, so
      // while the producers are not done a ring's worth of stages goes out before the wait (no more:
      // the consumers free slots only past `ready`).
      AttnChunk c;
      const float inv_kv_heads = __frcp_rn(float(p.num_kv_heads));
      bool have = false;
      SegmentRoundRobin rr{sh.next_segment};
      auto next = [&] {
        if constexpr (kWarpSegments<Cfg>)
          if (by_warp) return round_robin_next(p, sh, rr, kStageTokens, c);
        return walk_next(p, sh, walk, kStageTokens, c);
      };
      int index = 0;  // the next stage's index in the tile (its mail; TW_STAGE_TRACE)
      auto issue = [&] {
        TW_STAGE_MARK(t.op, index, 0);
        const int s = acquire_stage(ring, ps);
        TW_STAGE_MARK(t.op, index, 1);
        sh.chunk[s] = c;
        arm_stage(ring, s, attention_stage_bytes<D>(c));
        TW_STAGE_MARK(t.op, index, 3);
        issue_kv<Cfg, D>(p, ring, s, o, c, kStageTokens, inv_kv_heads);
        if constexpr (kWarpSegments<Cfg>)
          if (by_warp) post_mail(sh, warp_of(c.flags), index);
        TW_STAGE_MARK(t.op, index, 2);
        ++index;
        have = next();
      };
      if (lane == 0) {
        if constexpr (kWarpSegments<Cfg>)
          if (by_warp) round_robin_begin(p, sh, rr, walk);
        have = next();
        if (!ready)
          for (int pre = 0; have && pre < ps.count; ++pre) issue();
      }
      if (!ready) runtime::wait_counters_warp(ep, sh.slots.epoch, t);
      if (lane == 0) {
        runtime::trace_mark(ep, id, runtime::kTraceReady);
        TW_STAGE_MARK(t.op, TW_STAGE_TILE, 0);
        TW_STAGE_PUT(t.op, TW_STAGE_TILE, 2, count);
        TW_STAGE_PUT(t.op, TW_STAGE_TILE, 3, t.tn);
        mbar_arrive(&sh.ready[entry]);
        while (have) issue();
        if constexpr (kWarpSegments<Cfg>)
          if (by_warp)
            for (int w = 0; w < 8; ++w) post_mail(sh, w, kMailEnd);
        TW_STAGE_MARK(t.op, TW_STAGE_TILE, 1);
      }
    } else {
      if (!ready) runtime::wait_counters_warp(ep, sh.slots.epoch, t);
      if (lane == 0) mbar_arrive(&sh.ready[entry]);
    }
    // The next ticket only now: its round trips overlap the consumers working through this tile.
    if (lane == 0) runtime::prefetch_next(ep, sh.slots);
  }
}

// ---- consumers (two warpgroups, 256 threads; ct = thread index among them) ----

// A float's bits as an unsigned key ordered like the floats.
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ void store_bf16x4(bf16* dst, float a, float b, float c, float d) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 u;
  u.x = *reinterpret_cast<uint32_t*>(&lo);
  u.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = u;
}

// After the tile's global writes: make them visible to the async proxy where other CTAs read them with
// bulk copies (`async_readers`: activations, q, the cache rows), then publish the tile on its counter.
// A tile whose writes no reader of the counter needs (split-K partial sums, attention partials: their
// readers acquire them through the split's or the pair's count) counts relaxed: the readers' acquire
// of the counter still synchronises with every release before it (RMWs continue release sequences).
// A ticket covering several K slices publishes each one's signal (`slices`).
__device__ __forceinline__ void finish_tile(const StepParams& p, const DeviceTile& t, int32_t id, int ct,
                                            bool async_readers = true,
                                            cuda::memory_order order = cuda::memory_order_release,
                                            uint32_t slices = 1) {
  if (async_readers) ptx::fence_proxy_async(ptx::space_global);
  consumer_sync();
  if (ct == 0) {
    runtime::release_signal(p.ep, t, order, slices);
    runtime::trace_mark(p.ep, id, runtime::kTraceDone);
  }
}

// RoPE (rotate-half) at position pos: the cosine and sine of dimensions i and i + 1 (each rotated
// with its partner half a head away). The angle in float as transformers computes it, reduced to
// [-pi, pi] in double, then the hardware sine and cosine (sincosf's large-argument path would put an
// array in local memory). They depend on the position only, so the attention's consumers compute
// them before they wait for the QKV tiles (the loads of inv_freq and the reduction were ~0.25-0.5 us of
// every attention tile's critical path on the H200).
struct RopePair {
  float cs[2], sn[2];
};
__device__ __forceinline__ RopePair rope_pair(const StepParams& p, int pos, int i) {
  RopePair r;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const double angle = double(float(pos) * p.inv_freq[i + e]);
    __sincosf(float(angle - rint(angle * 0.15915494309189535) * 6.283185307179586), &r.sn[e], &r.cs[e]);
  }
  return r;
}
__device__ __forceinline__ void rotate(const RopePair& r, int e, float& a, float& b) {
  const float a2 = a * r.cs[e] - b * r.sn[e], b2 = b * r.cs[e] + a * r.sn[e];
  a = a2, b = b2;
}

// The epilogue of a gate/up or LM head tile on the (summed) accumulators. Register 4q+e of consumer
// thread ct (sm90::acc_coord, one 64-row block per warpgroup) is weight row r + 8 (e >> 1) of the
// tile, r = warp * 16 + lane / 4, and activation row 8q + 2 (ct % 4) + (e & 1). Gate/up tiles hold in
// rows r and r + 8 a column and its partner: registers e = 0, 1 and e + 2.
template <class Cfg>
__device__ void weight_epilogue(const StepParams& p, StepShared& sh, float* scratch, const StepOpArgs& o,
                                const DeviceTile& t, const float (&acc)[Cfg::kAcc], int ct, uint32_t epoch) {
  const int lane = ct % 32, warp = ct / 32;
  const ActLayout act{p.act_rows};
  const int B = p.batch;
  if (o.kind == kGateUp) {
    const int pc = t.tn * (kTileRows / 2) + warp * 8 + lane / 4;
    if (pc >= o.n) return;
#pragma unroll
    for (int q = 0; q < Cfg::kAcc / 4; ++q)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int m = 8 * q + 2 * (lane % 4) + e;
        if (m >= B) continue;
        const float r = sh.rstd[m];
        o.out[act.index(m, pc)] = __float2bfloat16(kernels::silu(acc[4 * q + e] * r) * (acc[4 * q + e + 2] * r));
      }
    return;
  }
  // The LM head: running maxima per row, over the 8 warps through shared memory in passes of 64 rows
  // (keys[warp][row], plain stores: a 64-bit atomicMax there compiles to a compare-and-swap loop, and
  // all 8 warps hit the same rows), then one reduction per row into the keys. (Each warp reducing into
  // the keys itself, 8 per row a tile, was 3.8% slower at Llama-3.2-1B B = 128: the keys' few lines
  // take every tile's atomics.)
  static_assert(8 * 64 * sizeof(unsigned long long) <= kScratchBytes, "a pass's keys fit the scratch");
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(scratch);
  const int r0 = t.tn * kTileRows + warp * 16 + lane / 4;
  constexpr int kQ = Cfg::kAcc / 4;
#pragma unroll
  for (int q0 = 0; q0 < kQ; q0 += 8) {
    if (8 * q0 >= B) break;
#pragma unroll
    for (int q = q0; q < q0 + 8 && q < kQ; ++q) {
      unsigned long long best[2] = {0ull, 0ull};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = 8 * q + 2 * (lane % 4) + (e & 1), col = r0 + 8 * (e >> 1);
        if (m >= B || col >= o.n) continue;
        const float v = acc[4 * q + e] * sh.rstd[m];
        if (p.logits) p.logits[int64_t(m) * p.vocab + col] = v;
        const unsigned long long key = (uint64_t(ordered_bits(v)) << 32) | (0xFFFFFFFFu - uint32_t(p.vocab_offset + col));
        best[e & 1] = max(best[e & 1], key);
      }
      // The 8 lanes of a warp that share lane % 4 hold the same activation rows.
#pragma unroll
      for (int e = 0; e < 2; ++e) {
#pragma unroll
        for (int x = 4; x < 32; x *= 2) best[e] = max(best[e], __shfl_xor_sync(0xffffffffu, best[e], x));
        if (lane < 4) keys[warp * 64 + 8 * (q - q0) + 2 * lane + e] = best[e];
      }
    }
    consumer_sync();
    const int m = 8 * q0 + ct;
    if (ct < 64 && m < B) {
      unsigned long long best = keys[ct];
#pragma unroll
      for (int w = 1; w < 8; ++w) best = max(best, keys[w * 64 + ct]);
      for (int r = 0; r < (p.push ? p.ranks : 1); ++r)  // every rank's keys (collectives in the launch)
        atomicMax((p.push ? on_rank(p, r, p.maxima) : p.maxima) + (epoch & 1) * B + m, best);
    }
    if (8 * (q0 + 8) < B) consumer_sync();  // the next pass reuses the keys
  }
}

// The reductions of a tile's accumulators as float4s at R >= 32 (B > 8). A thread's accumulators of
// one output column are rows 8j + 2 (lane % 4) + e; the four lanes q = 4a .. 4a + 3 (lane = 4q +
// lane % 4) hold four consecutive columns. A 4 x 4 transpose among those lanes over four row blocks j
// gives each lane one row's four columns: f(row, first column, values) then issues one
// red.global.add.v4.f32 instead of four scalar reductions (each an L2 atomic: at B = 64 a tile's 8192
// of them took ~10 us to complete). A/B on the H200 for o_proj and down (one call,
// decode_step_residual_v4_ab.json): Llama-3.2-1B B = 64 -16%, B = 32 -4.9%, Llama-3-8B B = 32 -3.6%,
// B = 64 -2.6%. At R = 32 (B = 9-16) they first read -0.4% / +0.4%, when the transpose went through
// local memory; with the butterfly, Llama-3.2-1B B = 16 KV 4096 -2.4%, B = 12 -3.0%, Llama-3-8B and
// Qwen2-7B B = 16 -0.6% (decode_step_issue_ab.json, session 27).
template <class Cfg>
constexpr bool kVectorReductions = Cfg::kMPad >= 32;
template <class Cfg, class F>
__device__ __forceinline__ void for_each_row_quad(const float (&acc)[Cfg::kAcc], int ct, int tn, F&& f) {
  static_assert(Cfg::kAcc % 16 == 0, "four row blocks per transpose");
  const int lane = ct % 32, warp = ct / 32, k = (lane >> 2) & 3, a = lane >> 4, pq = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int jb = 0; jb < Cfg::kAcc / 16; ++jb) {
        float w[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) w[jj] = acc[4 * (4 * jb + jj) + 2 * h + e];
        // A butterfly over the two bits of k: for bit b, lanes k and k ^ b swap the elements whose index
        // differs from their own k in that bit. Every index is a compile-time constant (selects, not a
        // run-time index: choosing the sent value by (k - r) & 3 put the values in local memory, 1248 B of
        // spills at R = 128).
#pragma unroll
        for (int b = 1; b <= 2; b *= 2) {
          const bool hi = k & b;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (j & b) continue;
            const float got = __shfl_xor_sync(0xffffffffu, hi ? w[j] : w[j | b], 4 * b);
            if (hi) w[j] = got; else w[j | b] = got;
          }
        }
        f(8 * (4 * jb + k) + 2 * pq + e, tn * kTileRows + warp * 16 + 4 * a + 8 * h, w);
      }
}
__device__ __forceinline__ void red_add_v4(float* dst, const float (&w)[4]) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(w[0]), "f"(w[1]), "f"(w[2]), "f"(w[3])
               : "memory");
}

// o_proj / down: the K slice's part of x' = x + a W^T added into writer x_out's buffer (slice 0 adds x
// too, from writer x_in's), fire-and-forget; slice 0 also zeroes its columns of buffer x_out + 2.
// Loads go out in batches, never between stores (a store between two loads serialises them: measured
// as ~4 us of a split tile's tail in the step timelines).
template <class Cfg>
__device__ __forceinline__ void add_to_residual(const StepParams& p, const StepOpArgs& o, const DeviceTile& t,
                                                float (&acc)[Cfg::kAcc], int ct, uint32_t epoch) {
  const int lane = ct % 32, warp = ct / 32, r0 = t.tn * kTileRows + warp * 16 + lane / 4;
  // Accumulator i is row m = 8 (i / 4) + 2 (lane % 4) + (i & 1), column r0 + 8 ((i & 3) >> 1): its
  // element in the stream, or -1 outside the batch or the columns. The row
  // passes through an opaque move, so that the compiler does not compute every accumulator's address
  // up front (R = 64, D = 128: 856 -> 468 B of spill loads).
  auto at = [&](int i) {
    int m;
    asm volatile("mov.b32 %0, %1;\n" : "=r"(m) : "r"(8 * (i / 4) + 2 * (lane % 4) + (i & 1)));
    const int col = r0 + 8 * ((i & 3) >> 1);
    return m < p.batch && col < o.n ? residual_at(p, m, col) : -1;
  };
  if (!kVectorReductions<Cfg> && t.ks == 0 && p.add_residual) {  // (the vector path adds x itself)
    const float* x = residual_buffer(p, epoch, o.x_in);
    constexpr int kBatch = Cfg::kAcc < 16 ? Cfg::kAcc : 16;
#pragma unroll
    for (int i0 = 0; i0 < Cfg::kAcc; i0 += kBatch) {
      float r[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int e = at(i0 + j);
        r[j] = e >= 0 ? __ldcg(x + e) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) acc[i0 + j] += r[j];
    }
  }
  float* y = residual_buffer(p, epoch, o.x_out);
  if constexpr (kVectorReductions<Cfg>) {
    // Slice 0 adds the stream's x as float4 loads after the transpose.
    const float* x = (t.ks == 0 && p.add_residual) ? residual_buffer(p, epoch, o.x_in) : nullptr;
    for_each_row_quad<Cfg>(acc, ct, t.tn, [&](int m, int col, float (&w)[4]) {
      if (m >= p.batch || col >= o.n) return;
      const int at = residual_at(p, m, col);
      if (x) {
        const float4 r = __ldcg(reinterpret_cast<const float4*>(x + at));
        w[0] += r.x, w[1] += r.y, w[2] += r.z, w[3] += r.w;
      }
      for (int q = 0; q < (p.push ? p.ranks : 1); ++q) red_add_v4((p.push ? on_rank(p, q, y) : y) + at, w);
    });
  } else {
    for (int q = 0; q < (p.push ? p.ranks : 1); ++q) {  // every rank's stream (collectives in the launch)
      float* yq = p.push ? on_rank(p, q, y) : y;
#pragma unroll
      for (int i = 0; i < Cfg::kAcc; ++i) {
        const int e = at(i);
        if (e >= 0) asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(yq + e), "f"(acc[i]) : "memory");
      }
    }
  }
  if (t.ks == 0) {
    float4* z = reinterpret_cast<float4*>(residual_buffer(p, epoch, o.x_out + 2));
    const int c0 = t.tn * kTileRows;
    for (int i = ct; i < p.batch * (kTileRows / 4); i += kConsumers) {
      const int m = i / (kTileRows / 4), col = c0 + 4 * (i % (kTileRows / 4));
      if (col < o.n) z[residual_at(p, m, col) / 4] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (o.zero) {  // o_proj: its share of qkv_acc and qkv_ss (zero_elems is a multiple of 4)
      const int chunk = ((o.zero_elems + o.grid_n - 1) / o.grid_n + 3) & ~3, z0 = t.tn * chunk;
      const int z1 = min(o.zero_elems, z0 + chunk);
      for (int i = z0 / 4 + ct; i < z1 / 4; i += kConsumers)
        reinterpret_cast<float4*>(o.zero)[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

// The mainloop of a norm consumer. A stage's activation bytes arrive holding fp32 rows of the residual
// stream, [B][kCols] (issue_residual_block: with the weights, by the copy engine; loads by the
// consumers themselves waited behind the SM's weight copies in flight, ~7% of an 8B B = 16 step on
// the H200); the consumers convert them in place to the act layout (bf16, swizzled) and sum the rows'
// squares on the way (into sh.rstd at the end, for the epilogue). Act rows >= batch keep whatever
// bytes they hold: their accumulators are never used. Thread ct takes float4 items i = ct + 256 k of
// the fp32 rows (row i / kF4, the same rows at every stage).
template <class Cfg>
struct Staging {
  static constexpr int kCols = Cfg::kKAtoms * 64;
  static constexpr int kF4 = kCols / 4;                                  // float4s per row
  static constexpr int kLanes = kF4 <= 32 ? kF4 : kF4 % 32 == 0 ? 32 : 16;  // threads per row (one warp at most)
  static constexpr int kPer = kF4 / kLanes;  // float4s per item: 3 at 192 columns, 2 at 256
  static constexpr int kItems = (Cfg::kMPad / 2 * kLanes + kConsumers - 1) / kConsumers;  // a thread's (B <= R / 2)
  // Registers beside R = 256's 128 accumulators: its rows go in two halves, each read, then written.
  // In place, that needs one barrier: with one 64-column atom, fp32 row m is at 256 m bytes and act
  // row m at 128 m, so the first half's act rows [0, 64) overwrite fp32 rows [0, 32), read by then,
  // and the second half's, fp32 rows [32, 64): read before the barrier too; neither touches rows >= 64.
  static constexpr int kChunk = kItems <= 4 ? kItems : 4;
  static constexpr int kPasses = kItems / kChunk;
  static_assert(kF4 % kLanes == 0 && kConsumers % kLanes == 0, "staging items");
  static_assert(kPasses == 1 || (kPasses == 2 && Cfg::kKAtoms == 1 && Cfg::kMPad == 256), "staging passes");
};
// Folds (max mo, weight so, weighted sum ao) into a running merge of partials (m, s, a), log2 domain:
// a partial is (its log2-sum-exp, 1, its normalised output); an empty side (weight 0) adds nothing.
__device__ __forceinline__ void fold_merge(float& m, float& s, float4& a, float mo, float so, const float4& ao) {
  const float mn = fmaxf(m, mo);
  const float x = s > 0.f ? exp2f(m - mn) : 0.f, y = so > 0.f ? exp2f(mo - mn) : 0.f;
  a = make_float4(a.x * x + ao.x * y, a.y * x + ao.y * y, a.z * x + ao.z * y, a.w * x + ao.w * y);
  s = s * x + so * y;
  m = mn;
}

// o_proj's merge of the attention's split pairs (StepParams::oproj_merges). The attention's last tile
// of a pair merged it before: a count (an L2 read-modify-write), the partials' loads, the stores and a
// second release, all on the layer's chain before o_proj could read the output (up to 4 us after the
// pair's last combine at Llama-3.2-1B B = 1). Now o_proj's consumers find the tiles holding each pair
// of their K slice from the launch's cut before the tile is ready (pair_parts: the producer loads the
// lengths for them), load the partials once it is, all in flight together, and keep the merged values
// in registers (bf16); each stage's copy brings the whole pairs' outputs (and stale rows for the split
// ones), which the merged values overwrite in shared memory before the stage's wgmmas. Measured
// stage by stage instead (a round trip per stage after each copy, which also freed each slot that
// much later): Llama-3-8B B = 1 3988 -> 4119 us (H200). Thread ct holds item ct / S: row m's float4
// of columns 4c .. 4c + 3 of the slice (the host keeps B x slice columns <= kOprojMergeCols); S lanes
// share an item, each taking every S-th partial, and meet by shuffles. Tiles of at most 32 rows.
struct MergedSlice {
  uint2 v;       // bf16 x 4
  int stage;     // the stage of the slice it goes to; -1: nothing for this lane to write
  uint32_t at;   // its byte offset in that stage's activations (act layout, swizzled)
};
template <class Cfg, int D>
__device__ __forceinline__ void merge_slice(const StepParams& p, const StepShared& sh, int kst0, int stages, int ct,
                                            uint64_t* ready, uint32_t ready_phase, MergedSlice& out) {
  constexpr int kCols = Cfg::kKAtoms * 64;
  static_assert(kOprojMergeCols == 4 * kConsumers, "one item a thread");
  const int f4 = stages * kCols / 4, items = p.batch * f4, G = p.group;
  int S = 1;
  while (S < 8 && 2 * S * items <= kConsumers) S *= 2;
  const int sub = ct & (S - 1), lane = ct % 32, i = ct / S, m = i / f4, c = i - m * f4, col = kst0 * kCols + 4 * c;
  const uint32_t mask = ((1u << S) - 1u) << (lane & ~(S - 1));
  out.stage = -1;
  int first = 0, n = 0;
  bool shift = false;
  const int hq = col / D, kvh = hq / G, g = hq - kvh * G;
  if (m < p.batch && col < p.q_dim) pair_parts(p, sh, m, kvh, first, n, shift);  // else the slice's padding
  mbar_wait(ready, ready_phase, "ready");  // the attention tiles' partials are visible (every consumer waits)
  if (n <= 1) return;  // a whole pair: the copy brings its output (the same in a lane group)
  const float* src = p.o_part + g * D + (col - hq * D);
  float mw = -INFINITY, sw = 0.f;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
  constexpr int kBatch = 8;  // Llama-3-8B B = 1: 8 parts a pair, one lane an item
  for (int s0 = sub; s0 < n; s0 += kBatch * S) {
    float lse[kBatch];
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int sj = s0 + j * S;
      const int64_t slot = 2 * int64_t(first + min(sj, n - 1)) + (sj == 0 && shift ? 1 : 0);
      lse[j] = sj < n ? __ldcg(p.lse_part + slot * G + g) : -INFINITY;
      v[j] = __ldcg(reinterpret_cast<const float4*>(src + slot * G * D));
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (lse[j] != -INFINITY) fold_merge(mw, sw, a, lse[j], 1.f, v[j]);
    }
  }
  for (int off = 1; off < S; off *= 2) {
    const float mo = __shfl_xor_sync(mask, mw, off), so = __shfl_xor_sync(mask, sw, off);
    const float4 ao = make_float4(__shfl_xor_sync(mask, a.x, off), __shfl_xor_sync(mask, a.y, off),
                                  __shfl_xor_sync(mask, a.z, off), __shfl_xor_sync(mask, a.w, off));
    fold_merge(mw, sw, a, mo, so, ao);
  }
  if (sub != 0) return;
  const float f = __fdividef(1.f, sw);
  __nv_bfloat162 lo = __floats2bfloat162_rn(f * a.x, f * a.y), hi = __floats2bfloat162_rn(f * a.z, f * a.w);
  out.v = make_uint2(*reinterpret_cast<uint32_t*>(&lo), *reinterpret_cast<uint32_t*>(&hi));
  const int j = 4 * c / kCols, cc = 4 * c - j * kCols, q = cc & 63;
  out.stage = j;
  out.at = (cc >> 6) * Cfg::kXAtomBytes + m * 128 + ((((q >> 3) ^ (m & 7)) << 4) | ((q & 4) << 1));
}

// One mainloop for every weight tile (`staged`: a norm consumer's), so that the kernel has one wgmma
// site: with two (one per path), R = 256's accumulators had the compiler serialise every wgmma.
// o_proj with `merges` first merges its slice's split pairs (merge_slice).
template <class Cfg, int D>
__device__ void consume_weight_tile(const Ring<Cfg>& ring, PipeState<Cfg>& ps, StepShared& sh, const StepParams& p,
                                    const StepOpArgs& o, const DeviceTile& t, int ct, float (&acc)[Cfg::kAcc],
                                    bool staged, uint64_t* ready, uint32_t ready_phase) {
  using S = Staging<Cfg>;
  const int wg = ct / 128, n = stages_of(o, t), kst0 = o.slice_start[t.ks], B = p.batch, K = o.k;
  const bool release_lane = (ct % 32) == 0;
  float ss[S::kItems];
#pragma unroll
  for (int k = 0; k < S::kItems; ++k) ss[k] = 0.f;
  int prev = -1;
  MergedSlice merged;
  if constexpr (Cfg::kMPad <= 32)
    if (o.merges) merge_slice<Cfg, D>(p, sh, kst0, n, ct, ready, ready_phase, merged);
  for (int j = 0; j < n; ++j) {
    const int s = ps.stage;
    mbar_wait(&ring.full[s], ps.phase, "full");
    const uint8_t* xs = ring.x_atom(s, 0);
    const uint32_t xa = static_cast<uint32_t>(__cvta_generic_to_shared(xs));
    if (staged) {
#pragma unroll
    for (int pass = 0; pass < S::kPasses; ++pass) {
      float4 v[S::kChunk][S::kPer];
#pragma unroll
      for (int kk = 0; kk < S::kChunk; ++kk)
#pragma unroll
        for (int q = 0; q < S::kPer; ++q) {
          const int k = pass * S::kChunk + kk, i = ct + kConsumers * k, m = i / S::kLanes;
          const int c = 4 * (i % S::kLanes + S::kLanes * q);
          // Columns >= K were not copied: zero, as the weights' padding there.
          const bool valid = m < B && (kst0 + j) * S::kCols + c < K;
          const float4 x =
              valid ? *reinterpret_cast<const float4*>(xs + (m * S::kCols + c) * 4) : make_float4(0.f, 0.f, 0.f, 0.f);
          v[kk][q] = x;
          ss[k] += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
        }
      if (pass == 0) consumer_sync();  // the rows read before the act layout overwrites them
#pragma unroll
      for (int kk = 0; kk < S::kChunk; ++kk)
#pragma unroll
        for (int q = 0; q < S::kPer; ++q) {
          const int k = pass * S::kChunk + kk, i = ct + kConsumers * k, m = i / S::kLanes;
          const int c = 4 * (i % S::kLanes + S::kLanes * q), cc = c & 63;
          if (m >= B) continue;
          const float4 x = v[kk][q];
          __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
          const uint32_t at = xa + (c >> 6) * Cfg::kXAtomBytes + m * 128 + ((((cc >> 3) ^ (m & 7)) << 4) | ((cc & 4) << 1));
          asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(at), "r"(*reinterpret_cast<uint32_t*>(&lo)),
                       "r"(*reinterpret_cast<uint32_t*>(&hi))
                       : "memory");
        }
    }
    ptx::fence_proxy_async(ptx::space_shared);  // the generic stores, before the wgmmas read them
    consumer_sync();
    } else if (Cfg::kMPad <= 32 && o.merges) {
      if (merged.stage == j)
        asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(xa + merged.at), "r"(merged.v.x), "r"(merged.v.y) : "memory");
      ptx::fence_proxy_async(ptx::space_shared);  // the generic stores, before the wgmmas read them
      consumer_sync();
    }
    mma_stage(ring, s, wg, acc, j != 0);
    wgmma_wait<1>();
    fence_operands(acc);
    if (prev >= 0 && release_lane) mbar_arrive(&ring.empty[prev]);
    prev = s;
    ps.advance();
  }
  // The rows' sums of squares, while the last wgmmas run: the kLanes threads of a row's items are
  // consecutive (kLanes divides 32); the first of them writes the row's sum.
#pragma unroll
  for (int k = 0; k < S::kItems; ++k) {
    float v = ss[k];
#pragma unroll
    for (int off = 1; off < S::kLanes; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int i = ct + kConsumers * k;
    if (staged && i % S::kLanes == 0 && i / S::kLanes < B) sh.rstd[i / S::kLanes] = v;
  }
  wgmma_wait<0>();
  fence_operands(acc);
  if (release_lane) mbar_arrive(&ring.empty[prev]);
}

// A norm consumer's tile after its mainloop, its rows' sums of squares in sh.rstd: split over K, the
// slices add their partial sums (fp32 blocks in fragment order, vector reductions) and sums of
// squares, and the last slice to arrive takes them and re-zeroes the block; then the epilogue.
template <class Cfg>
__device__ void finish_norm_tile(const StepParams& p, StepShared& sh, float* scratch, const StepOpArgs& o, const DeviceTile& t,
                                 int32_t id, float (&acc)[Cfg::kAcc], int ct, uint32_t epoch) {
  consumer_sync();  // every thread's sums of squares are in sh.rstd
  const int B = p.batch;
  if (split_slice(o, t)) {
    float4* block = reinterpret_cast<float4*>(o.ws) + int64_t(t.tn) * (kConsumers * Cfg::kAcc / 4);
    float* ss = o.ws + int64_t(o.grid_n) * kConsumers * Cfg::kAcc + int64_t(t.tn) * p.act_rows;
    add_split_partials<Cfg>(block, acc, ct);
    if (ct < B) asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(ss + ct), "f"(sh.rstd[ct]) : "memory");
    consumer_sync();
    if (ct == 0) sh.flag = runtime::arrive_last(p.ep, epoch, t, o.split);
    if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceMark1);
    consumer_sync();
    if (!sh.flag) return finish_tile(p, t, id, ct, false, cuda::memory_order_relaxed);  // only partial sums
    const float total = ct < B ? __ldcg(ss + ct) : 0.f;
    take_split_sums<Cfg>(block, acc, ct);
    if (ct < B) {
      __stcg(ss + ct, 0.f);
      sh.rstd[ct] = total;
    }
    if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceMark2);
  }
  if (ct < B) sh.rstd[ct] = rsqrtf(__fdividef(sh.rstd[ct], float(o.k)) + p.eps);
  consumer_sync();
  weight_epilogue<Cfg>(p, sh, scratch, o, t, acc, ct, epoch);
  // The LM head's maxima are read by ordinary loads.
  finish_tile(p, t, id, ct, o.kind != kLmHead, cuda::memory_order_release, uint32_t(slices_of(o, t)));
}

// A QKV tile after its mainloop: its K slice's part of x Wᵀ added into qkv_acc, unscaled (the scale
// needs every slice's sums of squares), and, in output tile 0's slices, the slice's sums of squares
// into qkv_ss. Fire-and-forget reductions, then the release: no slice waits for another (a split-K
// reduction here -- partials, the last slice's count, its loads -- was ~3.6 us of each layer's
// critical path at Llama-3.2-1B B = 1 on the H200). The attention finishes q, k and v (finish_qkv).
template <class Cfg>
__device__ void finish_qkv_tile(const StepParams& p, StepShared& sh, const StepOpArgs& o, const DeviceTile& t,
                                int32_t id, const float (&acc)[Cfg::kAcc], int ct) {
  const int lane = ct % 32, B = p.batch;
  if (t.tn == 0) {  // the tile's whole CTA takes this branch or none
    consumer_sync();  // the slice's sums of squares (consume_weight_tile) are in sh.rstd
    if (ct < B) asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p.qkv_ss + 4 * ct), "f"(sh.rstd[ct]) : "memory");
  }
  // As float4s only with the stream's bf16 copy (measured there, decode_step_bf16_stream_ab.json; at
  // R = 64 with B <= 32 Llama-3-8B B = 32 read 6.6% slower in a later call, not A/B'd).
  if constexpr (kVectorReductions<Cfg>) {
    if (bf16_stream<Cfg>(p)) {
      for_each_row_quad<Cfg>(acc, ct, t.tn, [&](int m, int col, const float (&w)[4]) {
        if (m < B && col < o.n) red_add_v4(p.qkv_acc + m * p.qkv_cols + col, w);
      });
      return finish_tile(p, t, id, ct, false);  // read with ordinary loads (finish_qkv)
    }
  }
  const int r0 = t.tn * kTileRows + (ct / 32) * 16 + lane / 4;
#pragma unroll
  for (int i = 0; i < Cfg::kAcc; ++i) {
    int m;  // through an opaque move, as in add_to_residual: not every address up front
    asm volatile("mov.b32 %0, %1;\n" : "=r"(m) : "r"(8 * (i / 4) + 2 * (lane % 4) + (i & 1)));
    const int col = r0 + 8 * ((i & 3) >> 1);
    if (m < B && col < o.n)
      asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p.qkv_acc + m * p.qkv_cols + col), "f"(acc[i]) : "memory");
  }
  finish_tile(p, t, id, ct, false);  // read with ordinary loads (finish_qkv)
}

// The float4 slot of combine_segment's row of head g where its logical float4 q lies (a permutation
// of each row's float4s that leaves bit 3 of q in place, so it is its own inverse).
__device__ __forceinline__ int combine_slot(int g, int q) { return q ^ ((g & 3) | ((q >> 1) & 4)); }

// Attention tile: count stages of K/V through the ring. Warp w of 8 takes the 16-token units u of a
// segment with u % 8 == w, keeping its own online softmax; at a segment's end the warps combine in
// shared memory and the result is the output (a whole pair) or a partial (normalised output + LSE,
// slot 2 tile + which). The last tile to finish a pair merges its partials (no tile waits for another).
template <int D>
__device__ void combine_segment(const StepParams& p, float* scratch, float* stage, const AttnChunk& c, int tile,
                                float (&o)[D / 8][4], float m, float l, int ct, const StepOpArgs& op) {
  const int lane = ct % 32, warp = ct / 32, g = lane / 4, tq = lane % 4, G = p.group;
  float2* ml = reinterpret_cast<float2*>(scratch);  // [8 warps][8 rows]
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if (tq == 0 && g < G) ml[warp * 8 + g] = make_float2(m, l);
  consumer_sync();  // every warp is done with the stage's K/V: its bytes are free for the sums
  auto row_max_sum = [&](int row, float& mx, float& sum) {
    mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < 8; ++w) mx = fmaxf(mx, ml[w * 8 + row].x);
    sum = 0.f;
#pragma unroll
    for (int w = 0; w < 8; ++w) sum += ml[w * 8 + row].y * exp2f(ml[w * 8 + row].x - mx);
  };
  // Each warp stores its scaled output, [warp][G][D] fp32, in the stage it has just read; then each
  // thread sums 8 warps' values of its float4s. (The sums had gone through a [2][G][D] scratch in
  // four rounds of read-modify-write, one warp per warpgroup a round: each element a load, a branch
  // and a store in a chain, ~2 us at D = 64 and ~3.3 us at D = 128 per segment on the H200.)
  // Accumulators o[4jb .. 4jb + 3][e] are dimensions 4q .. 4q + 3 of the row, q = 4 tq + 16 (jb / 2) +
  // jb % 2 + 2e: one float4 store each. A warp's lanes of one store differ in g and tq, which leave
  // the float4's slot in its 128-byte bank line (q % 8) two values; combine_slot XORs the slot with
  // g and bit 3 of q, so that they take all eight (2 wavefronts for 16 lanes instead of 8-way
  // conflicted scalar stores: 0.5 us at D = 64 and 1.1 us at D = 128 of every segment's end, H200).
  if (g < G) {
    float mx, sum;
    row_max_sum(g, mx, sum);
    const float f = __fdividef(exp2f(m - mx), sum);  // 0 for a warp with no unit in the segment
    float4* row = reinterpret_cast<float4*>(stage + (warp * G + g) * D);
#pragma unroll
    for (int jb = 0; jb < D / 32; ++jb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int q = 4 * tq + 16 * (jb / 2) + jb % 2 + 2 * e;
        row[combine_slot(g, q)] = make_float4(f * o[4 * jb][e], f * o[4 * jb + 1][e], f * o[4 * jb + 2][e], f * o[4 * jb + 3][e]);
      }
  }
  consumer_sync();
  const int b = c.pair / p.num_kv_heads, h = c.pair - b * p.num_kv_heads;
  const int64_t part = 2 * int64_t(tile) + ((c.flags & kWhich) ? 1 : 0);
  const ActLayout act{p.act_rows};
  for (int i = ct; i < G * D / 4; i += kConsumers) {
    const int gg = i / (D / 4), d = 4 * (i % (D / 4));
    float4 x[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) x[w] = reinterpret_cast<const float4*>(stage + (w * G + gg) * D)[combine_slot(gg, d / 4)];
    float4 v = x[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) v = make_float4(v.x + x[w].x, v.y + x[w].y, v.z + x[w].z, v.w + x[w].w);
    if (c.flags & kWhole) {
      store_bf16x4(op.out + act.index(b, (h * G + gg) * D + d), v.x, v.y, v.z, v.w);
    } else {
      *reinterpret_cast<float4*>(&p.o_part[(part * G + gg) * D + d]) = v;
      if (d == 0) {
        float mx, sum;
        row_max_sum(gg, mx, sum);
        p.lse_part[part * G + gg] = mx + log2f(sum);
      }
    }
  }
  consumer_sync();  // the stage and the scratch are free again
}

// Merges the partials of the pair of c, one per tile holding part of it, as the last of those tiles.
// Threads are grouped: group j merges partials j, j + groups, ... of the G D / 4 float4s (all their
// loads in flight together), then the groups' scaled sums meet in shared memory (plain stores, then
// each float4 summed by one thread: no shared-memory float atomics, which are compare-and-swap loops).
template <int D>
__device__ void merge_pair(const StepParams& p, float* scratch, const AttnChunk& c, int ct, const StepOpArgs& op) {
  const int G = p.group, nv = G * D / 4, groups = max(1, kConsumers / nv);  // groups * nv <= kConsumers
  const int c0 = c.first_tile, n = c.tiles, shift = (c.flags & kShift) ? 1 : 0;
  float4* sums = reinterpret_cast<float4*>(scratch);                        // [groups][nv]
  float2* ms = reinterpret_cast<float2*>(scratch + 4 * kConsumers);         // [groups][nv]
  const int grp = ct / nv, e = ct % nv;
  float mw = -INFINITY, sw = 0.f;
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
  if (grp < groups) {
    // Batches of 4 partials: all their loads in flight before the first is used (one L2 round trip a
    // batch; in a loop that merged as it loaded, the merge tail was one round trip per partial).
    constexpr int kBatch = 4;
    for (int s0 = grp; s0 < n; s0 += kBatch * groups) {
      float lse[kBatch];
      float4 v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int s = s0 + j * groups;
        const int64_t slot = 2 * int64_t(c0 + min(s, n - 1)) + (s == 0 ? shift : 0);
        lse[j] = s < n ? __ldcg(p.lse_part + slot * G + e / (D / 4)) : -INFINITY;
        v[j] = __ldcg(reinterpret_cast<const float4*>(p.o_part + slot * G * D) + e);
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        if (lse[j] != -INFINITY) fold_merge(mw, sw, a, lse[j], 1.f, v[j]);
      }
    }
    ms[grp * nv + e] = make_float2(mw, sw);
  }
  consumer_sync();
  if (grp < groups) {
    float mx = -INFINITY, sum = 0.f;
    for (int j = 0; j < groups; ++j) mx = fmaxf(mx, ms[j * nv + e].x);
    for (int j = 0; j < groups; ++j) sum += ms[j * nv + e].y * exp2f(ms[j * nv + e].x - mx);
    const float f = sw > 0.f ? __fdividef(exp2f(mw - mx), sum) : 0.f;  // a group with no partial adds 0
    sums[grp * nv + e] = make_float4(f * a.x, f * a.y, f * a.z, f * a.w);
  }
  consumer_sync();
  const int b = c.pair / p.num_kv_heads, h = c.pair - b * p.num_kv_heads;
  const ActLayout act{p.act_rows};
  for (int i = ct; i < nv; i += kConsumers) {
    float4 v = sums[i];
    for (int j = 1; j < groups; ++j) {
      const float4 x = sums[j * nv + i];
      v = make_float4(v.x + x.x, v.y + x.y, v.z + x.z, v.w + x.w);
    }
    const int gg = i / (D / 4), d = 4 * (i % (D / 4));
    store_bf16x4(op.out + act.index(b, (h * G + gg) * D + d), v.x, v.y, v.z, v.w);
  }
  consumer_sync();
}

// The dimensions j, j + 1 of every item of finish_qkv's thread ct (items per head divide kConsumers):
// the pair rope_pair computes before the wait.
template <int D>
__device__ __forceinline__ int rope_dims(int ct) { return 2 * (ct % (D / 4)); }
static_assert(kConsumers % (64 / 4) == 0 && kConsumers % (128 / 4) == 0 && 32 % (128 / 4) == 0,
              "a thread's items share their dimensions (all consumers, or a warp)");

// q of the pair's group (at a segment's first stage) and the pair's new k and v (at the stage holding
// the new row) from the QKV tiles' sums in qkv_acc: the norm's scale, the bias and RoPE, rounded to
// bf16 where the math reads them -- q into the stage's q rows, k and v into its last row and into the
// caches. An item is two adjacent dimensions and their partners half a head away (both halves of two
// rotations). All consumers, after the tile's `ready`; a consumer barrier must follow.
template <int D>
__device__ void finish_qkv(const StepParams& p, const StepOpArgs& op, const AttnChunk& c, bf16* ks, bf16* vs,
                           bf16* qs, int ct, int stride, const RopePair& rp) {
  constexpr int kHalf = D / 2, kItems = D / 4;  // items per head
  const int b = c.pair / p.num_kv_heads, h = c.pair - b * p.num_kv_heads, G = p.group, pos = c.len - 1;
  const int nq = (c.flags & kSegFirst) ? G * kItems : 0, n = nq + (holds_new_row(c) ? 2 * kItems : 0);
  if (ct >= n) return;
  const float* row = p.qkv_acc + int64_t(b) * p.qkv_cols;
  const float rstd = rsqrtf(__fdividef(__ldcg(p.qkv_ss + 4 * b), float(p.hidden)) + p.eps);
  for (int it = ct; it < n; it += stride) {
    int col, j;  // the head's first column in q|k|v, the item's first dimension
    bf16* dst;   // the head's row in the stage
    bool rope = true;
    if (it < nq) {
      const int g = it / kItems;
      j = 2 * (it - g * kItems);
      col = (h * G + g) * D;
      dst = qs + g * D;
    } else {
      const int kv = (it - nq) / kItems;  // 0: k, 1: v
      j = 2 * (it - nq - kv * kItems);
      col = p.q_dim + (kv * p.num_kv_heads + h) * D;
      dst = (kv == 0 ? ks : vs) + (c.ntok - 1) * D;
      rope = kv == 0;
    }
    const float2 lo = __ldcg(reinterpret_cast<const float2*>(row + col + j));
    const float2 hi = __ldcg(reinterpret_cast<const float2*>(row + col + j + kHalf));
    float a0 = lo.x * rstd, a1 = lo.y * rstd, b0 = hi.x * rstd, b1 = hi.y * rstd;
    if (op.bias) {
      const float2 ba = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(op.bias + col + j));
      const float2 bb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(op.bias + col + j + kHalf));
      a0 += ba.x, a1 += ba.y, b0 += bb.x, b1 += bb.y;
    }
    if (rope) rotate(rp, 0, a0, b0), rotate(rp, 1, a1, b1);
    const __nv_bfloat162 lo2 = __floats2bfloat162_rn(a0, a1), hi2 = __floats2bfloat162_rn(b0, b1);
    *reinterpret_cast<__nv_bfloat162*>(dst + j) = lo2;
    *reinterpret_cast<__nv_bfloat162*>(dst + j + kHalf) = hi2;
    if (it >= nq) {
      bf16* cache = (col < p.q_dim + p.num_kv_heads * D ? op.k_cache : op.v_cache) +
                    (kv_row(p, b, pos) + int64_t(h) * kv_head_stride(p)) * D;
      *reinterpret_cast<__nv_bfloat162*>(cache + j) = lo2;
      *reinterpret_cast<__nv_bfloat162*>(cache + j + kHalf) = hi2;
    }
  }
}

// A tile's partial segments are recorded with the tile's tag: warps of a tile run a segment each
// (SegmentRoundRobin) record theirs while others may still be on the tile before, so nothing resets them.
__device__ __forceinline__ uint64_t attention_tag(uint32_t epoch, int32_t id) {
  return (uint64_t(epoch) << 32) | uint32_t(id);
}

// A segment run by one warp (SegmentRoundRobin), at its last stage: its output, or its partial (normalised, with
// its log2-sum-exp, as combine_segment writes them). Accumulators o[4jb .. 4jb + 3][e] are dimensions
// 4q .. 4q + 3 of row g, q = 4 tq + 16 (jb / 2) + jb % 2 + 2e; the quad's lanes hold parts of the row's sum.
template <int D>
__device__ void finish_segment_warp(const StepParams& p, StepShared& sh, const AttnChunk& c, int tile, uint64_t tag,
                                    const float (&o)[D / 8][4], float m, float l, int lane, const StepOpArgs& op) {
  const int G = p.group, g = lane / 4, tq = lane % 4;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  const bool whole = (c.flags & kWhole) != 0;
  const int which = (c.flags & kWhich) ? 1 : 0;
  const int b = c.pair / p.num_kv_heads, h = c.pair - b * p.num_kv_heads;
  const int64_t part = 2 * int64_t(tile) + which;
  const ActLayout act{p.act_rows};
  if (g < G) {
    const float f = __fdividef(1.f, l);
#pragma unroll
    for (int jb = 0; jb < D / 32; ++jb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int q = 4 * tq + 16 * (jb / 2) + jb % 2 + 2 * e;
        const float4 v = make_float4(f * o[4 * jb][e], f * o[4 * jb + 1][e], f * o[4 * jb + 2][e], f * o[4 * jb + 3][e]);
        if (whole) store_bf16x4(op.out + act.index(b, (h * G + g) * D + 4 * q), v.x, v.y, v.z, v.w);
        else *reinterpret_cast<float4*>(&p.o_part[(part * G + g) * D + 4 * q]) = v;
      }
    if (!whole && tq == 0) p.lse_part[part * G + g] = m + log2f(l);
  }
  if (!whole && lane == 0) sh.part[which] = c, sh.part_tag[which] = tag;
}

// Returns whether the tile wrote what others read: attention outputs (a whole pair's, or a merge's),
// which the o_proj tiles read, or a new row of the caches, which later launches read. `held`: the ring
// slot of the tile's last stage where the warps share the stages, for the caller to free after the
// tile's publication (-1: no stage, or a segment per warp, whose warps free their own).
template <class Cfg, int D>
__device__ bool attention_tile(const Ring<Cfg>& ring, PipeState<Cfg>& ps, StepShared& sh, float* scratch,
                               const StepParams& p, const StepOpArgs& op, const DeviceTile& t, int32_t id, int count,
                               bool by_warp, uint64_t* ready, uint32_t ready_phase, int ct, uint32_t epoch,
                               int& held) {
  constexpr int kStageTokens = attention_tokens(Cfg::kStageBytes, D);
  const int lane = ct % 32, warp = ct / 32, g = lane / 4, tq = lane % 4;
  kernels::decode_detail::QFrags<D, 1, false> qa;
  float o[D / 8][4];
  float m[1] = {-INFINITY}, l[1] = {0.f};  // one row block: the step's groups are at most 8 heads
  static_assert(Cfg::kStageBytes >= 8 * kMaxGroup * D * 4, "combine_segment's sums fit a stage");
  bool wrote = false;
  const uint64_t tag = attention_tag(epoch, id);
  auto load_q = [&](const bf16* qs) {
    // q as A fragments (rows: the group's heads; rows >= G zero). k-step s = 2j + h pairs with
    // chunk t + 4j of a K row, half h (the permuted head dimension of attend_unit).
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const int d = 8 * (tq + 4 * (k / 2)) + 4 * (k % 2);
      qa.a[k][0] = g < p.group ? *reinterpret_cast<const uint32_t*>(qs + g * D + d) : 0u;
      qa.a[k][1] = g < p.group ? *reinterpret_cast<const uint32_t*>(qs + g * D + d + 2) : 0u;
    }
#pragma unroll
    for (int k = 0; k < D / 8; ++k) o[k][0] = o[k][1] = o[k][2] = o[k][3] = 0.f;
    m[0] = -INFINITY, l[0] = 0.f;
  };
  if (ct == 0) TW_STAGE_MARK(t.op, TW_STAGE_TILE, 4);
  // A tile run a segment per warp: each warp takes its own stages from its mail (take_mail), waits
  // for their data alone and releases each slot for all consumer warps; then it moves past the tile's
  // stages, as the producer. Otherwise every warp takes every stage in ring order.
  const PipeState<Cfg> ps0 = ps;
  if (kWarpSegments<Cfg> && by_warp) wrote = true;  // (the same in every thread: finish_tile's release order is ct 0's)
  for (int j = 0;; ++j) {  // j: the stage's index in the tile
    int s;
    uint32_t phase;
    if (kWarpSegments<Cfg> && by_warp) {
      const uint32_t mail = take_mail(sh, warp, lane);
      if (mail == kMailEnd) break;
      j = int(mail);
      const PipeState<Cfg> at = ps0.ahead(j);
      s = at.stage, phase = at.phase;
    } else {
      if (j >= count) break;
      s = ps.stage, phase = ps.phase;
    }
    if (lane == 0) TW_STAGE_MARK(t.op, j, 4 + 3 * warp);
    mbar_wait(&ring.full[s], phase, "full");
    if (lane == 0) TW_STAGE_MARK(t.op, j, 5 + 3 * warp);
    const AttnChunk c = sh.chunk[s];
    bf16* ks = reinterpret_cast<bf16*>(ring.w_atom(s, 0));
    bf16* vs = ks + kStageTokens * D;
    bf16* qs = vs + kStageTokens * D;
    if (kWarpSegments<Cfg> && by_warp) {  // this warp's stage (round_robin_next)
      if ((c.flags & kSegFirst) || holds_new_row(c)) {
        const RopePair rp = rope_pair(p, c.len - 1, rope_dims<D>(lane));
        mbar_wait(ready, ready_phase, "ready");
        finish_qkv<D>(p, op, c, ks, vs, qs, lane, 32, rp);
        __syncwarp();
      }
      if (c.flags & kSegFirst) load_q(qs);
      constexpr int kT = kernels::kDecodeStageTokens;
      for (int u = 0; u < kernels::decode_units(c.ntok); ++u)
        kernels::decode_detail::attend_unit<D, true>(qa, ks + u * kT * D, vs + u * kT * D, min(kT, c.ntok - u * kT),
                                                     p.scale_log2, o, m, l);
      if (c.flags & kSegLast) finish_segment_warp<D>(p, sh, c, t.tn, tag, o, m[0], l[0], lane, op);
      __syncwarp();
      if (lane == 0) TW_STAGE_MARK(t.op, j, 6 + 3 * warp);
      if (lane == 0)
        mbar_arrive(&ring.empty[s], Cfg::kConsumerWarps);
      continue;
    }
    if ((c.flags & kSegFirst) || holds_new_row(c)) {
      const RopePair rp = rope_pair(p, c.len - 1, rope_dims<D>(ct));
      mbar_wait(ready, ready_phase, "ready");  // the QKV tiles' sums are complete
      finish_qkv<D>(p, op, c, ks, vs, qs, ct, kConsumers, rp);
      consumer_sync();
      wrote |= holds_new_row(c);
      if (ct == 0 && j == 0) runtime::trace_mark(p.ep, id, runtime::kTraceMark1);
    }
    if (c.flags & kSegFirst) load_q(qs);
    const int units = kernels::decode_units(c.ntok);
    for (int u = (warp - c.unit0 % 8 + 8) % 8; u < units; u += 8) {
      const int valid = min(kernels::kDecodeStageTokens, c.ntok - u * kernels::kDecodeStageTokens);
      kernels::decode_detail::attend_unit<D, true>(qa, ks + u * kernels::kDecodeStageTokens * D,
                                                   vs + u * kernels::kDecodeStageTokens * D, valid, p.scale_log2, o, m, l);
    }
    ps.advance();
    if (c.flags & kSegLast) {  // the stage holds the warps' sums before it is released
      if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceMark2);
      combine_segment<D>(p, scratch, reinterpret_cast<float*>(ring.w_atom(s, 0)), c, t.tn, o, m[0], l[0], ct, op);
      if (!(c.flags & kWhole) && ct == 0) {
        const int which = (c.flags & kWhich) ? 1 : 0;
        sh.part[which] = c, sh.part_tag[which] = tag;
      }
      wrote |= (c.flags & kWhole) != 0;
    }
    __syncwarp();
    if (lane == 0) TW_STAGE_MARK(t.op, j, 6 + 3 * warp);
    if (j + 1 == count) held = s;  // released after the tile's publication (run_consumer)
    else if (lane == 0) mbar_arrive(&ring.empty[s]);
  }
  if (kWarpSegments<Cfg> && by_warp) {
    // Past the tile's stages. A parity wait tells apart only a barrier's current phase and the one
    // before, so before this warp waits on a slot's next use (the next tile's) the slot's last use in
    // this tile must have landed, else that wait would pass at once. Its release by its owner says so
    // (the owner waited for it), and that wait is exact: the use was armed before the end was posted,
    // so the release before it is done, and the next release needs this warp's arrive.
    for (int j = max(0, count - ps.count); j < count; ++j) {
      const PipeState<Cfg> at = ps0.ahead(j);
      mbar_wait(&ring.empty[at.stage], at.phase, "empty");
    }
    ps = ps0.ahead(count);
  }
  if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceComputed);
  if (ct == 0) TW_STAGE_MARK(t.op, TW_STAGE_TILE, 5);
  // The last tile to finish a pair merges it. The count is acq_rel: release, since the barrier
  // orders every thread's partial writes before the counting thread's RMW; acquire, then the barrier,
  // before anyone reads the other tiles' partials.
  consumer_sync();
  const bool has[2] = {sh.part_tag[0] == tag, sh.part_tag[1] == tag};
  if ((has[0] || has[1]) && !p.oproj_merges) {
    if (lane == 0 && warp < 2) {
      const AttnChunk pt = sh.part[warp];
      uint32_t last = 0;
      if (has[warp]) {
        cuda::atomic_ref<int, cuda::thread_scope_device> cnt(p.merge_count[pt.pair]);
        last = cnt.fetch_add(1, cuda::memory_order_acq_rel) == pt.tiles - 1;
        // Ready for the next layer and launch: the merge's release of the tile orders it.
        if (last) cnt.store(0, cuda::memory_order_relaxed);
      }
      sh.last[warp] = last;
    }
    consumer_sync();
    if (sh.last[0]) merge_pair<D>(p, scratch, sh.part[0], ct, op);
    if (sh.last[1]) merge_pair<D>(p, scratch, sh.part[1], ct, op);
    wrote |= sh.last[0] || sh.last[1];
  }
  return wrote;
}

// Embedding rows of the input tokens, columns [tn cols, (tn + 1) cols), into the residual stream
// (writer 0); the same columns of buffer 2 zeroed (see add_to_residual).
template <class Cfg>
__device__ void embed_tile(const StepParams& p, const StepOpArgs& o, const DeviceTile& t, int ct, uint32_t epoch) {
  const bool bf16 = bf16_stream<Cfg>(p);
  const int c0 = t.tn * o.cols, cols = min(o.cols, o.n - c0), vecs = cols / 8;
  float* x = residual_buffer(p, epoch, o.x_out);
  float* z = residual_buffer(p, epoch, o.x_out + 2);
  for (int i = ct; i < p.batch * vecs; i += kConsumers) {
    const int m = i / vecs, col = c0 + 8 * (i % vecs);
    const int tok = min(max(__ldcg(&p.tokens[m]), 0), p.embed_vocab - 1);  // the host checks; never read out of bounds
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p.embed + int64_t(tok) * p.hidden + col));
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v);
    const float2 a = __bfloat1622float2(h2[0]), b = __bfloat1622float2(h2[1]), c = __bfloat1622float2(h2[2]),
                 d = __bfloat1622float2(h2[3]);
    const int at = residual_at(p, m, col);  // 8 columns in one block
    *reinterpret_cast<float4*>(x + at) = make_float4(a.x, a.y, b.x, b.y);
    *reinterpret_cast<float4*>(x + at + 4) = make_float4(c.x, c.y, d.x, d.y);
    *reinterpret_cast<float4*>(z + at) = make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(z + at + 4) = make_float4(0.f, 0.f, 0.f, 0.f);
    if (bf16) *reinterpret_cast<uint4*>(stream_bf16(p, epoch, o.x_out) + ActLayout{p.act_rows}.index(m, col)) = v;
  }
  if (bf16) {  // the rows' sums of squares of the tile's atoms
    float* ss = stream_sums(p, epoch, o.x_out);
    const int a0 = c0 / 64, na = (cols + 63) / 64;
    for (int i = ct; i < p.batch * na; i += kConsumers) {
      const int m = i / na, a = a0 + i % na, tok = min(max(__ldcg(&p.tokens[m]), 0), p.embed_vocab - 1);
      const __nv_bfloat162* row = reinterpret_cast<const __nv_bfloat162*>(p.embed + int64_t(tok) * p.hidden);
      float sum = 0.f;
      for (int c = 64 * a; c < min(64 * a + 64, o.n); c += 2) {
        const float2 f = __bfloat1622float2(row[c / 2]);
        sum += f.x * f.x + f.y * f.y;
      }
      ss[int64_t(a) * p.batch + m] = sum;
    }
  }
}

// The greedy tokens; the lengths advance; the other parity's maxima are zeroed for the next launch
// (this launch's readers of them are done: the sample tile runs after every other tile).
__device__ void sample_tile(const StepParams& p, int ct, uint32_t epoch) {
  const int par = epoch & 1;
  if (ct < p.batch) {
    const unsigned long long key = __ldcg(p.maxima + par * p.batch + ct);
    const int32_t tok = int32_t(0xFFFFFFFFu - uint32_t(key));
    p.tokens[ct] = tok;
    if (p.history) p.history[int64_t(epoch % uint32_t(p.history_len)) * p.batch + ct] = tok;
    if (!p.active || p.active[ct]) p.seq_lens[ct] += 1;
    p.maxima[(1 - par) * p.batch + ct] = 0ull;
  }
}

// An all-reduce tile (tensor parallelism, collectives in the launch): this rank's o_proj / down tiles
// of 128 stream columns (or its LM head tiles, for the max-reduce: x_out < 0) have added their parts
// into every rank's buffer (`ready`, acquired at GPU scope). One thread says so to every rank -- a
// system-scope fence, cumulative, so those adds are visible to whoever sees the flag after it -- then
// waits for every rank's flag of the tile: the sum is then in this rank's own buffer. Buffer reuse: a
// rank's writer g tiles add into every rank's buffer g % 4 only after its all-reduce of writer g - 1,
// which waited for every rank's flags of g - 1, raised after each rank's writer g - 1 tiles -- and those
// come after its writer g - 2 tiles, whose slice 0 zeroed its buffer g % 4. (The maxima the same way,
// by step parity: the sample tile zeroes them.) The publish goes before the wait: no two ranks wait on
// each other.
__device__ void all_reduce_tile(const StepParams& p, const StepOpArgs& o, const DeviceTile& t, int ct, uint32_t epoch) {
  if (ct != 0) return;
  // The instance number; the max-reduce comes after every writer of the step, so that a flag's values
  // only grow: a wait passes on a later instance's flag, and numbered 0 it would have passed on the
  // step's stream all-reduces of the same slot, raised before it.
  const uint32_t g = epoch * uint32_t(p.writers) + uint32_t(o.x_out < 0 ? p.writers : o.x_out), value = g + 1;
  const int64_t row = (int64_t(g % kResidualBuffers) * p.flag_tiles + t.tn) * p.ranks;
  asm volatile("fence.acq_rel.sys;\n" ::: "memory");  // one fence, then relaxed stores (a release each cost a fence each)
  for (int q = 0; q < p.ranks; ++q)
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;\n" ::"l"(on_rank(p, q, p.flags) + row + p.rank), "r"(value) : "memory");
  uint32_t polls = 0;
  for (int q = 0; q < p.ranks; ++q)
    for (;;) {
      uint32_t v;
      asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p.flags + row + q) : "memory");
      if (int32_t(v - value) >= 0) break;
      if (p.ep.spin_limit && ++polls > p.ep.spin_limit) {
        atomicExch(&p.ep.state->error, 1u);
        break;
      }
      __nanosleep(64);
    }
}

// Batches above 32 (step_bf16_stream): after an o_proj or down tile's reductions, the last of its K
// slices to arrive (acquire: the others' reductions are in) reads its 128 columns of the stream back
// and writes them as bf16 in the act layout, and each row's sums of squares per 64-column atom -- what
// the norm consumers then copy like any activations and sum. Thread ct's items i = ct + 256 k: row
// i / 32, columns 4 (i % 32) of the block, so a warp's lanes 0-15 and 16-31 each hold one atom's row.
__device__ void stream_block_to_bf16(const StepParams& p, StepShared& sh, const StepOpArgs& o, const DeviceTile& t, int ct,
                                     uint32_t epoch) {
  consumer_sync();  // every thread's reductions are issued
  if (ct == 0) {
    if (split_slice(o, t)) {
      sh.flag = runtime::arrive_last(p.ep, epoch, t, o.split);
    } else {
      __threadfence();
      sh.flag = 1;
    }
  }
  consumer_sync();
  if (!sh.flag) return;
  const float* y = residual_buffer(p, epoch, o.x_out);
  bf16* xa = stream_bf16(p, epoch, o.x_out);
  float* ss = stream_sums(p, epoch, o.x_out);
  const ActLayout act{p.act_rows};
  const int c0 = t.tn * kTileRows, items = p.batch * (kTileRows / 4);  // whole warps: 32 items a row
  // kLoads loads in flight before the first store: a load after a store is not hoisted past it (the
  // compiler cannot tell the bf16 copy from the stream), and alternating them cost B / 8 dependent L2
  // round trips per thread, on the critical path of the next norm consumer.
  constexpr int kLoads = 4;
  for (int i0 = ct; i0 < items; i0 += kLoads * kConsumers) {
    float4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int i = i0 + j * kConsumers, m = i / (kTileRows / 4), col = c0 + 4 * (i % (kTileRows / 4));
      v[j] = i < items && col < o.n ? __ldcg(reinterpret_cast<const float4*>(y + residual_at(p, m, col)))
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int i = i0 + j * kConsumers, m = i / (kTileRows / 4), col = c0 + 4 * (i % (kTileRows / 4));
      if (i >= items) break;  // warp-uniform: items and kConsumers are multiples of 32
      if (col < o.n) store_bf16x4(xa + act.index(m, col), v[j].x, v[j].y, v[j].z, v[j].w);
      float sum = v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
#pragma unroll
      for (int off = 1; off < 16; off *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (i % 16 == 0 && (col >> 6) < p.x_atoms) ss[int64_t(col >> 6) * p.batch + m] = sum;
    }
  }
}

// Batches above 32: a norm consumer's K slice's sums of squares per row (sh.rstd, as the staged
// mainloop leaves them), from its input's sums per atom. After `ready`.
template <class Cfg>
__device__ __forceinline__ void slice_sums_of_squares(const StepParams& p, StepShared& sh, const StepOpArgs& o,
                                                      const DeviceTile& t, int ct, uint32_t epoch) {
  if (ct >= p.batch) return;
  const int a0 = o.slice_start[t.ks] * Cfg::kKAtoms;
  const int a1 = min(o.slice_start[t.ks + slices_of(o, t)] * Cfg::kKAtoms, p.x_atoms);
  const float* ss = stream_sums(p, epoch, o.x_in) + ct;
  float v = 0.f;
  for (int a = a0; a < a1; ++a) v += __ldcg(ss + int64_t(a) * p.batch);
  sh.rstd[ct] = v;
}

template <class Cfg, int D>
__device__ void run_consumer(const Ring<Cfg>& ring, StepShared& sh, float* scratch, const StepParams& p) {
  const int ct = threadIdx.x - 128;
  PipeState<Cfg> ps;
  int qs = 0;
  uint32_t qphase = 0;
  for (;;) {
    mbar_wait(&sh.full[qs], qphase, "queue full");
    const DeviceTile t = sh.tile[qs];
    const int32_t id = sh.id[qs], count = sh.count[qs];
    if (t.op < 0) break;
    const uint32_t epoch = sh.slots.epoch;  // written before the producer's first queue entry
    const StepOpArgs& o = p.ops[t.op];
    if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceStarted);
    switch (o.kind) {
      case kQkv:
      case kResidual:
      case kGateUp:
      case kLmHead: {
        float acc[Cfg::kAcc];  // scoped here: not live in the other kinds' code
        const bool bf16 = bf16_stream<Cfg>(p);
        consume_weight_tile<Cfg, D>(ring, ps, sh, p, o, t, ct, acc, o.kind != kResidual && !bf16, &sh.ready[qs], qphase);
        if (ct == 0) runtime::trace_mark(p.ep, id, runtime::kTraceComputed);
        mbar_wait(&sh.ready[qs], qphase, "ready");
        if (o.kind != kResidual && bf16) slice_sums_of_squares<Cfg>(p, sh, o, t, ct, epoch);
        if (o.kind == kResidual) {
          add_to_residual<Cfg>(p, o, t, acc, ct, epoch);
          if (bf16) stream_block_to_bf16(p, sh, o, t, ct, epoch);
          finish_tile(p, t, id, ct, bf16);  // the stream is read with ordinary loads, its copy by bulk copies
        } else if (o.kind == kQkv) {
          finish_qkv_tile<Cfg>(p, sh, o, t, id, acc, ct);
        } else {
          finish_norm_tile<Cfg>(p, sh, scratch, o, t, id, acc, ct, epoch);
        }
        break;
      }
      case kAttention:
      {
        int held = -1;
        const bool wrote = attention_tile<Cfg, D>(ring, ps, sh, scratch, p, o, t, id, count, sh.by_warp[qs],
                                                  &sh.ready[qs], qphase, ct, epoch, held);
        mbar_wait(&sh.ready[qs], qphase, "ready");
        // Partials only, or nothing: a relaxed count (finish_tile); but where o_proj merges the pairs
        // (oproj_merges) it reads the partials themselves after its acquire of this count.
        finish_tile(p, t, id, ct, wrote, wrote || p.oproj_merges ? cuda::memory_order_release : cuda::memory_order_relaxed);
        // The last stage's slot, held through the pair count and the release: a gpu-scope fence waits
        // for every copy the SM has in flight, and the producer refills a freed slot at once.
        if (held >= 0 && ct == 0) mbar_arrive(&ring.empty[held], Cfg::kConsumerWarps);
        break;
      }
      case kEmbed:
        mbar_wait(&sh.ready[qs], qphase, "ready");
        embed_tile<Cfg>(p, o, t, ct, epoch);
        finish_tile(p, t, id, ct, bf16_stream<Cfg>(p));
        break;
      case kAllReduce:
        mbar_wait(&sh.ready[qs], qphase, "ready");
        all_reduce_tile(p, o, t, ct, epoch);
        finish_tile(p, t, id, ct, false);  // the stream and the keys are read with ordinary loads
        break;
      default:  // kSample
        mbar_wait(&sh.ready[qs], qphase, "ready");
        sample_tile(p, ct, epoch);
        finish_tile(p, t, id, ct);
        break;
    }
    if (((p.hold_kinds >> o.kind) & 1) && ct == 0) mbar_arrive(&sh.released);  // after its release (run_producer)
    // The queue slot is free once every consumer warp is past its `ready` wait.
    __syncwarp();
    if (ct % 32 == 0) mbar_arrive(&sh.empty[qs]);
    if (++qs == kQueue) qs = 0, qphase ^= 1;
  }
}
#endif  // TW_SM90_ENABLED

template <class Cfg, int D>
__global__ void __launch_bounds__(kThreads, 1) decode_step_kernel(const __grid_constant__ StepParams p) {
#if TW_SM90_ENABLED
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ StepShared sh;
  const Ring<Cfg> ring = Ring<Cfg>::carve(smem);
  // Past the ring (its base is 1024-B aligned, so the offset is a constant), by pointer arithmetic: see
  // Ring::carve. Except at 256 rows and D = 128, through an integer: there the generic pointer takes the
  // spills from 4952 to 2076 B a thread and the step 3.3-4.4% faster (Llama-3-8B B = 200 / 256, Qwen2-7B
  // B = 160; H200, session 29); at D = 64 it read 2.2% slower (Llama-3.2-1B B = 256).
  float* scratch;
  if constexpr (Cfg::kMPad >= 256 && D == 128)
    scratch = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(ring.flag + 4) + 127) & ~uintptr_t(127));
  else
    scratch = reinterpret_cast<float*>(ring.base + ((Cfg::kSmemBytes - 1024 + 127) & ~127));
  if (threadIdx.x == 0) {
    ring.init();
    for (int i = 0; i < kQueue; ++i) {
      mbar_init(&sh.full[i], 1);
      mbar_init(&sh.empty[i], Cfg::kConsumerWarps);
      mbar_init(&sh.ready[i], 1);
    }
    mbar_init(&sh.released, 1);
    sh.part_tag[0] = sh.part_tag[1] = ~0ull;  // no tile's (a tag's low half is a ticket id, >= 0)
    for (int w = 0; w < 8; ++w) {
      sh.posted[w] = sh.taken[w] = 0;
      for (int i = 0; i < kMail; ++i) sh.mail[w][i] = 0xffff0000u;  // post 0xffff's: no entry before the ring's first wrap
    }
    ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    runtime::first_ticket(p.ep, sh.slots);  // the epoch is read by the producer, after the grid wait
    // The next kernel in the stream (the next step) may start as soon as SMs free up: its blocks only
    // take SMs this launch's blocks have left.
    runtime::allow_next_launch();
  }
  __syncthreads();
  const int warp = threadIdx.x / 32;
  if (warp < 4) {
    setmaxnreg_dec<88>();
    if (warp == 0) run_producer<Cfg, D>(ring, sh, p);
  } else {
    setmaxnreg_inc<208>();
    runtime::grid_dependency_wait();  // the consumers' reads and writes come after the previous kernel
    run_consumer<Cfg, D>(ring, sh, scratch, p);
  }
  runtime::end_launch(p.ep, sh.slots);
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without wgmma: the host never dispatches here
#endif
}

// ---- host ----

// The kernel for R activation rows, dispatched at run time.
template <int D, class F>
void with_kernel(int act_rows, F&& f) {
#ifdef TW_STEP_ONLY_ROWS  // development builds: one configuration (the others throw)
  if (act_rows != TW_STEP_ONLY_ROWS) throw InvalidArgument("decode step: this build has only " + std::to_string(TW_STEP_ONLY_ROWS) + " activation rows");
  f(StepConfig<TW_STEP_ONLY_ROWS>{}, decode_step_kernel<typename StepConfig<TW_STEP_ONLY_ROWS>::Cfg, D>);
#else
  switch (act_rows) {
    case 8: f(StepConfig<8>{}, decode_step_kernel<typename StepConfig<8>::Cfg, D>); break;
    case 16: f(StepConfig<16>{}, decode_step_kernel<typename StepConfig<16>::Cfg, D>); break;
    case 32: f(StepConfig<32>{}, decode_step_kernel<typename StepConfig<32>::Cfg, D>); break;
    case 64: f(StepConfig<64>{}, decode_step_kernel<typename StepConfig<64>::Cfg, D>); break;
    case 128: f(StepConfig<128>{}, decode_step_kernel<typename StepConfig<128>::Cfg, D>); break;
    case 256: f(StepConfig<256>{}, decode_step_kernel<typename StepConfig<256>::Cfg, D>); break;
    default: throw InvalidArgument("decode step: no kernel for " + std::to_string(act_rows) + " activation rows");
  }
#endif
}

// Dynamic shared memory of the kernel for R rows; sets its attribute once and checks that the static
// and dynamic shared memory together fit one SM.
template <int D>
int prepare_kernel_for(int act_rows) {
  int bytes = 0;
  with_kernel<D>(act_rows, [&](auto cfg, auto kernel) {
    using Config = decltype(cfg);
    static const bool once = [&] {
      TW_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Config::kSmemBytes));
      cudaFuncAttributes attr{};
      TW_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
      int dev = 0, optin = 0;
      TW_CUDA_CHECK(cudaGetDevice(&dev));
      TW_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
      if (int(attr.sharedSizeBytes) + Config::kSmemBytes > optin)
        throw InvalidArgument("decode step: " + std::to_string(attr.sharedSizeBytes) + " B static + " +
                              std::to_string(Config::kSmemBytes) + " B dynamic shared memory exceed the SM's " +
                              std::to_string(optin));
      return true;
    }();
    (void)once;
    bytes = Config::kSmemBytes;
  });
  return bytes;
}

template <int D>
void launch_for(const StepParams& p, int grid, bool overlap, cudaStream_t stream) {
  with_kernel<D>(p.act_rows, [&](auto cfg, auto kernel) {
    runtime::launch_kernel(kernel, dim3(grid), dim3(kThreads), decltype(cfg)::kSmemBytes, stream, overlap, p);
  });
}

}  // namespace tw::step
