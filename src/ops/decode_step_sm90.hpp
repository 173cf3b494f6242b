// The decode step's executor kernel as DecodeStep (decode_step.cu) drives it: one persistent launch
// whose tiles dispatch by op kind (decode_step_kernel.cuh). Internal to src/ops.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "tileweave/graph/step_graph.hpp"  // kOprojMergeCols
#include "tileweave/kernels/sm90/tile_shape.hpp"
#include "tileweave/runtime/exec_params.hpp"

namespace tw::step {

// What a tile of an op does (the graph's op kinds, with the GEMM epilogues told apart).
enum StepKind : int32_t {
  kEmbed = 0,   // embedding rows into the residual stream x0
  kQkv,         // x Wqkv^T: every K slice adds its part into qkv_acc (output tile 0's slices: the rows' sums of squares into qkv_ss)
  kAttention,   // the norm's scale, bias and RoPE on q|k|v, the new k and v appended to the caches, then
                // split-KV attention of the new tokens over the caches: O (act layout)
  kResidual,    // x' = x + a W^T (o_proj, down): every K slice adds its part into the residual stream
  kGateUp,      // h = silu(rmsnorm(x) Wg^T) * (rmsnorm(x) Wu^T): act layout
  kLmHead,      // logits = rmsnorm(x) Wlm^T: running maxima per row (and the logits, if kept)
  kSample,      // greedy tokens from the maxima; lengths advance; the other parity's maxima are zeroed
  kAllReduce,   // tensor parallelism, collectives in the launch: every rank's part of 128 stream columns
                // summed into this rank's stream (or every rank's LM-head keys, max)
};

// The residual stream is fp32 [B, hidden] in four rotating buffers. Its writers (embed, then o_proj
// and down of every layer: writer w = 0 .. 2L) number on across launches, g = epoch (2L + 1) + w, and
// writer g uses buffer g % 4, blocked by a stage's columns ([blocks][B][x_cols]: a stage's rows are
// one contiguous piece, one bulk copy). Its K slices add into it with fire-and-forget reductions (no split-K
// reduction, no last slice), slice 0 adding the residual it reads (writer g - 1's). The norm
// consumers (qkv, gate/up, LM head) get its rows with their weights (bulk copies into the stages'
// activation bytes), convert them to the act layout in place and take the rows' sums of squares. Buffer g % 4 must be zero when writer g starts:
// writer g's slice-0 tiles zero buffer (g + 2) % 4 (writer g - 2's, whose last readers -- writer
// g - 1's slice 0 and the norm consumer before it -- finished before writer g's inputs existed), and
// writer g + 2 runs after writer g's release through the chain of counters between them.
constexpr int kResidualBuffers = 4;

// 16-token units an attention tile takes at least, by default. At short contexts the attention is
// latency-bound: a pair cut over many tiles pays for many partials and a long merge, a pair on one
// tile for its units one after another. H200, B = 1, KV 1024, end to end (K/V bytes per tile at
// least 32 / 64 / 128 / 256 KiB): Llama-3.2-1B (D = 64: 8 / 16 / 32 / 64 units) 962.7 / 973.8 /
// 985.6 / 990.5 us; Llama-3-8B (D = 128: 4 / 8 / 16 / 32 units) 4529.7 / 4475.7 / 4499.1 / 4606.4 us.
// Counted in units, not bytes: 8 is best at both head dims.
constexpr int kMinAttentionUnits = 8;
constexpr int kMaxSlices = 64;  // split-K slices per op (the slice table travels with the op)
constexpr int kThreads = 384;   // one producer warpgroup + two consumer warpgroups
constexpr int kMaxRows = sm90::kMaxActRows;  // activation rows R (the per-row tables' size)
constexpr int kMaxRanks = 8;                 // tensor-parallel ranks with collectives in the launch
constexpr int kMaxGroup = 8;  // query heads per KV head: one mma row block (the standalone attention takes 16)

// Activations that a weight tile reads are kept in its operand layout (the "act layout"): per 64-column
// atom, R rows of 128 bytes with the 128-byte swizzle (16-byte chunk j of row m at j ^ (m % 8)), R =
// the tile's activation rows. A stage's activations are then one contiguous bulk copy per atom, like
// the packed weights; rows >= batch stay zero (written by nobody).
struct ActLayout {
  int32_t rows;  // R
  __host__ __device__ int64_t index(int m, int col) const {
    const int atom = col >> 6, c = col & 63;
    return (int64_t(atom) * rows + m) * 64 + (((c >> 3) ^ (m & 7)) << 3) + (c & 7);
  }
};

// One op of the step, in device memory (read per tile).
struct StepOpArgs {
  int32_t kind;
  int32_t n;            // output columns (gate/up: h columns; qkv: q|k|v columns)
  int32_t k;            // input columns (the norm's mean divides by it)
  int32_t grid_n;       // output tiles
  int32_t split;        // K slices
  int32_t packed_atoms; // 64-column atoms per packed weight tile (= atoms of the act-layout input)
  int32_t cols;         // embed: columns per tile
  int32_t x_in, x_out;  // residual-stream writers read (norm consumers; residual writers' slice 0) and written, or -1
  int32_t zero_elems;   // o_proj: floats of `zero` its slice-0 tiles zero between them (qkv_acc and qkv_ss)
  int32_t merges;       // o_proj where StepParams::oproj_merges: its consumers merge its input's split pairs
  const __nv_bfloat16* w;    // packed weights
  const __nv_bfloat16* act;  // input (act layout) of o_proj and down
  float* zero;
  float* ws;                 // split-K partials of gate/up or the LM head (one block per output tile, fragment
                             // order), then [grid_n][R] partial sums of squares of its input rows
  const __nv_bfloat16* bias;      // attention: the q|k|v bias [q_dim + 2 kv_dim] or null
  __nv_bfloat16* out;             // act layout
  __nv_bfloat16* k_cache;         // attention: read, and the new row appended
  __nv_bfloat16* v_cache;
  int16_t slice_start[kMaxSlices + 1];  // first K stage of each slice
};

struct StepParams {
  runtime::ExecParams ep;
  const StepOpArgs* ops;
  int32_t batch, act_rows;  // B, R
  int32_t hidden, vocab;
  int32_t q_dim, num_kv_heads, group;  // group = query heads per KV head
  float eps, scale_log2;                       // RMSNorm epsilon, softmax scale * log2(e)
  // KV cache of one layer: contiguous [B, Hkv, max_seq_len, D], or paged [pages, Hkv, page_size, D]
  // with page_table [B, pages_per_seq] (null: contiguous).
  int64_t max_seq_len;
  int32_t page_size, pages_per_seq;
  const int32_t* page_table;
  // Attention: work tiles per layer, each tile's partial results (2 slots) and the merge counts.
  int32_t attn_tiles;
  int32_t attn_min_units;  // 16-token units a tile takes at least (fewer tiles at short contexts)
  int32_t hold_kinds;  // a mask of StepKinds: after such a tile its SM issues nothing more until it has published
  int32_t attn_warp_segments;  // tiles of at least this many segments run one per consumer warp (0: none)
  float* o_part;      // [attn_tiles][2][group][D]
  float* lse_part;    // [attn_tiles][2][group]
  int32_t* merge_count;  // [B * Hkv], zero between launches
  // Small batches (DecodeStepOptions::oproj_merge_max_batch): no attention tile counts or merges a
  // split pair; o_proj's consumers merge the partials of their K slice's heads (merge_slice). 0: the
  // last tile of a pair merges it.
  int32_t oproj_merges;
  // Step state: input tokens (overwritten with the sampled ones), cache lengths before the step
  // (advanced by the sample tile), which sequences advance (null: all), sampled-token history.
  int32_t* tokens;
  int32_t* seq_lens;
  const int32_t* active;
  int32_t* history;  // [history_len][B] by launch epoch, or null
  int32_t history_len;
  const __nv_bfloat16* embed;     // [embed_vocab, hidden]
  int32_t embed_vocab;            // the whole model's vocabulary (the table is whole on every rank)
  // Tensor parallelism (one rank's step, DecodeStepOptions::tp): o_proj and down add the residual on
  // rank 0 only (add_residual), so the all-reduce of the ranks' parts adds it once; the LM head's keys
  // carry the rank's first vocabulary row (vocab_offset; vocab is the rank's block); and a launch
  // between collectives first counts the collective before it done on its tiles' counters
  // (signal_tiles: its tile ids, bumped by block 0 after the grid dependency wait, i.e. after the
  // collective on the stream has finished).
  int32_t add_residual;
  int32_t vocab_offset;
  const int32_t* signal_tiles;
  int32_t num_signal_tiles;
  // Collectives inside the launch (DecodeStepOptions::collectives_in_launch), pushed: the residual
  // stream's buffers (xres), the maxima and the all-reduce flags of every rank live in its exchange
  // region, [xres | maxima | flags] at the same offsets on every rank; rank q's is at region[q] (this
  // process's pointers: NCCL's LSA pointers to the ranks' windows, or the other ranks' regions on one
  // GPU). o_proj and down add their parts into every rank's stream buffer (red.add, NVLink's atomics
  // across GPUs) and the LM head its keys into every rank's maxima (atomicMax); an all-reduce tile
  // then only says that this rank's parts of its columns are in (a flag in every rank's region) and
  // waits until every rank has said so: the sum is in its own buffer. Flag (slot, tile, q) holds the
  // number + 1 of the last all-reduce instance rank q's parts of that tile are in for; instance g =
  // epoch * writers + w (the writer w it completes; w = writers: the max-reduce, after them all, so a
  // flag's values grow in time) uses slot g % 4, the stream buffer of writer g. push = 0: none of this
  // (one rank, or collectives between launches).
  int32_t push;
  uint32_t* flags;
  int32_t rank, ranks, flag_tiles;
  char* region[kMaxRanks];
  unsigned long long* maxima;     // [2][B] (value, index) keys by launch parity
  float* logits;                  // [B, vocab] or null
  float* xres;                    // kResidualBuffers x [x_blocks][B][x_cols] fp32 residual stream
  int32_t x_cols, x_blocks;       // the stream's column blocks: a norm consumer's stage columns
  int32_t writers;                // residual-stream writers per launch (2L + 1)
  // Batches above 32 (step_bf16_stream): each residual buffer's bf16 copy in the act layout (R rows),
  // written by the last K slice of each writer tile (the embedding's tiles: theirs), and its rows' sums
  // of squares per 64-column atom: xa [4][xa_stride], xss [4][x_atoms][B]. The norm consumers copy xa
  // like any activations and sum their K slice's atoms of xss.
  int32_t bf16_stream;
  __nv_bfloat16* xa;
  int64_t xa_stride;
  float* xss;
  int32_t x_atoms;
  // q|k|v of the layer as the QKV tiles' K slices add them (red.add): [B][qkv_cols] fp32 sums of x Wᵀ
  // before the norm's scale, the bias and RoPE, which the attention applies (a rotation and a scale are
  // linear, but the scale needs every slice's sums of squares, so no QKV tile can finish a row: there is
  // no split-K reduction and no last slice). qkv_ss [B][4]: the rows' sums of squares (element 0),
  // added by the slice tiles of output tile 0. One buffer for every layer: o_proj's slice-0 tiles zero
  // it (StepOpArgs::zero) after the attention's tiles read it (o_proj waits for all of them) and before
  // the next layer's QKV tiles add (they wait for down, which waits for gate/up, which waits for o_proj).
  float* qkv_acc;
  float* qkv_ss;
  // Tiles of 8-32 rows: zeros for the 1-2 atoms a tile's last 3- or 4-atom stage may lack (its packed
  // weights are rounded to 2 atoms), 2 atoms of kTileRows x 64 bf16.
  const __nv_bfloat16* zero_atoms;
  int32_t qkv_cols;               // q_dim + 2 kv_dim
  float inv_freq[64];             // RoPE: angle_i = pos * inv_freq[i], i < D/2
};

// The kernels, one translation unit per head dim (decode_step_d64.cu, decode_step_d128.cu): the
// dynamic shared memory for R activation rows (sets the function attribute once), and the launch.
int prepare_kernel_d64(int act_rows);
int prepare_kernel_d128(int act_rows);
void launch_d64(const StepParams& p, int grid, bool overlap, cudaStream_t stream);
void launch_d128(const StepParams& p, int grid, bool overlap, cudaStream_t stream);

}  // namespace tw::step
