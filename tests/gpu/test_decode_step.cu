// The whole decode step in one launch (ops/decode_step.hpp) against the CPU reference decoder
// (llm/reference.hpp, which rounds where transformers' bf16 model does): fresh random weights and
// prompts each run, logits poisoned before every step, ragged lengths (sequences whose prompts end
// at different steps), contiguous and paged caches (pages in random order), head dims 64 and 128,
// GQA groups 2..7, Qwen2's biases, hidden sizes that are not a multiple of the 128-column stage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>

#include "gpu_util.cuh"
#include "tileweave/llm/reference.hpp"
#include "tileweave/ops/decode_step.hpp"

namespace tw {
namespace {

using test::fresh_seed;

bool have_sm90() {
  if (!test::have_gpu()) return false;
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major == 9;
}
#define TW_REQUIRE_SM90()                                                                        \
  do {                                                                                           \
    if (!have_sm90()) GTEST_SKIP() << "no sm_90 GPU on this machine: decode-step test skipped"; \
  } while (0)

// A small config of head dim 128 (the named tiny ones have 64): 3 query heads per KV head.
ModelConfig tiny_d128() {
  ModelConfig c = named_config("tiny-llama");
  c.name = "tiny-d128";
  c.hidden_size = 384;
  c.intermediate_size = 1000;
  c.num_q_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 128;
  c.vocab_size = 700;
  return c;
}

struct StepCase {
  ModelConfig cfg;
  int batch = 1;
  KvLayout layout = KvLayout::Contiguous;
  int page_size = 16;
  int max_prompt = 8;  // prompts of 1..max_prompt tokens
  int generate = 6;    // greedy tokens after each prompt (teacher-forced with the reference's)
  float weight_std = 0.05f;
  int64_t attention_min_tile_bytes = 0;  // 1: pairs cut over as many tiles as they have units
  int tp = 1;                            // > 1: tp ranks' steps on this GPU, the collectives local sums
  bool in_launch = false;                // tp > 1: the collectives as tiles of the ranks' launches (side by side)
  int sms = 0;                           // > 0: the step planned for and run on this many SMs
  int warp_segments = 0;                 // DecodeStepOptions::attention_warp_segments
  int oproj_merge = -1;                  // >= 0: DecodeStepOptions::oproj_merge_max_batch
  bool expect_merges = false;            // o_proj must be the one merging the split pairs
};

// The step under test: one DecodeStep, or every rank of a tensor-parallel step on this GPU.
struct Stepper {
  std::unique_ptr<DecodeStep> one;
  std::unique_ptr<TensorParallelLocal> ranks;
  Stepper(const ModelConfig& c, const DecodeStepOptions& opt, int tp) {
    if (tp == 1) one = std::make_unique<DecodeStep>(c, opt);
    else ranks = std::make_unique<TensorParallelLocal>(c, tp, opt);
  }
  DecodeStep& rank0() { return one ? *one : ranks->rank(0); }
  void load_weights(const HostWeights& w) { one ? one->load_weights(w) : ranks->load_weights(w); }
  void set_page_table(const std::vector<int>& t) { one ? one->set_page_table(t) : ranks->set_page_table(t); }
  void set_active(const std::vector<uint8_t>& a) { one ? one->set_active(a) : ranks->set_active(a); }
  void set_tokens(const std::vector<int32_t>& t) { one ? one->set_tokens(t) : ranks->set_tokens(t); }
  void step() { one ? one->step() : ranks->step(); }
  std::vector<float> logits() const { return one ? one->logits() : ranks->logits(); }
  std::vector<int32_t> tokens() const { return one ? one->tokens() : ranks->tokens(); }
  void poison_logits() {  // NaN: a logit nobody writes fails the comparison
    for (int r = 0; r < (one ? 1 : ranks->tp()); ++r) {
      const DecodeStep& st = one ? *one : ranks->rank(r);
      TW_CUDA_CHECK(cudaMemset(st.logits_device(), 0xFF, sizeof(float) * size_t(st.shape().batch) * st.config().vocab_size));
    }
  }
  uint32_t error() const {
    uint32_t e = 0;
    for (int r = 0; r < (one ? 1 : ranks->tp()); ++r) e |= (one ? *one : ranks->rank(r)).plan().error();
    return e;
  }
};

int argmax(const float* v, int64_t n) { return int(std::max_element(v, v + n) - v); }


struct Errors {
  double ours = 0, bf16 = 0;  // largest relative error of our logits and of the bf16 reference's, against fp32
};

// Runs the case against the CPU reference in fp32 (the higher-precision reference) and in bf16 (rounded
// where transformers' bf16 model rounds: what rounding alone costs). Every step's logits of every
// active sequence: ours within 3e-2 of fp32, or within twice the bf16 model's own error there; over
// the run no worse than 1.25x the bf16 model's largest error (or 1e-2); greedy tokens equal to fp32's
// except at near ties. Teacher-forced with fp32's tokens.
Errors run_against_reference(const StepCase& k, uint64_t seed) {
 SCOPED_TRACE("config " + k.cfg.name + ", tp " + std::to_string(k.tp) + (k.in_launch ? " in launch" : "") + ", batch " + std::to_string(k.batch) + ", " +
               (k.layout == KvLayout::Paged ? "paged " + std::to_string(k.page_size) : std::string("contiguous")) +
               ", seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const HostWeights w = random_weights(k.cfg, rng(), k.weight_std);
  const int B = k.batch, V = int(k.cfg.vocab_size);
  std::vector<int> prompt_len(B);
  std::vector<std::vector<int32_t>> prompt(B);
  for (int b = 0; b < B; ++b) {
    prompt_len[b] = 1 + int(rng() % k.max_prompt);
    for (int i = 0; i < prompt_len[b]; ++i) prompt[b].push_back(int32_t(rng() % V));
  }
  const int steps = *std::max_element(prompt_len.begin(), prompt_len.end()) + k.generate;
  DecodeStepOptions opt;
  opt.batch = B;
  opt.max_seq_len = steps + 3;
  opt.layout = k.layout;
  opt.page_size = k.page_size;
  opt.keep_logits = true;
  opt.spin_limit = 1u << 22;  // a missing dependency fails the test instead of hanging the GPU
  opt.attention_min_tile_bytes = k.attention_min_tile_bytes;
  opt.collectives_in_launch = k.in_launch;
  opt.sms = k.sms;
  opt.attention_warp_segments = k.warp_segments;
  if (k.oproj_merge >= 0) opt.oproj_merge_max_batch = k.oproj_merge;
  Stepper st(k.cfg, opt, k.tp);
  // Where the split pairs are merged: o_proj's consumers, or the last tile holding a part.
  if (k.expect_merges) EXPECT_TRUE(st.rank0().oproj_merges());
  if (B > opt.oproj_merge_max_batch || st.rank0().act_rows() > 32) EXPECT_FALSE(st.rank0().oproj_merges());
  st.load_weights(w);
  if (k.layout == KvLayout::Paged) {  // every page of the pool, shuffled
    std::vector<int> table(size_t(B) * st.rank0().shape().pages_per_seq());
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    st.set_page_table(table);
  }
  ReferenceDecoder exact(k.cfg, w, B, int(opt.max_seq_len), ReferencePrecision::Fp32);
  ReferenceDecoder rounded(k.cfg, w, B, int(opt.max_seq_len), ReferencePrecision::Bf16);
  std::vector<int32_t> next(B, 0);  // fp32's greedy token of each sequence
  Errors worst;
  int near_ties = 0, compared = 0, bf16_ties = 0;
  struct StepErr { int step, seq; double ours, bf16; };
  std::vector<StepErr> per_step;
  for (int s = 0; s < steps; ++s) {
    std::vector<uint8_t> active(B);
    std::vector<int32_t> in(B, 0);
    for (int b = 0; b < B; ++b) {
      active[b] = s < prompt_len[b] + k.generate;
      if (active[b]) in[b] = s < prompt_len[b] ? prompt[b][s] : next[b];
    }
    st.set_active(active);
    st.set_tokens(in);
    st.poison_logits();
    st.step();
    const std::vector<float> ours = st.logits();
    const std::vector<int32_t> sampled = st.tokens();
    EXPECT_EQ(st.error(), 0u) << "a bounded wait expired at step " << s;
    const std::vector<float> want = exact.step(in, active), bf16 = rounded.step(in, active);
    for (int b = 0; b < B; ++b) {
      if (!active[b]) continue;
      const float* o = &ours[size_t(b) * V];
      const float* r = &want[size_t(b) * V];
      const double err = test::rel_error(o, r, V), err_bf16 = test::rel_error(&bf16[size_t(b) * V], r, V);
      worst.ours = std::max(worst.ours, err);
      worst.bf16 = std::max(worst.bf16, err_bf16);
      per_step.push_back({s, b, err, err_bf16});
      const int mine = argmax(o, V), theirs = argmax(r, V);
      bf16_ties += argmax(&bf16[size_t(b) * V], V) != theirs;
      EXPECT_EQ(sampled[b], mine) << "the sampled token is not the argmax of the logits (step " << s << ", sequence " << b << ")";
      // A token may differ where two of fp32's logits are closer than errors of this step's size can
      // move them: 5x the row's rms error (err x rms(logits)) -- ours, or the bf16 model's if larger,
      // as the per-step bound below admits -- or 1% of the largest logit. (Ours alone was 2.5% short
      // once in a dozen runs of tiny-d128 B = 3: a gap of 0.0335 against 0.0327, the bf16 model's error
      // 1.5x ours. With 4x, tiny-d128 B = 177 had one of 8 near ties in 896 tokens at 4.6x, its errors
      // 1.03e-2 against the bf16 model's 1.32e-2: the tail of the two logits' errors, not a wrong step,
      // which the per-step bounds below catch.)
      double peak = 0, ss = 0;
      for (int v = 0; v < V; ++v) peak = std::max(peak, std::abs(double(r[v]))), ss += double(r[v]) * r[v];
      const double tie = std::max(1e-2 * peak, 5 * std::max(err, err_bf16) * std::sqrt(ss / V));
      ++compared;
      if (mine != theirs) {
        ++near_ties;
        EXPECT_LT(r[theirs] - r[mine], tie) << "step " << s << " sequence " << b << ": token " << mine
                                            << " against the reference's " << theirs;
      }
      next[b] = theirs;
    }
  }
  // Every step within 3e-2 of fp32, or twice the bf16 model's error at that step, or the bound over
  // the run (1.25x the bf16 model's largest error): the two round in different places, so a step where
  // the bf16 model happens to land close to fp32 says little about ours (H200, tiny-d128 B = 16: ours
  // 3.02e-2 at a step where the bf16 model had 1.46e-2, against 4.65e-2 for the bf16 model over the
  // run; another seed, 3.86e-2 at a step where it had 1.60e-2, against 3.56e-2 over the run).
  for (const StepErr& e : per_step)
    EXPECT_LT(e.ours, std::max({3e-2, 2 * e.bf16, 1.25 * worst.bf16}))
        << "step " << e.step << " sequence " << e.seq << " (the bf16 model: " << e.bf16 << ", over the run " << worst.bf16 << ")";
  EXPECT_LE(worst.ours, std::max(1e-2, 1.25 * worst.bf16)) << "our largest error against the bf16 model's";
  // Each near tie is checked against the tie bound above; their count against 10% of the tokens, or twice
  // the bf16 model's own. A model whose logits sit close together has many, and their count is noisy:
  // tiny-d128 B = 16 at seed 13934280356168330027 had 15 of 259 (the bf16 model 7), the same on the
  // builds before and after a change that leaves the logits alone; other seeds 9 / 9 (bf16 7 / 14). A
  // wrong step fails the per-step error bounds above long before this count.
  EXPECT_LE(near_ties, std::max({3, compared / 10, 2 * bf16_ties}));
  std::printf("  %s tp=%d%s B=%d %s: max rel err vs fp32 %.2e (the bf16 model: %.2e), %d near ties in %d (the bf16 model: %d)\n",
              k.cfg.name.c_str(), k.tp, k.in_launch ? " (in launch)" : "", B, k.layout == KvLayout::Paged ? "paged" : "contiguous",
              worst.ours, worst.bf16, near_ties, compared, bf16_ties);
  return worst;
}

TEST(DecodeStep, TinyLlamaBatch1Contiguous) {
  TW_REQUIRE_SM90();
  StepCase k{named_config("tiny-llama")};
  k.max_prompt = 12;
  run_against_reference(k, fresh_seed());
}

// Wide stages (256 columns at 8 rows, B <= 4) whose last stage holds 2 of its 4 atoms, the rest zeros
// (issue_weights): tiny Llama's down (intermediate 640 = 10 atoms) on one GPU and on each of two
// tensor-parallel ranks (320 columns each), tiny Qwen2's qkv, gate/up and LM head (hidden 320).
TEST(DecodeStep, WideStagesWithPartialLastStages) {
  TW_REQUIRE_SM90();
  const ModelConfig llama = named_config("tiny-llama"), qwen = named_config("tiny-qwen2");
  for (int batch : {1, 3, 4}) {
    const ModelConfig& c = batch == 3 ? qwen : llama;
    DecodeStepOptions opt;
    opt.batch = batch;
    opt.max_seq_len = 64;
    opt.tp = batch == 4 ? 2 : 1;
    const DecodeStep probe(c, opt);
    ASSERT_EQ(probe.act_rows(), 8) << "batch " << batch << ": the case does not test what it is for";
    ASSERT_EQ(probe.tiling().qkv.bk, 256) << "batch " << batch;
    StepCase k{c, batch == 4 ? 2 : batch, batch == 3 ? KvLayout::Paged : KvLayout::Contiguous, 16};
    k.tp = opt.tp;
    k.max_prompt = 20;
    run_against_reference(k, fresh_seed());
  }
}

TEST(DecodeStep, TinyLlamaBatch3PagedRagged) {
  TW_REQUIRE_SM90();
  StepCase k{named_config("tiny-llama"), 3, KvLayout::Paged, 16};
  k.max_prompt = 40;
  run_against_reference(k, fresh_seed());
}

TEST(DecodeStep, TinyQwen2Batch3ContiguousRagged) {
  TW_REQUIRE_SM90();  // 7 query heads per KV head, biases, hidden 320 (stages padded)
  StepCase k{named_config("tiny-qwen2"), 3};
  k.max_prompt = 30;
  run_against_reference(k, fresh_seed());
}

TEST(DecodeStep, TinyQwen2Batch16Paged32) {
  TW_REQUIRE_SM90();
  StepCase k{named_config("tiny-qwen2"), 16, KvLayout::Paged, 32};
  k.max_prompt = 20;
  run_against_reference(k, fresh_seed());
}

TEST(DecodeStep, HeadDim128Batch16Ragged) {
  TW_REQUIRE_SM90();
  for (KvLayout layout : {KvLayout::Contiguous, KvLayout::Paged}) {
    StepCase k{tiny_d128(), 16, layout, 16};
    k.max_prompt = 24;
    k.weight_std = 0.1f;  // sharper attention
    run_against_reference(k, fresh_seed());
  }
}

TEST(DecodeStep, LongPromptsSplitAcrossManyTiles) {
  TW_REQUIRE_SM90();  // pairs cut over dozens of tiles: partials, merges, empty tiles
  // A case of long prompts; min_tile_bytes 1 cuts pairs over as many tiles as they have units.
  auto long_prompts = [](ModelConfig cfg, int batch, KvLayout layout, int page, int prompt, int min_tile_bytes) {
    StepCase k{std::move(cfg), batch, layout, page};
    k.max_prompt = prompt;
    k.generate = 3;
    k.attention_min_tile_bytes = min_tile_bytes;
    return k;
  };
  // The split pairs merged by o_proj's consumers (the default where B x o_proj's K slice is at most
  // 1024 columns: expect_merges) and by the last tile holding a part (oproj_merge 0, and the others).
  for (int merge : {-1, 0}) {
    for (StepCase k : {long_prompts(named_config("tiny-llama"), 2, KvLayout::Contiguous, 16, 300, 1),
                       long_prompts(tiny_d128(), 1, KvLayout::Paged, 64, 160, 1),
                       long_prompts(named_config("tiny-qwen2"), 2, KvLayout::Paged, 32, 120, 1)}) {  // 7 heads a group
      k.oproj_merge = merge;
      k.expect_merges = merge != 0;
      run_against_reference(k, fresh_seed());
    }
  }
  run_against_reference(long_prompts(tiny_d128(), 5, KvLayout::Paged, 64, 160, 1), fresh_seed());
  // The default cut: a few tiles per pair at most.
  run_against_reference(long_prompts(tiny_d128(), 3, KvLayout::Contiguous, 16, 200, 0), fresh_seed());
  StepCase one = long_prompts(tiny_d128(), 1, KvLayout::Contiguous, 16, 200, 0);
  one.expect_merges = true;
  run_against_reference(one, fresh_seed());
}

// Gate/up in more tiles than SMs, as Llama-3-8B's 224 on 132: down's tiles, which wait per tile for
// the h columns they read, run beside gate/up's second wave. Here 63 gate/up tiles on 16 SMs.
TEST(DecodeStep, GateUpBeyondOneWave) {
  TW_REQUIRE_SM90();
  ModelConfig c = tiny_d128();
  c.name = "tiny-wide-ffn";
  c.intermediate_size = 4000;
  for (int batch : {1, 16}) {
    DecodeStepOptions opt;
    opt.batch = batch;
    opt.max_seq_len = 64;
    opt.sms = 16;
    const DecodeStep probe(c, opt);
    const StepGraph& g = probe.graph();
    ASSERT_GT(g.graph.op(g.layers[0].op_gate_up).num_tiles, 2 * opt.sms) << "the case does not test what it is for";
    StepCase k{c, batch, batch == 1 ? KvLayout::Contiguous : KvLayout::Paged, 16};
    k.max_prompt = 12;
    k.generate = 4;
    k.sms = 16;
    run_against_reference(k, fresh_seed());
  }
}

// Gate/up's whole waves as one ticket over their K slices and its last wave in slices
// (plan_step_tiling's last-wave rule, run_slices_whole): 19 tiles on 16 SMs, the last 3 in slices,
// at the three activation-row modes (R = 2B staged, R = 32, and above 32 rows the stream's bf16 copy).
TEST(DecodeStep, GateUpLastWaveInSlices) {
  TW_REQUIRE_SM90();
  ModelConfig c = tiny_d128();
  c.name = "tiny-last-wave";
  c.hidden_size = 1024;
  c.intermediate_size = 1216 - 8;  // 19 column tiles of 64, the last one partial
  for (int batch : {1, 16, 100}) {
    DecodeStepOptions opt;
    opt.batch = batch;
    opt.max_seq_len = 64;
    opt.sms = 16;
    const DecodeStep probe(c, opt);
    ASSERT_EQ(probe.tiling().gate_up_whole, 16) << "batch " << batch << ": the case does not test what it is for";
    ASSERT_GT(probe.tiling().gate_up.split_k, 1) << "batch " << batch;
    StepCase k{c, batch, batch == 16 ? KvLayout::Paged : KvLayout::Contiguous, 16};
    k.max_prompt = 12;
    k.generate = 4;
    k.sms = 16;
    run_against_reference(k, fresh_seed());
  }
}

// Odd batch sizes on the activation-row configurations the other tests leave out, up to the largest
// batch: R >= 2B up to 32 rows (6, 20: 16, 64 rows), and above 32 the stream's bf16 copy written by
// the writers' last slices (step_bf16_stream; 33, 100, 128, 200, 256: 64, 128, 128, 256, 256 rows), at
// head dims 64 (tiny Qwen2, hidden 320: a partial stage) and 128.
TEST(DecodeStep, BatchSizesAcrossTileHeights) {
  TW_REQUIRE_SM90();
  for (int batch : {6, 20, 33, 100, 128, 200, 256}) {
    StepCase k{named_config("tiny-qwen2"), batch};
    k.max_prompt = 5;
    k.generate = 2;
    run_against_reference(k, fresh_seed());
  }
  for (int batch : {40, 177}) {
    StepCase k{tiny_d128(), batch, KvLayout::Paged, 16};
    k.max_prompt = 5;
    k.generate = 2;
    run_against_reference(k, fresh_seed());
  }
}

// Above 64 rows, tiles of several pairs run a segment per consumer warp (attention_warp_segments; 0
// turns it off): whole pairs, pairs cut over tiles (partials, merges), ragged lengths, both head dims.
TEST(DecodeStep, AttentionSegmentPerWarp) {
  TW_REQUIRE_SM90();
  for (int segments : {0, 1, 2, 8}) {
    StepCase k{named_config("tiny-qwen2"), segments % 2 ? 128 : 100};
    k.max_prompt = 40;
    k.generate = 3;
    k.warp_segments = segments;
    run_against_reference(k, fresh_seed());
  }
  for (int segments : {1, 4}) {
    StepCase k{tiny_d128(), segments == 1 ? 128 : 72, KvLayout::Paged, 16};
    k.max_prompt = 60;
    if (segments == 1) k.attention_min_tile_bytes = 1;  // pairs cut over tiles: partials and merges
    k.generate = 3;
    k.warp_segments = segments;
    run_against_reference(k, fresh_seed());
  }
}

// Model shapes drawn from a seed, as the attention and FFN grids draw theirs: Llama (with or without
// Llama-3 frequency scaling) or Qwen2 (biases, tied embeddings) of head dim 64 or 128, 1..4 KV heads
// with 1..8 query heads each, hidden and intermediate sizes multiples of 8 (rarely of 128), 1..2
// layers, batches up to 20 with ragged prompts (the attention cut pair by pair) and one of 40
// sequences x 4 KV heads (more pairs than tiles: the even cut), contiguous or paged. Against the
// fp32 and bf16 references like the named configs. TW_SHAPE_SEED picks the grid: the default is the
// same every run, any other one a grid no test names.
TEST(DecodeStep, RandomConfigGrid) {
  TW_REQUIRE_SM90();
  const uint64_t seed = tw::test::shape_seed();
  SCOPED_TRACE("TW_SHAPE_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed ^ 0x57E9);
  static const int kPages[] = {16, 32, 64};
  for (int i = 0; i < 6; ++i) {
    const bool qwen = rng() % 2 == 0;
    ModelConfig c = named_config(qwen ? "tiny-qwen2" : "tiny-llama");
    c.name = "random-" + std::to_string(i);
    c.head_dim = rng() % 2 ? 64 : 128;
    c.num_kv_heads = 1 + int(rng() % 4);
    c.num_q_heads = c.num_kv_heads * (1 + int(rng() % 8));
    c.hidden_size = 8 * (8 + int64_t(rng() % 57));         // 64 .. 512
    c.intermediate_size = 8 * (8 + int64_t(rng() % 121));  // 64 .. 1024
    c.num_layers = 1 + int(rng() % 2);
    c.vocab_size = 300 + int64_t(rng() % 500);
    c.rope_theta = qwen ? 1e6 : 5e5;
    if (!qwen && rng() % 2) c.rope_factor = 0;  // plain RoPE; else the named config's Llama-3 scaling
    c.validate();
    StepCase k{c, 1 + int(rng() % 20)};
    if (i == 4) k.batch = 65 + int(rng() % 64);  // 128-row tiles: a segment per warp in the attention
    if (i == 5) c.num_kv_heads = 4, c.num_q_heads = 4 * (1 + int(rng() % 4)), k = StepCase{c, 40};
    k.layout = rng() % 2 ? KvLayout::Paged : KvLayout::Contiguous;
    k.page_size = kPages[rng() % 3];
    k.max_prompt = 2 + int(rng() % 40);
    k.generate = 3;
    run_against_reference(k, rng());
  }
}

// Random producer delays over 1000 launches: no wait expires, and the same logits and greedy tokens as
// without delays (the same inputs each step). Sums of squares and split-K partials add in whatever
// order tiles arrive, which moves a bf16 rounding now and then: the logits agree to 2e-2 (measured
// 1.2e-3 to 5.4e-3 at most over 3000 rows, H200; the kernel's error against fp32 is ~1e-2), and a
// token may differ only where two logits are that close.
TEST(DecodeStep, StressRandomDelaysSameTokens) {
  TW_REQUIRE_SM90();
  const ModelConfig cfg = named_config("tiny-llama");
  const uint64_t seed = fresh_seed();
  const HostWeights w = random_weights(cfg, seed, 0.05f);
  // B = 100: 128-row tiles, whose attention runs a segment per warp (attention_warp_segments).
  for (const auto [B, steps] : {std::pair{3, 1000}, std::pair{100, 200}}) {
    SCOPED_TRACE("batch " + std::to_string(B));
    const int V = int(cfg.vocab_size);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> inputs(size_t(steps) * B);
    for (auto& t : inputs) t = int32_t(rng() % V);
    std::vector<std::vector<float>> runs;
    std::vector<std::vector<int32_t>> tokens;
    for (uint32_t delay : {0u, 20000u}) {
      DecodeStepOptions opt;
      opt.batch = B;
      opt.max_seq_len = steps + 1;
      opt.keep_logits = true;
      opt.spin_limit = 1u << 24;
      opt.delay_ns = delay;
      DecodeStep st(cfg, opt);
      st.load_weights(w);
      std::vector<float> all;
      std::vector<int32_t> sampled;
      for (int s = 0; s < steps; ++s) {
        st.set_tokens(std::vector<int32_t>(inputs.begin() + size_t(s) * B, inputs.begin() + size_t(s + 1) * B));
        st.step();
        const auto l = st.logits();
        all.insert(all.end(), l.begin(), l.end());
        const auto t = st.tokens();
        sampled.insert(sampled.end(), t.begin(), t.end());
      }
      ASSERT_EQ(st.plan().error(), 0u) << "a bounded wait expired (delay " << delay << " ns)";
      runs.push_back(all);
      tokens.push_back(sampled);
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    int differ = 0;
    for (size_t row = 0; row * V < runs[0].size(); ++row) {
      const float* a = &runs[0][row * V];
      ASSERT_LT(test::rel_error(&runs[1][row * V], a, V), 2e-2) << "logits row " << row;
      if (tokens[0][row] != tokens[1][row]) {  // only where the two logits are within the runs' difference
        ++differ;
        double peak = 0;
        for (int v = 0; v < V; ++v) peak = std::max(peak, std::abs(double(a[v])));
        EXPECT_LT(std::abs(a[tokens[0][row]] - a[tokens[1][row]]), 5e-3 * peak) << "logits row " << row;
      }
    }
    EXPECT_LE(differ, int(tokens[0].size()) / 100)
        << "greedy tokens differ in " << differ << " of " << tokens[0].size();
  }
}

// Steps captured in a CUDA graph (the state lives on the device) give the tokens of steps launched
// one by one.
TEST(DecodeStep, CudaGraphOfStepsMatchesLaunches) {
  TW_REQUIRE_SM90();
  const ModelConfig cfg = named_config("tiny-qwen2");
  const HostWeights w = random_weights(cfg, fresh_seed(), 0.05f);
  const int B = 4, steps = 6;
  std::vector<std::vector<int32_t>> runs;
  for (bool graph : {false, true}) {
    DecodeStepOptions opt;
    opt.batch = B;
    opt.max_seq_len = 64;
    opt.history = steps;
    opt.spin_limit = 1u << 22;
    DecodeStep st(cfg, opt);
    st.load_weights(w);
    st.set_lengths({0, 0, 0, 0});
    st.set_tokens({5, 6, 7, 8});
    cudaStream_t s;
    TW_CUDA_CHECK(cudaStreamCreate(&s));
    if (graph) {
      test::run_in_graph(s, [&](cudaStream_t c) {
        for (int i = 0; i < steps; ++i) st.step(c);
      });
    } else {
      for (int i = 0; i < steps; ++i) st.step(s);
      TW_CUDA_CHECK(cudaStreamSynchronize(s));
    }
    std::vector<int32_t> all;
    for (int i = 0; i < steps; ++i) {
      const auto h = st.history(i, s);
      all.insert(all.end(), h.begin(), h.end());
    }
    runs.push_back(all);
    TW_CUDA_CHECK(cudaStreamDestroy(s));
  }
  EXPECT_EQ(runs[0], runs[1]);
}

// Tensor parallelism, the one-GPU check: every rank's shard on this GPU, the all-reduces local sums
// (TensorParallelLocal), against the fp32 reference like the whole model's step -- 2 and 4 ranks,
// Llama with GQA and Qwen2 with biases and 7 query heads per KV head (two KV heads, so it splits).
ModelConfig qwen2_two_kv_heads() {
  ModelConfig c = named_config("tiny-qwen2");
  c.name = "tiny-qwen2-kv2";
  c.num_q_heads = 14;
  c.num_kv_heads = 2;
  return c;
}

TEST(DecodeStep, TensorParallelOnOneGpuMatchesReference) {
  TW_REQUIRE_SM90();
  for (bool in_launch : {false, true}) {
  StepCase k{named_config("tiny-llama"), 3, KvLayout::Paged, 16};
  k.in_launch = in_launch;
  k.max_prompt = 20;
  k.tp = 2;
  run_against_reference(k, fresh_seed());
  StepCase q{qwen2_two_kv_heads(), 5};
  q.max_prompt = 12;
  q.tp = 2;
  q.in_launch = in_launch;
  run_against_reference(q, fresh_seed());
  ModelConfig d128 = tiny_d128();  // 6 query heads on 2 KV heads: tp 2 only; hidden 384 is 3 blocks
  d128.intermediate_size = 1008;    // each rank's 504 a multiple of 8
  StepCase d{d128, 1};
  d.max_prompt = 30;
  d.tp = 2;
  d.in_launch = in_launch;
  run_against_reference(d, fresh_seed());
  ModelConfig four = named_config("tiny-llama");  // 4 KV heads, 2 query heads each: tp 4
  four.num_kv_heads = 4;
  StepCase f{four, 4, KvLayout::Contiguous};
  f.max_prompt = 9;
  f.tp = 4;
  f.in_launch = in_launch;
  run_against_reference(f, fresh_seed());
  }
}

// The issue's check: tp ranks give the tokens of one GPU's whole-model step over 64 steps on the same
// weights. Both are fed the whole model's greedy tokens (so one near tie does not fork the rest); the
// ranks' logits stay within 2e-2 of the whole model's, and their token differs only where the whole
// model's two logits are closer than the two runs' difference could move them.
TEST(DecodeStep, TensorParallelTokensMatchOneRank) {
  TW_REQUIRE_SM90();
  for (bool in_launch : {false, true})
  for (int tp : {2, 4}) {
    ModelConfig cfg = named_config("tiny-llama");
    cfg.num_kv_heads = 4;
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("tp " + std::to_string(tp) + (in_launch ? " in launch" : "") + ", seed " + std::to_string(seed));
    const HostWeights w = random_weights(cfg, seed, 0.08f);
    const int B = 3, steps = 64, V = int(cfg.vocab_size);
    DecodeStepOptions opt;
    opt.batch = B;
    opt.max_seq_len = steps + 8;
    opt.keep_logits = true;
    opt.spin_limit = 1u << 22;
    DecodeStep whole(cfg, opt);
    DecodeStepOptions tp_opt = opt;
    tp_opt.collectives_in_launch = in_launch;
    tp_opt.delay_ns = in_launch ? 20000 : 0;  // random producer delays: the ranks' tiles out of step
    TensorParallelLocal ranks(cfg, tp, tp_opt);
    whole.load_weights(w);
    ranks.load_weights(w);
    const std::vector<int> lengths = {0, 3, 7};  // ragged (the earlier positions' K/V: zero in both, as allocated)
    std::vector<int32_t> in = {11, 200, 3};
    int differ = 0;
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      whole.set_tokens(in);
      ranks.set_tokens(in);
      if (s == 0) whole.set_lengths(lengths), ranks.set_lengths(lengths);
      whole.step();
      ranks.step();
      const std::vector<float> a = whole.logits(), b = ranks.logits();
      const std::vector<int32_t> ta = whole.tokens(), tb = ranks.tokens();
      for (int r = 0; r < B; ++r) {
        const double err = test::rel_error(&b[size_t(r) * V], &a[size_t(r) * V], V);
        worst = std::max(worst, err);
        ASSERT_LT(err, 2e-2) << "step " << s << " sequence " << r;
        EXPECT_EQ(tb[r], argmax(&b[size_t(r) * V], V));
        if (ta[r] != tb[r]) {
          ++differ;
          double ss = 0;
          for (int v = 0; v < V; ++v) ss += double(a[size_t(r) * V + v]) * a[size_t(r) * V + v];
          EXPECT_LT(a[size_t(r) * V + ta[r]] - a[size_t(r) * V + tb[r]], 4 * err * std::sqrt(ss / V))
              << "step " << s << " sequence " << r << ": token " << tb[r] << " against the whole model's " << ta[r];
        }
      }
      in = ta;
    }
    EXPECT_EQ(whole.plan().error(), 0u);
    for (int r = 0; r < tp; ++r) EXPECT_EQ(ranks.rank(r).plan().error(), 0u) << "rank " << r << ": a bounded wait expired";
    // Every differing token is a near tie (checked above); tiny-llama's flat random logits have them
    // often enough that a fixed count of 2 failed on a fresh seed (3 of 192): at most 5%.
    EXPECT_LE(differ, steps * B / 20) << "greedy tokens differ in " << differ << " of " << steps * B;
    EXPECT_EQ(ranks.lengths(), whole.lengths());
    std::printf("  tp=%d%s: logits within %.2e of one rank's whole-model step, %d of %d tokens differ (near ties)\n", tp,
                in_launch ? " (in launch)" : "", worst, differ, steps * B);
  }
}

TEST(DecodeStep, BadInputIsRefusedBeforeAnyLaunch) {
  TW_REQUIRE_SM90();
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  };
  ModelConfig odd = named_config("tiny-llama");
  odd.head_dim = 96;
  odd.num_q_heads = 4;
  EXPECT_NE(message([&] { DecodeStep s(odd); }).find("head_dim 96"), std::string::npos);
  DecodeStepOptions opt;
  opt.batch = 0;
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), opt); }).find("batch 0"), std::string::npos);
  opt.batch = 257;
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), opt); }).find("batch 257"), std::string::npos);
  opt.batch = 129;
  opt.tp = 2;  // a rank's tiles hold 2B rows
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), opt); }).find("batch 129"), std::string::npos);
  opt.tp = 1;
  opt.batch = 2;
  opt.last_wave_cost = -1;
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), opt); }).find("last_wave_cost -1"), std::string::npos);
  opt.last_wave_cost = 0.75;
  opt.attention_warp_segments = -2;
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), opt); }).find("attention_warp_segments -2"),
            std::string::npos);
  opt.attention_warp_segments = 4;
  opt.hold_every_tile_max_batch = -1;
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), opt); }).find("hold_every_tile_max_batch -1"),
            std::string::npos);
  opt.hold_every_tile_max_batch = 4;
  opt.max_seq_len = 3;
  DecodeStep st(named_config("tiny-llama"), opt);
  HostWeights w = random_weights(named_config("tiny-llama"), 1);
  w.tensors.erase("model.layers.1.mlp.down_proj.weight");
  EXPECT_NE(message([&] { st.load_weights(w); }).find("model.layers.1.mlp.down_proj.weight"), std::string::npos);
  EXPECT_NE(message([&] { st.set_tokens({0, 512}); }).find("token 512"), std::string::npos);
  EXPECT_NE(message([&] { st.set_lengths({0, 3}); }).find("length 3"), std::string::npos);
  st.set_lengths({2, 1});
  st.step();  // position 2 is the last the caches hold
  EXPECT_NE(message([&] { st.step(); }).find("sequence 0"), std::string::npos);
  // Tensor parallelism: counts that do not divide the heads, a rank outside the ranks, a rank's step
  // launched whole.
  DecodeStepOptions tp = opt;
  tp.tp = 4;  // tiny-llama has 2 KV heads
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), tp); }).find("num_kv_heads 2 is not divisible by 4"),
            std::string::npos);
  tp.tp = 2;
  tp.rank = 2;
  EXPECT_NE(message([&] { DecodeStep s(named_config("tiny-llama"), tp); }).find("rank 2"), std::string::npos);
  tp.rank = 1;
  DecodeStep r1(named_config("tiny-llama"), tp);
  EXPECT_NE(message([&] { r1.step(); }).find("run_segment"), std::string::npos);
  EXPECT_NE(message([&] { r1.run_segment(r1.segments()); }).find("segment"), std::string::npos);
  EXPECT_NE(message([&] { r1.collective(r1.segments() - 1); }).find("has none"), std::string::npos);
  EXPECT_NE(message([&] { TensorParallelLocal t(named_config("tiny-llama"), 9); }).find("tp 9"), std::string::npos);
  tp.collectives_in_launch = true;  // a rank whose peers are not set
  DecodeStep lone(named_config("tiny-llama"), tp);
  EXPECT_NE(message([&] { lone.step(); }).find("set_exchange"), std::string::npos);
  EXPECT_NE(message([&] { lone.set_exchange({lone.exchange_region()}); }).find("1 regions for 2 ranks"), std::string::npos);
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace tw
