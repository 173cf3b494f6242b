#include "tileweave/graph/step_graph.hpp"

#include <algorithm>
#include <string>

#include "tileweave/kernels/attention/decode_units.hpp"
#include "tileweave/kernels/sm90/tile_shape.hpp"

namespace tw {

namespace {

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("decode step: " + what); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The model sees the caches in 16-token units (one block row each): single-row edges (the appended row,
// a sequence's last token) would cut the caches into one block per row.
constexpr int64_t kUnit = kernels::kDecodeStageTokens;

// K slices per op at most, where the slices reduce (gate/up, the LM head). Every op of a step waits
// for the whole op before it, so a norm consumer's last-slice reduction (partials in, arrival, sums
// out, epilogue, release) is on the step's critical path once per op; beyond 4 slices that chain
// cost more than spreading the op over more SMs gained (H200, Llama-3.2-1B shape, B = 1, KV 1024,
// when o_proj and down reduced the same way: 1149.7 us with up to 8 slices, 1108.9 with 4, 1205.6
// with 2, 1419.3 unsplit).
constexpr int64_t kMaxStepSlices = 4;
// o_proj and down add their slices into the residual stream (qkv into its sums buffer) with no
// reduction between them, so more slices cost little: up to 8 (H200, B = 1 KV 1024 / B = 16 KV 4096:
// Llama-3.2-1B 1019.5 -> 964.1 / 1811.4 -> 1761.7 us with 8 slices instead of 4; Llama-3-8B with 5
// (160 tiles on 132 SMs) 7293 -> 7441 us at B = 16: its second wave is a tail).
constexpr int64_t kMaxWriterSlices = 8;

// K in `split` slices of whole stages, none empty (as TileGraph cuts them).
Tiling tiling_in_slices(int64_t k, int64_t out_cols, int act_rows, int64_t split) {
  const int64_t step = sm90::step_stage_cols(act_rows), slice = ceil_div(ceil_div(k, split), step) * step;
  return {act_rows, out_cols, step, ceil_div(k, slice), {}};
}

// The most K slices a tile takes: at least two stages per slice, counted in 128 columns where a stage
// is wider (the pipeline's fill and the split's reduction are per tile), each slice's fp32 partial
// (kTileRows x act_rows floats) at most half its weight bytes, and max_split (when set) or max_slices.
int64_t slice_cap(int64_t k, int act_rows, int max_split, int64_t max_slices) {
  const int64_t stages = ceil_div(k, std::min(sm90::step_stage_cols(act_rows), 128));
  return std::min<int64_t>({max_split > 0 ? max_split : max_slices, std::max<int64_t>(1, stages / 2),
                            std::max<int64_t>(1, k / (4 * act_rows))});
}

// One GEMM op of the step on the sm90 tile: out_cols output columns per tile (128, or 64 for paired
// gate/up rows), K in as many slices of whole stages as keep the op's tiles in one wave on the SMs, at
// most max_slices. Never a second wave: the op's every consumer waits for its last tile, so a second
// wave of a few tiles is a tail on the step's critical path (H200 / H100, A/B in one call: Llama-3-8B's
// qkv in 2 slices, 96 tiles, instead of 3, 144: B = 1 KV 1024 4300 -> 4188 us, B = 16 KV 4096 6608 ->
// 6500, h200/decode_step_qkv_one_wave_ab.json; Qwen2-0.5B's gate/up unsplit, 76 tiles, instead of 2
// slices, 152: B = 1 KV 1024 974 -> 907 us, B = 16 KV 4096 1556 -> 1471 on the H100,
// h100/decode_step_gate_up_one_wave_ab.json).
Tiling plan_gemm(int64_t n, int64_t k, int64_t out_cols, int act_rows, int sms, int max_split, int64_t max_slices) {
  const int64_t tiles_n = ceil_div(n, out_cols);
  int64_t split = 1;
  if (10 * tiles_n < 9 * int64_t(sms)) split = std::max<int64_t>(1, sms / tiles_n);  // under 90% of the SMs busy unsplit
  return tiling_in_slices(k, out_cols, act_rows, std::min(split, slice_cap(k, act_rows, max_split, max_slices)));
}

// The last wave of an op with more tiles than SMs, in K slices: its tiles of `stages` stages, `rem`
// = tiles mod sms of them in the last wave. Unsplit, that wave costs a whole tile's stages while most
// SMs have nothing of the op left; in s slices it costs ceil(rem s / sms) rounds of stages / s plus
// each slice's reduction and arrival (kSliceCost stages of up to 128 columns, half as many of 256: ~2.8
// us a slice beyond its bytes, measured in stream-K's tile timelines, executor.md). Taken where that
// is under max_cost of the unsplit wave: t (unsplit) becomes the slices, and the tiles before the last
// wave, returned, run whole (StepTiling::gate_up_whole; 0: t unchanged). Splitting every tile instead
// (session 24) lost 6-11%: each slice pays the reduction.
constexpr double kSliceCost = 3.0;
int64_t split_last_wave(Tiling& t, int64_t n, int64_t k, int sms, int max_split, double max_cost) {
  const int act_rows = int(t.bm);
  const int64_t tiles = ceil_div(n, t.bn), stages = ceil_div(k, t.bk), rem = tiles % sms;
  if (tiles <= sms || rem == 0) return 0;
  int64_t best = 1;
  double best_cost = max_cost * double(stages);
  const double slice_cost = kSliceCost * std::min(1.0, 128.0 / double(t.bk));
  for (int64_t s = 2; s <= slice_cap(k, act_rows, max_split, kMaxStepSlices); ++s) {
    if (tiling_in_slices(k, t.bn, act_rows, s).split_k != s) continue;  // an empty slice
    const double cost = double(ceil_div(rem * s, sms)) * (double(stages) / double(s) + slice_cost);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  if (best == 1) return 0;
  t = tiling_in_slices(k, t.bn, act_rows, best);
  return tiles - rem;
}

}  // namespace

DecodeAttentionShape DecodeStepShape::attention(const ModelConfig& c) const {
  DecodeAttentionShape a;
  a.batch = batch;
  a.num_q_heads = c.num_q_heads;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.layout = layout;
  a.max_seq_len = max_seq_len;
  if (layout == KvLayout::Paged) {
    a.page_size = page_size;
    a.num_pages = pool_pages();
    a.pages_per_seq = pages_per_seq();
  }
  // RoPE and the append are the step kernel's own (finish_qkv: the norm's scale comes first), not the
  // standalone attention's; the graph reads the new row from the cache (see build_step_graph).
  a.rope_theta = 0;
  a.append = false;
  return a;
}

void check_step_batch(int batch, int tp) {
  if (batch < 1 || batch > max_step_batch(tp))
    bad("batch " + std::to_string(batch) + " is outside [1, " + std::to_string(max_step_batch(tp)) + "]" +
        (tp > 1 ? " with tensor parallelism (each rank's tiles hold 2 x batch rows)" : ""));
}

StepTiling plan_step_tiling(const ModelConfig& c, int batch, int sms, int max_split, int tp, double last_wave_cost) {
  c.validate();
  check_step_batch(batch, tp);
  if (sms < 1) bad("the GPU's SM count " + std::to_string(sms) + " must be >= 1");
  const int rows = step_act_rows(batch, tp);
  const int64_t d = c.hidden_size, f = c.intermediate_size, qkv = c.q_dim() + 2 * c.kv_dim();
  StepTiling t;
  // qkv, o_proj and down add their slices into a buffer (the QKV sums, the residual stream): up to
  // kMaxWriterSlices. Gate/up and the LM head reduce theirs: up to kMaxStepSlices.
  t.qkv = plan_gemm(qkv, d, sm90::kTileRows, rows, sms, max_split, kMaxWriterSlices);
  t.o_proj = plan_gemm(d, c.q_dim(), sm90::kTileRows, rows, sms, max_split, kMaxWriterSlices);
  t.gate_up = plan_gemm(f, d, sm90::kTileRows / 2, rows, sms, max_split, kMaxStepSlices);
  if (last_wave_cost > 0 && t.gate_up.split_k == 1)
    t.gate_up_whole = split_last_wave(t.gate_up, f, d, sms, max_split, last_wave_cost);
  t.down = plan_gemm(d, f, sm90::kTileRows, rows, sms, max_split, kMaxWriterSlices);
  t.lm_head = plan_gemm(c.vocab_size, d, sm90::kTileRows, rows, sms, max_split, kMaxStepSlices);
  t.attention_tiles = std::min(sms, kernels::kDecodeMaxTiles);
  t.embed_cols = std::min<int64_t>(d, 512);
  return t;
}

int64_t oproj_slice_cols(const StepGraph& g) {
  const Op& o = g.graph.op(g.layers.at(0).op_o_proj);
  const int64_t bk = o.tiling.bk;  // whole stages, as the kernel's slice_start
  int64_t cols = 0;
  for (int64_t ks = 0; ks < o.tiling.split_k; ++ks)
    cols = std::max(cols, ((o.k_begin(ks + 1) + bk - 1) / bk - (o.k_begin(ks) + bk - 1) / bk) * bk);
  return cols;
}

bool oproj_merges_pairs(const StepGraph& g, int batch, int max_batch) {
  const int64_t rows = g.graph.op(g.layers.at(0).op_o_proj).tiling.bm;
  return batch <= max_batch && rows <= 32 && batch * oproj_slice_cols(g) <= kOprojMergeCols;
}

StepGraph build_step_graph(const ModelConfig& c, const DecodeStepShape& s, const std::vector<int>& seq_lens,
                           const std::vector<int>& page_table, const StepTiling& t) {
  c.validate();
  if (s.tp < 1) bad("tensor-parallel ranks " + std::to_string(s.tp) + " must be >= 1");
  check_step_batch(s.batch, s.tp);
  // Within its window a sliding-window model attends to the whole cache, as the step does.
  if (c.sliding_window > 0 && s.max_seq_len > c.sliding_window)
    bad("max_seq_len " + std::to_string(s.max_seq_len) + " is over the model's sliding_window " +
        std::to_string(c.sliding_window) + ": past it the model attends to the last " +
        std::to_string(c.sliding_window) + " positions only, which the step does not model");
  if (int64_t(seq_lens.size()) != s.batch)
    bad("seq_lens has " + std::to_string(seq_lens.size()) + " entries for batch " + std::to_string(s.batch));
  std::vector<int> after(seq_lens);
  for (int b = 0; b < s.batch; ++b) {
    if (seq_lens[b] < 0) bad("seq_lens[" + std::to_string(b) + "] = " + std::to_string(seq_lens[b]) + " is negative");
    if (seq_lens[b] >= s.max_seq_len)
      bad("sequence " + std::to_string(b) + " holds " + std::to_string(seq_lens[b]) +
          " tokens: the new one does not fit max_seq_len " + std::to_string(s.max_seq_len));
    after[b] = seq_lens[b] + 1;
  }
  const DecodeAttentionShape as = s.attention(c);
  validate_decode_attention(as, after, page_table);  // heads, group, head_dim, the page table

  StepGraph g;
  TileGraph& G = g.graph;
  const int64_t B = s.batch, d = c.hidden_size, f = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), Hkv = c.num_kv_heads;
  const int64_t cache_rows = s.layout == KvLayout::Paged ? int64_t(s.pool_pages()) * Hkv * s.page_size
                                                         : B * Hkv * s.max_seq_len;
  auto cache_row = [&](int64_t b, int64_t h, int64_t tok) -> int64_t {
    if (s.layout == KvLayout::Contiguous) return (b * Hkv + h) * s.max_seq_len + tok;
    const int page = page_table[b * s.pages_per_seq() + tok / s.page_size];
    return (int64_t(page) * Hkv + h) * s.page_size + tok % s.page_size;
  };
  const DecodePlan plan = plan_decode(after, c.num_kv_heads, t.attention_tiles);

  g.tokens = G.add_tensor("tokens", B, 1, 4, TensorRole::Input);
  g.embed_table = G.add_tensor("embed_tokens", V, d, 2, TensorRole::Weight);
  // The residual stream is fp32; its norm consumers sum its rows' squares as they read whole rows
  // (decode_step_sm90.hpp), so the graph has no sums-of-squares tensors.
  int x = G.add_tensor("x0", B, d, 4, TensorRole::Intermediate);
  g.op_embed = G.add_embed("embed", g.tokens, g.embed_table, x, t.embed_cols);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    StepGraph::Layer L;
    L.x = x;
    L.w_qkv = G.add_tensor(p + "w_qkv", qd + 2 * kvd, d, 2, TensorRole::Weight);
    if (c.qkv_bias) L.b_qkv = G.add_tensor(p + "b_qkv", 1, qd + 2 * kvd, 2, TensorRole::Weight);
    L.qkv = G.add_tensor(p + "qkv", B, qd + 2 * kvd, 2, TensorRole::Intermediate);
    L.k_cache = G.add_tensor(p + "k_cache", cache_rows, D, 2, TensorRole::Input);
    L.v_cache = G.add_tensor(p + "v_cache", cache_rows, D, 2, TensorRole::Input);
    L.attn = G.add_tensor(p + "attn", B, qd, 2, TensorRole::Intermediate);
    L.w_o = G.add_tensor(p + "w_o", d, qd, 2, TensorRole::Weight);
    L.x_mid = G.add_tensor(p + "x_mid", B, d, 4, TensorRole::Intermediate);
    L.w_gate_up = G.add_tensor(p + "w_gate_up", 2 * f, d, 2, TensorRole::Weight);
    L.h = G.add_tensor(p + "h", B, f, 2, TensorRole::Intermediate);
    L.w_down = G.add_tensor(p + "w_down", d, f, 2, TensorRole::Weight);
    const int x_out = G.add_tensor("x" + std::to_string(l + 1), B, d, 4, TensorRole::Intermediate);

    GemmExtras qx;
    qx.bias = L.b_qkv;
    // The new k and v of a QKV tile's KV heads reach the caches at each sequence's new position: the
    // kernel's QKV tiles add them into a sums buffer and the attention tile holding the new row appends
    // them (decode_step_sm90.hpp); the graph has the QKV tiles write that row, which gives every
    // attention tile the same producers and the model the same bytes (one row per pair).
    L.op_qkv = G.add_gemm_ex(p + "qkv", OpKind::Gemm, L.x, L.w_qkv, L.qkv, t.qkv, qx, {L.k_cache, L.v_cache}, [&](Tile& tile) {
      const int64_t c0 = tile.tn * t.qkv.bn, c1 = std::min(qd + 2 * kvd, c0 + t.qkv.bn);
      for (int64_t col = std::max(c0, qd) / D * D; col < c1; col += D) {
        const bool is_k = col < qd + kvd;
        const int64_t h = (col - qd - (is_k ? 0 : kvd)) / D;
        // The 16-token unit holding the new row (the model's blocks of the cache are units: see the
        // attention's kv_granule), clipped to the cache.
        for (int64_t b = 0; b < B; ++b) {
          const int64_t unit0 = seq_lens[b] / kUnit * kUnit, unit1 = std::min<int64_t>(unit0 + kUnit, s.max_seq_len);
          const int64_t r = cache_row(b, h, unit0);
          tile.writes.push_back({is_k ? L.k_cache : L.v_cache, r, r + (unit1 - unit0), 0, D});
        }
      }
    });
    DecodeAttentionTensorIds at;
    at.q = L.qkv, at.k_cache = L.k_cache, at.v_cache = L.v_cache, at.out = L.attn;
    L.op_attention = G.add_decode_attention(p + "attention", as, after, page_table, plan, at, kUnit);

    // Under tensor parallelism o_proj and down write the rank's part of the stream (rank 0's with the
    // residual), and an all-reduce per 128 columns sums the parts into the stream.
    auto part_of = [&](int x_full, const std::string& name) {
      return s.tp > 1 ? G.add_tensor(name + ".part", B, d, 4, TensorRole::Intermediate) : x_full;
    };
    GemmExtras ox;
    ox.residual = L.x;
    const int mid_part = part_of(L.x_mid, p + "x_mid");
    L.op_o_proj = G.add_gemm_ex(p + "o_proj", OpKind::Gemm, L.attn, L.w_o, mid_part, t.o_proj, ox);
    if (s.tp > 1) L.op_o_proj_reduce = G.add_all_reduce(p + "o_proj.all_reduce", mid_part, L.x_mid, s.tp, sm90::kTileRows);
    GemmExtras gx;
    L.op_gate_up = G.add_gemm_ex(p + "gate_up", OpKind::GemmSiluMul, L.x_mid, L.w_gate_up, L.h, t.gate_up, gx);
    GemmExtras dx;
    dx.residual = L.x_mid;
    const int out_part = part_of(x_out, "x" + std::to_string(l + 1));
    L.op_down = G.add_gemm_ex(p + "down", OpKind::Gemm, L.h, L.w_down, out_part, t.down, dx);
    if (s.tp > 1) L.op_down_reduce = G.add_all_reduce(p + "down.all_reduce", out_part, x_out, s.tp, sm90::kTileRows);
    g.layers.push_back(L);
    x = x_out;
  }
  g.x_final = x;
  g.w_lm = G.add_tensor("lm_head", V, d, 2, TensorRole::Weight);
  g.logits = G.add_tensor("logits", B, V, 4, TensorRole::Output);
  // Running maxima of the logits, one 64-bit (value, index) key per row. Under tensor parallelism each
  // rank's LM head keeps the maxima of its vocabulary block (global indices), and an all-reduce (max)
  // of the keys gives every rank the step's tokens.
  g.maxima = G.add_tensor("logits.max", B, 2, 4, TensorRole::Intermediate);
  const int maxima_part = s.tp > 1 ? G.add_tensor("logits.max.part", B, 2, 4, TensorRole::Intermediate) : g.maxima;
  GemmExtras lx;
  g.op_lm_head = G.add_gemm_ex("lm_head", OpKind::Gemm, g.x_final, g.w_lm, g.logits, t.lm_head, lx, {maxima_part},
                               [&](Tile& tile) { tile.writes.push_back({maxima_part, 0, B, 0, 2}); });
  if (s.tp > 1) g.op_maxima_reduce = G.add_all_reduce("lm_head.max_reduce", maxima_part, g.maxima, s.tp, 2);
  g.next = G.add_tensor("next_tokens", B, 1, 4, TensorRole::Output);
  g.op_sample = G.add_sample("sample", g.maxima, g.next);
  return g;
}

std::map<int, SyncSpec> step_sync_policy(const StepGraph& g) {
  std::map<int, SyncSpec> p;
  for (int op = 0; op < static_cast<int>(g.graph.ops().size()); ++op) p[op] = {SyncPolicy::Row, 1};
  for (const auto& L : g.layers) {
    p[L.op_gate_up] = {SyncPolicy::Tile, 1};
    // Under tensor parallelism o_proj's and down's readers are the all-reduce tiles, 128 columns each:
    // each waits for its own columns' tiles, so the reductions start while the op's stragglers run.
    if (L.op_o_proj_reduce >= 0) p[L.op_o_proj] = {SyncPolicy::Tile, 1};
    if (L.op_down_reduce >= 0) p[L.op_down] = {SyncPolicy::Tile, 1};
  }
  return p;
}

int64_t step_floor_bytes(const ModelConfig& c, const std::vector<int>& seq_lens) {
  std::vector<int> after(seq_lens);
  for (int& l : after) ++l;
  return c.decode_weight_bytes() + c.kv_bytes(after);
}

StepCollectives step_collectives(const ModelConfig& c, int tp, int batch) {
  tensor_parallel_shard(c, tp);  // the same checks
  if (batch < 1) bad("batch " + std::to_string(batch) + " must be >= 1");
  StepCollectives k;
  if (tp == 1) return k;
  k.all_reduces = 2 * c.num_layers;
  k.all_reduce_bytes = int64_t(batch) * c.hidden_size * 4;
  k.max_reduces = 1;
  k.max_reduce_bytes = int64_t(batch) * 8;
  k.link_bytes = k.all_reduces * (2 * (tp - 1) * k.all_reduce_bytes / tp) + k.max_reduces * (2 * (tp - 1) * k.max_reduce_bytes / tp);
  return k;
}

std::vector<StepSegment> step_segments(const StepGraph& g, const Schedule& s) {
  const TileGraph& G = g.graph;
  validate(G, s);
  std::vector<StepSegment> out(1);
  const int n = static_cast<int>(s.order.size());
  for (int i = 0; i < n;) {
    const int op = G.tile(s.order[i]).op;
    if (G.op(op).kind != OpKind::AllReduce) {
      ++i;
      continue;
    }
    // The collective's tiles run on the host's stream between two launches: they must be one run of tickets.
    const Op& r = G.op(op);
    out.back().end = i;
    out.back().collective = op;
    int j = i;
    while (j < n && G.tile(s.order[j]).op == op) ++j;
    if (j - i != r.num_tiles)
      bad("order '" + s.name + "' interleaves the tiles of collective '" + r.name + "' with other tiles (" +
          std::to_string(j - i) + " of its " + std::to_string(r.num_tiles) + " in a row)");
    out.push_back({j, n, -1});
    i = j;
  }
  out.back().end = n;
  return out;
}

}  // namespace tw
