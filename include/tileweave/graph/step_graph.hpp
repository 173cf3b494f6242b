// A whole decode step of a Llama/Qwen2-family model as one tile graph: embedding, per layer the
// QKV projection (input RMSNorm folded in, RoPE and the KV-cache append in its epilogue), split-KV
// attention, o_proj + residual, gate/up + SiLU*mul (post-attention RMSNorm folded in), down +
// residual, then the LM head (final norm folded in) and greedy sampling. The traffic model simulates
// it; the GPU decode step (ops/decode_step.hpp) runs the same graph in one persistent launch.
//
// RMSNorm without a grid-wide barrier: the norm's weight is folded into the columns of the weight
// that follows it, and the residual-writing epilogues (embedding, o_proj, down) accumulate the sums
// of squares of the rows they write into a stats tensor [B, 1]; the consumer, which reads whole rows
// and so waits for all their writers anyway, scales its output rows by rsqrt(stats / d + eps).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "tileweave/graph/attention_graph.hpp"
#include "tileweave/graph/tile_graph.hpp"
#include "tileweave/kernels/sm90/tile_shape.hpp"
#include "tileweave/llm/config.hpp"
#include "tileweave/order/schedule.hpp"
#include "tileweave/runtime/exec_plan.hpp"

namespace tw {

// The batch and the KV cache a step runs on.
struct DecodeStepShape {
  int batch = 1;
  KvLayout layout = KvLayout::Contiguous;
  int64_t max_seq_len = 4096;  // tokens one sequence's cache holds (paged: pages per sequence * page size)
  int page_size = 16;          // paged: tokens per page, a multiple of 16
  int num_pages = 0;           // paged: pages in each layer's pool (0: batch * pages per sequence)
  // Tensor-parallel ranks: > 1, the graph is one rank's (its config is the rank's shard,
  // tensor_parallel_shard) and o_proj and down write the rank's part of the stream, which an
  // all-reduce op sums into the stream.
  int tp = 1;
  int pages_per_seq() const { return static_cast<int>((max_seq_len + page_size - 1) / page_size); }
  int pool_pages() const { return num_pages > 0 ? num_pages : batch * pages_per_seq(); }
  // The attention op's shape for config c (RoPE is not the standalone attention's: the step kernel's
  // attention tiles apply it, after the norm's scale, to the QKV slices' sums).
  DecodeAttentionShape attention(const ModelConfig& c) const;
};

// How a norm consumer (qkv, gate/up, LM head) gets its activations, and the weight tiles' activation
// rows R. Up to 32 rows: its stage receives the fp32 rows of the residual stream in its activation
// bytes (R rows of bf16) and converts them in place, so R >= 2B -- no hop between the stream's writers
// and its readers. Above 32 rows (one GPU): the last K slice of each writer tile converts its columns
// of the stream to bf16 in the act layout with the rows' partial sums of squares (bf16 stream), and the
// consumers copy those like any activations, R >= B: at B = 64, R = 2B had halved a stage's weights
// and K columns, doubled the wgmma's N and put a conversion between two barriers in every stage.
// Measured on the H200 (decode_step_bf16_stream_ab.json): Llama-3-8B B = 64 -30%, Qwen2-7B B = 100
// -53%, Llama-3.2-1B B = 64 -9.5%; at B = 32 the writers' extra hop cost Llama-3.2-1B 3.6% (8B
// -0.6%), hence the threshold. (Tensor parallelism keeps R = 2B: a rank's writer sees only its part
// before the all-reduce.)
// The largest batch: R >= B rows with the bf16 stream (one GPU), R >= 2B without it (tensor
// parallelism), R <= sm90::kMaxActRows.
constexpr int max_step_batch(int tp = 1) { return tp == 1 ? sm90::kMaxActRows : sm90::kMaxActRows / 2; }
// Throws InvalidArgument naming the batch when it is outside [1, max_step_batch(tp)].
void check_step_batch(int batch, int tp = 1);
constexpr bool step_bf16_stream(int batch, int tp = 1) { return batch > 32 && tp == 1; }
constexpr int step_act_rows(int batch, int tp = 1) {
  return sm90::act_rows_for((step_bf16_stream(batch, tp) ? 1 : 2) * int64_t(batch));
}

// The tilings of the step's ops, the same in every layer.
struct StepTiling {
  Tiling qkv, o_proj, gate_up, down, lm_head;
  // Gate/up column tiles [0, gate_up_whole) run their K slices as one ticket (run_slices_whole); the
  // rest, the last wave's, in gate_up.split_k slices (0: every tile as its slices say).
  int64_t gate_up_whole = 0;
  int attention_tiles = 0;  // work tiles of each layer's attention (P)
  int64_t embed_cols = 0;   // columns per embedding tile
};

// The planner: sm90 weight tiles (128 weight rows x step_act_rows), each op's K cut into as many
// slices as keep its tiles in one wave (no slice under two pipeline stages, none whose fp32 partial
// outweighs half its weights; at most 4 where the slices reduce, 8 where they add into a buffer --
// qkv, o_proj, down: step_graph.cpp says why), one attention tile per SM (the
// kernel uses fewer at short contexts: DecodeStepOptions::attention_min_tile_bytes).
// max_split > 0 caps every op's K slices (an experiment's knob; 0: the planner's). Gate/up of more
// tiles than SMs with a partial last wave: that wave's tiles in K slices where the slices' rounds
// cost under `last_wave_cost` of one unsplit tile, the whole waves' tiles unsplit (gate_up_whole; 0:
// never).
StepTiling plan_step_tiling(const ModelConfig& c, int batch, int sms, int max_split = 0, int tp = 1,
                            double last_wave_cost = 0.75);

struct StepGraph {
  TileGraph graph;
  struct Layer {
    int x = -1;  // the layer's input: the residual stream (fp32)
    int w_qkv = -1, b_qkv = -1, qkv = -1, k_cache = -1, v_cache = -1, attn = -1;
    int w_o = -1, x_mid = -1, w_gate_up = -1, h = -1, w_down = -1;
    int op_qkv = -1, op_attention = -1, op_o_proj = -1, op_gate_up = -1, op_down = -1;
    int op_o_proj_reduce = -1, op_down_reduce = -1;  // tp > 1: the all-reduces after o_proj and down
  };
  std::vector<Layer> layers;
  int tokens = -1, embed_table = -1, x_final = -1, w_lm = -1, logits = -1, maxima = -1, next = -1;
  int op_embed = -1, op_lm_head = -1, op_sample = -1;
  int op_maxima_reduce = -1;  // tp > 1: the all-reduce (max) of the LM head's per-row keys
};

// seq_lens: tokens in each sequence's cache before the step (the new token goes at that position);
// page_table [batch, pages_per_seq] when paged. InvalidArgument names the bad value.
StepGraph build_step_graph(const ModelConfig& c, const DecodeStepShape& s, const std::vector<int>& seq_lens,
                           const std::vector<int>& page_table, const StepTiling& t);

// Whether o_proj's consumers merge the attention's split pairs (DecodeStepOptions::oproj_merge_max_batch,
// the GPU kernel's merge_slice) instead of the last attention tile holding a part of each: batch <=
// max_batch, tiles of at most 32 activation rows, and batch x the columns of o_proj's widest K slice
// (whole stages) at most kOprojMergeCols, one float4 a consumer thread (two measured slower or spilled:
// docs/decode_step.md, session 36).
constexpr int kOprojMergeCols = 1024;
constexpr int kOprojMergeMaxBatch = 16;  // DecodeStepOptions::oproj_merge_max_batch's default
bool oproj_merges_pairs(const StepGraph& g, int batch, int max_batch = kOprojMergeMaxBatch);
// The columns of o_proj's widest K slice, in whole stages.
int64_t oproj_slice_cols(const StepGraph& g);

// How the executor synchronises the step: one counter per op (a consumer of a whole-row input waits
// for all of the op's tiles anyway, and the attention tiles' pair ranges change with the lengths),
// except per tile on gate/up, whose down slices each wait only for the h columns they read, and on
// o_proj and down under tensor parallelism, whose all-reduce tiles each read 128 columns.
std::map<int, SyncSpec> step_sync_policy(const StepGraph& g);

// Bytes a step must read at least: every weight once (ModelConfig::decode_weight_bytes) and the K/V
// of every sequence after its append.
int64_t step_floor_bytes(const ModelConfig& c, const std::vector<int>& seq_lens);

// The collectives of one tensor-parallel decode step over tp ranks (each rank runs the step of
// tensor_parallel_shard(c, tp)), per rank: an all-reduce (sum) of the fp32 stream [batch, hidden] after
// every layer's o_proj and down, and one all-reduce (max) of the LM head's per-row 64-bit (value,
// index) keys over the vocabulary blocks (an all-gather and a max in one). Ring algorithms: an
// all-reduce moves 2 (tp - 1) / tp of its message over each rank's link.
struct StepCollectives {
  int all_reduces = 0;
  int64_t all_reduce_bytes = 0;  // one message
  int max_reduces = 0;
  int64_t max_reduce_bytes = 0;  // one message
  int64_t link_bytes = 0;        // per rank, the whole step
};
StepCollectives step_collectives(const ModelConfig& c, int tp, int batch);

// A tensor-parallel rank's step runs as launches between its collectives: segment i's launch runs the
// tickets [begin, end) of schedule s; then its all-reduce op `collective` (whose tiles are the tickets
// [end, next segment's begin)) runs on the stream (NCCL, or a local sum on one GPU), and the next
// launch counts that op's tiles done before its own tiles wait on them. Any topological order works
// (a tile's producers are in its segment or an earlier one) as long as each collective's tiles are one
// run of tickets; InvalidArgument otherwise. One segment, no collective, when the graph has none.
struct StepSegment {
  int begin = 0, end = 0;
  int collective = -1;  // the AllReduce op after the launch, or -1 (the step's last segment)
};
std::vector<StepSegment> step_segments(const StepGraph& g, const Schedule& s);

}  // namespace tw
