// A whole decode step of a Llama/Qwen2-family model in one persistent launch of the tile executor:
// embedding, every layer (RMSNorm folded into the QKV, gate/up and LM-head weights; the QKV slices'
// sums finished -- norm scale, bias, RoPE -- and the KV-cache append by the attention's tiles; split-KV
// attention over the whole GPU; o_proj and down with the residual), the LM head and greedy sampling. The step's tile graph is graph/step_graph.hpp; the
// kernel dispatches each ticket to the tile body of its op kind (src/ops/decode_step_kernel.cuh).
//
// The state lives on the device, so steps run back to back with no host round trip (and may be
// captured in a CUDA graph): the input tokens (overwritten by the sampled ones), the cache lengths
// (advanced by the launch for the active sequences), optionally the sampled-token history and the
// logits. Consecutive steps overlap (programmatic dependent launch): a step's first weights stream
// while the previous step finishes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tileweave/graph/step_graph.hpp"
#include "tileweave/llm/weights.hpp"
#include "tileweave/order/schedule.hpp"
#include "tileweave/runtime/device_plan.hpp"

namespace tw {

struct DecodeStepOptions {
  int batch = 1;
  int64_t max_seq_len = 4096;             // tokens each sequence's cache holds
  KvLayout layout = KvLayout::Contiguous;
  int page_size = 16;                     // paged: tokens per page (a multiple of 16)
  int num_pages = 0;                      // paged: pages per layer's pool (0: batch * pages per sequence)
  bool overlap_previous = true;           // start on the SMs the previous kernel leaves (its weights first)
  bool keep_logits = false;               // write the fp32 logits [batch, vocab] of every step
  int history = 0;                        // steps of sampled tokens kept on the device (a ring by launch)
  std::string order = "kslices/col_major";  // any make_order spec
  uint32_t spin_limit = 0;                // > 0: waits abort after this many polls (tests)
  uint32_t delay_ns = 0;                  // > 0: tiles sleep up to this long before signalling (stress)
  bool trace = false;                     // record every tile's timeline (plan().read_trace())
  // K/V bytes an attention tile takes at least (fewer tiles at short contexts; 0: 8 units of 16 tokens,
  // 32 KiB at head_dim 64, 64 KiB at 128: measured best on the H200 at B = 1, KV 1024). Tests set 1 to
  // cut pairs over many tiles.
  int64_t attention_min_tile_bytes = 0;
  // Attention tiles holding at least this many pairs' segments run one segment per consumer warp, up to
  // 8 at a time, instead of every warp on each segment (0: never). Batches above 64 only (the kernel's
  // 128-row tiles). 4 measured best on the H200 (decode_step_warp_segments_ab.json: Llama-3-8B B = 128
  // KV 512 -6.8%, Llama-3.2-1B -8.1%, Qwen2-7B B = 100 -3.0%; 8: the same at B = 128, none at B = 100).
  int attention_warp_segments = 4;
  int max_split = 0;                      // caps every op's K slices (0: the planner's)
  // Up to this batch, an SM issues nothing of its next tile until its current one has published (above
  // it, after o_proj and down tiles only): a release waits for every copy its SM has in flight, and at
  // small batches the chain of those releases is the step's time (decode_step_hold_kinds_ab.json; 16,
  // up from 4: B = 8 and 16 0.2-1.0% faster, decode_step_hold_b16_ab.json; at B = 64 the ring's lead
  // is worth more: +2.4% there).
  int hold_every_tile_max_batch = 16;
  // Up to this batch, where B x the columns of o_proj's K slice are at most 1024, o_proj's consumers
  // merge the attention's split pairs they read, and no attention tile counts or merges a pair: one
  // hop less on each layer's chain (0: the last tile of a pair merges it).
  int oproj_merge_max_batch = kOprojMergeMaxBatch;
  // Gate/up's last partial wave in K slices, its whole waves unsplit, where the slices' rounds cost
  // under this fraction of an unsplit tile (plan_step_tiling; 0: never, as the uniform planner cuts it).
  double last_wave_cost = 0.75;
  // Tensor parallelism: this object is rank `rank` of `tp` (tensor_parallel_shard: its heads, FFN
  // columns and vocabulary block; the embedding table whole). Its step runs as launches between the
  // step's collectives (run_segment, collective): TensorParallelLocal runs every rank on one GPU,
  // step_over_nccl (ops/decode_step_nccl.hpp) one rank per process over NCCL.
  int tp = 1;
  int rank = 0;
  // The collectives as tiles of the one launch (NCCL's symmetric memory, or other ranks on one GPU:
  // set_exchange) instead of between launches: the next layer's weights stream while a reduction is in
  // flight, and a step is one launch.
  bool collectives_in_launch = false;
  int sms = 0;  // SMs the step plans for and launches on (0: the GPU's; ranks sharing one GPU split it)
};

// What runs on the stream between two of a tensor-parallel rank's launches: an in-place all-reduce
// over the ranks of `count` elements at `data` (fp32 sums: the residual stream's parts; or the max of
// uint64 keys: the LM head's (value, index) maxima).
struct StepCollective {
  enum Kind { SumF32, MaxU64 } kind = SumF32;
  void* data = nullptr;
  int64_t count = 0;
};

class DecodeStep {
 public:
  // Validates the config and options (InvalidArgument naming the bad value), plans the tiles, builds
  // the graph, schedule and executor plan, and allocates weights, caches and state. Needs an sm_90 GPU.
  DecodeStep(const ModelConfig& c, const DecodeStepOptions& opt = {});
  ~DecodeStep();
  DecodeStep(const DecodeStep&) = delete;
  DecodeStep& operator=(const DecodeStep&) = delete;

  // Weights under transformers' names (every expected tensor, shapes checked before anything is
  // uploaded); norms are folded into the weights that follow them, the matrices packed for streaming.
  void load_weights(const HostWeights& w);
  // Random weights generated on the device (benchmarks: no host copy of a large model).
  void random_weights(uint64_t seed, float std = 0.02f);

  // Sequence state. lengths: tokens already in each cache (< max_seq_len). The page table maps each
  // sequence's pages into the pool (default: sequence b owns pages [b * pages_per_seq, ...)).
  void set_lengths(const std::vector<int>& lengths, cudaStream_t stream = nullptr);
  void set_page_table(const std::vector<int>& table, cudaStream_t stream = nullptr);
  void set_tokens(const std::vector<int32_t>& tokens, cudaStream_t stream = nullptr);  // the next inputs
  void set_active(const std::vector<uint8_t>& active, cudaStream_t stream = nullptr);  // empty: all advance
  void fill_cache_random(uint64_t seed, cudaStream_t stream = nullptr);  // every cache row (benchmarks)

  // One step: for each sequence b its token at position lengths()[b]; the sampled tokens replace the
  // inputs; the active sequences' lengths grow by one. InvalidArgument (before the launch) when an
  // active sequence's cache is full. One stream at a time. (Tensor parallelism: use run_segment.)
  void step(cudaStream_t stream = nullptr);
  // A tensor-parallel rank's step, segment by segment (one segment when tp == 1): launch i runs the
  // tiles between collectives i - 1 and i; collective(i) says what the ranks all-reduce after it (for
  // the step about to run: the stream's buffers rotate by step). The last segment's launch ends the
  // step (the lengths advance).
  int segments() const { return static_cast<int>(segs_.size()); }
  void run_segment(int i, cudaStream_t stream = nullptr);
  StepCollective collective(int i) const;  // i < segments() - 1
  // Collectives in the launch: this rank's exchange region ([stream parts | LM-head keys | flags], which
  // every rank reads), and set_exchange: where every rank's region is, in rank order, as pointers this
  // process can dereference (NCCL's LSA pointers; other DecodeSteps' exchange_region() on one GPU).
  // `local`, if not null, replaces this rank's own region (NCCL: a window of ncclMemAlloc memory, at
  // least exchange_bytes(); what the step's own holds is copied there). Steps are refused until it is
  // called.
  void* exchange_region() const;
  int64_t exchange_bytes() const;
  void set_exchange(const std::vector<void*>& regions, void* local = nullptr);
  // Benchmarks: this rank alone, every rank's region its own and every other rank's flags always
  // raised, so its all-reduce tiles wait for nobody and sum its own part tp times (the launch's time
  // without the link's latency; the results are not the model's).
  void set_exchange_alone();

  std::vector<int32_t> tokens(cudaStream_t stream = nullptr) const;  // synchronises
  std::vector<float> logits(cudaStream_t stream = nullptr) const;    // [batch][vocab] (the rank's block); needs keep_logits
  float* logits_device() const;                                      // the same on the device (null without)
  int32_t* tokens_device() const;                                    // [batch] inputs, then the sampled tokens
  // History row of launch e (e = 0 for the first step since the object was made), [batch].
  std::vector<int32_t> history(int64_t launch, cudaStream_t stream = nullptr) const;
  const std::vector<int>& lengths() const { return lengths_; }  // the host's view after the enqueued steps

  const ModelConfig& config() const { return cfg_; }        // the rank's shard (the model when tp == 1)
  const ModelConfig& model_config() const { return model_; }  // the whole model
  const DecodeStepOptions& options() const { return opt_; }
  const DecodeStepShape& shape() const { return shape_; }
  const StepTiling& tiling() const { return tiling_; }
  const StepGraph& graph() const { return g_; }  // as planned (every cache full); step_graph builds others
  const Schedule& schedule() const { return sched_; }
  const runtime::DevicePlan& plan() const { return *plan_; }
  int grid() const { return grid_; }
  int act_rows() const { return act_rows_; }
  bool oproj_merges() const { return oproj_merges_; }  // o_proj merges the attention's split pairs
  // After a launch that aborted on a bounded wait (plan().error() != 0): zero counters and workspaces.
  void reset();

 private:
  struct Buffers;
  ModelConfig model_, cfg_;
  DecodeStepOptions opt_;
  DecodeStepShape shape_;
  StepTiling tiling_;
  StepGraph g_;
  Schedule sched_;
  std::unique_ptr<runtime::DevicePlan> plan_;
  std::unique_ptr<Buffers> buf_;
  std::vector<int> lengths_;
  std::vector<uint8_t> active_;
  int grid_ = 0, act_rows_ = 0;
  bool oproj_merges_ = false;
  int64_t launches_ = 0;
  bool page_table_set_ = false;
  std::vector<StepSegment> segs_;
  bool exchange_set_ = false;
  void check_before_step() const;
  void make_segment_params();  // the launches' params from the step's (after the exchange regions change)
};

// Every rank of a tensor-parallel step in this process, on the current GPU, with the collectives as
// local sums (max) over the ranks' buffers: the one-GPU check of the step that runs one rank per GPU
// over NCCL. Each launch of the step runs on every rank before the collective after it.
class TensorParallelLocal {
 public:
  // opt.collectives_in_launch: the ranks' launches run side by side on the GPU's SMs split between them
  // (each on a stream of its own), their all-reduces tiles of those launches; else one rank's launch
  // after another with a local all-reduce between.
  TensorParallelLocal(const ModelConfig& c, int tp, DecodeStepOptions opt = {});
  ~TensorParallelLocal();
  int tp() const { return static_cast<int>(ranks_.size()); }
  DecodeStep& rank(int r) { return *ranks_.at(r); }
  const DecodeStep& rank(int r) const { return *ranks_.at(r); }
  void load_weights(const HostWeights& w);  // the whole model's; each rank takes its shard
  void set_lengths(const std::vector<int>& lengths, cudaStream_t stream = nullptr);
  void set_page_table(const std::vector<int>& table, cudaStream_t stream = nullptr);
  void set_tokens(const std::vector<int32_t>& tokens, cudaStream_t stream = nullptr);
  void set_active(const std::vector<uint8_t>& active, cudaStream_t stream = nullptr);
  void step(cudaStream_t stream = nullptr);
  std::vector<int32_t> tokens(cudaStream_t stream = nullptr) const { return ranks_[0]->tokens(stream); }
  std::vector<float> logits(cudaStream_t stream = nullptr) const;  // [batch][vocab], the ranks' blocks gathered
  const std::vector<int>& lengths() const { return ranks_[0]->lengths(); }

 private:
  std::vector<std::unique_ptr<DecodeStep>> ranks_;
  std::vector<cudaStream_t> streams_;  // collectives in the launch: one per rank
  std::vector<cudaEvent_t> events_;    // [0]: the caller's stream; [1 + r]: rank r's launch
};

// The local all-reduce of TensorParallelLocal, in place over every rank's buffer (sums in rank order).
void all_reduce_local(const std::vector<StepCollective>& parts, cudaStream_t stream);

}  // namespace tw
