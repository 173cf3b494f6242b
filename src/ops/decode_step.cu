// DecodeStep: validation, the step's graph, schedule and executor plan, the device buffers (packed
// weights, act-layout activations, caches, state), weight loading, and the launch of
// decode_step_kernel.cuh.
#include "tileweave/ops/decode_step.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "decode_step_sm90.hpp"
#include "ffn_sm90.hpp"
#include "tileweave/kernels/attention/decode_units.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace tw {

namespace {

using bf16 = __nv_bfloat16;
using step::StepOpArgs;

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("decode step: " + what); }

// Elements of an act-layout buffer holding `cols` columns for tiles of `rows` rows: K padded with zeros
// to whole stages (3 or 4 atoms at 8-32 rows, where the packed weights' last stage may hold fewer: the
// kernel's issue_weights copies zeros for the rest, and the stage's activations there must be zeros too).
int64_t act_elems(int rows, int64_t cols) {
  const int64_t stage = sm90::step_stage_cols(rows) / 64, atoms = ffn_sm90::packed_atoms(cols);
  return int64_t(rows) * ((atoms + stage - 1) / stage * stage) * 64;
}
// Elements of a packed weight [rows, cols] (pairs: rows pairs of [first; second] halves).
int64_t packed_elems(int64_t rows, int64_t cols, bool pairs) {
  return ffn_sm90::packed_tiles(rows, pairs) * ffn_sm90::packed_atoms(cols) * ffn_sm90::kTileRows * 64;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform values of the given standard deviation (benchmark weights and caches; no host copy).
__global__ void fill_random_kernel(bf16* p, int64_t n, uint64_t seed, float amp) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t x = seed ^ (uint64_t(i) * 0xD1B54A32D192ED03ull);
    x = (x ^ (x >> 33)) * 0xFF51AFD7ED558CCDull;
    x = (x ^ (x >> 33)) * 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    p[i] = __float2bfloat16(amp * (float(x >> 40) * (2.f / 16777216.f) - 1.f));
  }
}
void fill_random(bf16* p, int64_t n, uint64_t seed, float std, cudaStream_t s) {
  if (n <= 0) return;
  fill_random_kernel<<<1024, 256, 0, s>>>(p, n, seed, std * std::sqrt(3.f));
  TW_CUDA_CHECK_LAUNCH();
}

int device_sms(int* major) {
  int dev = 0, sms = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, dev));
  return sms;
}

}  // namespace

struct DecodeStep::Buffers {
  std::vector<void*> allocs;
  template <class T>
  T* alloc(int64_t n) {  // zeroed
    void* p = nullptr;
    TW_CUDA_CHECK(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)));
    TW_CUDA_CHECK(cudaMemset(p, 0, std::max<int64_t>(n, 1) * sizeof(T)));
    allocs.push_back(p);
    return static_cast<T*>(p);
  }
  ~Buffers() {
    for (void* p : allocs) cudaFree(p);
  }
  struct Layer {
    bf16 *w_qkv, *w_o, *w_gate_up, *w_down, *bias;
    bf16 *h, *attn, *k_cache, *v_cache;
  };
  std::vector<Layer> layers;
  float* xres = nullptr;  // the residual stream's buffers (decode_step_sm90.hpp)
  int64_t xres_elems = 0;
  bf16* xa = nullptr;  // batches above 32: the stream's bf16 copies and their sums of squares (StepParams::xa)
  int64_t xa_stride = 0;
  float* xss = nullptr;
  int32_t x_atoms = 0;
  float* qkv_acc = nullptr;  // [B][q|k|v] sums, then [B][4] sums of squares (StepParams::qkv_acc)
  int64_t qkv_acc_elems = 0;
  bf16 *embed = nullptr, *w_lm = nullptr;
  unsigned long long* maxima = nullptr;
  float *o_part = nullptr, *lse_part = nullptr, *logits = nullptr;
  int32_t *merge_count = nullptr, *page_table = nullptr, *tokens = nullptr, *seq_lens = nullptr, *active = nullptr,
          *history = nullptr;
  std::vector<float*> ws;  // split-K partials of each op (null: unsplit)
  std::vector<int64_t> ws_elems;
  StepOpArgs* ops = nullptr;
  bf16* zero_atoms = nullptr;
  step::StepParams params{};
  std::vector<step::StepParams> segment_params;  // params with each segment's ticket range and signals
  char* exchange = nullptr;  // collectives in the launch: this rank's exchange region (decode_step_sm90.hpp)
  int64_t exchange_bytes = 0, maxima_offset = 0, flags_offset = 0;  // [xres | maxima | flags]
  int64_t cache_elems = 0;  // per layer and K or V
};

DecodeStep::DecodeStep(const ModelConfig& c, const DecodeStepOptions& opt) : model_(c), opt_(opt) {
  // Host checks first: nothing touches the GPU before the config and the options are valid.
  model_.validate();
  cfg_ = tensor_parallel_shard(model_, opt.tp);  // the tp count's checks (heads, FFN, vocabulary divisible)
  if (opt.rank < 0 || opt.rank >= opt.tp)
    bad("rank " + std::to_string(opt.rank) + " is outside [0, tp = " + std::to_string(opt.tp) + ")");
  if (cfg_.head_dim != 64 && cfg_.head_dim != 128) bad("head_dim " + std::to_string(cfg_.head_dim) + " is not 64 or 128");
  if (cfg_.num_q_heads > step::kMaxGroup * cfg_.num_kv_heads)
    bad(std::to_string(cfg_.num_q_heads / cfg_.num_kv_heads) + " query heads per KV head: the step's attention takes at most " +
        std::to_string(step::kMaxGroup));
  if (cfg_.hidden_size % 8 || cfg_.intermediate_size % 8)
    bad("hidden_size " + std::to_string(cfg_.hidden_size) + " and intermediate_size " +
        std::to_string(cfg_.intermediate_size) + (opt.tp > 1 ? " (each of " + std::to_string(opt.tp) + " ranks' share)" : "") +
        " must be multiples of 8");
  check_step_batch(opt.batch, opt.tp);
  {  // residual_at's int index: blocks x batch x columns of the stream
    const int64_t x_cols = sm90::step_stage_cols(step_act_rows(opt.batch, opt.tp));
    if ((cfg_.hidden_size + x_cols - 1) / x_cols * x_cols * opt.batch >= (int64_t(1) << 31))
      bad("hidden_size " + std::to_string(cfg_.hidden_size) + " x batch " + std::to_string(opt.batch) +
          " is over 2^31 elements of the residual stream");
  }
  if (opt.max_seq_len < 1) bad("max_seq_len " + std::to_string(opt.max_seq_len) + " must be >= 1");
  if (opt.history < 0) bad("history " + std::to_string(opt.history) + " must be >= 0");
  if (opt.sms < 0) bad("sms " + std::to_string(opt.sms) + " must be >= 0");
  if (opt.hold_every_tile_max_batch < 0)
    bad("hold_every_tile_max_batch " + std::to_string(opt.hold_every_tile_max_batch) + " must be >= 0");
  if (opt.oproj_merge_max_batch < 0)
    bad("oproj_merge_max_batch " + std::to_string(opt.oproj_merge_max_batch) + " must be >= 0");
  if (opt.attention_warp_segments < 0)
    bad("attention_warp_segments " + std::to_string(opt.attention_warp_segments) + " must be >= 0");
  if (!(opt.last_wave_cost >= 0))
    bad("last_wave_cost " + std::to_string(opt.last_wave_cost) + " must be >= 0 (0: gate/up's last wave unsplit)");
  if (opt.collectives_in_launch && opt.tp > step::kMaxRanks)
    bad("tp " + std::to_string(opt.tp) + " with the collectives in the launch: at most " + std::to_string(step::kMaxRanks) + " ranks");
  shape_.batch = opt.batch;
  shape_.layout = opt.layout;
  shape_.max_seq_len = opt.max_seq_len;
  shape_.page_size = opt.page_size;
  shape_.num_pages = opt.num_pages;
  shape_.tp = opt.tp;
  if (opt.layout == KvLayout::Paged) {
    if (opt.page_size < 16 || opt.page_size % 16) bad("page_size " + std::to_string(opt.page_size) + " is not a positive multiple of 16");
    if (opt.num_pages < 0) bad("num_pages " + std::to_string(opt.num_pages) + " must be >= 0");
  }
  int major = 0;
  const int device = device_sms(&major), sms = opt.sms > 0 ? std::min(opt.sms, device) : device;
  if (major != 9) bad("needs an sm_90 GPU (H100/H200); this one is sm_" + std::to_string(major) + "x");

  // The plan's graph: every cache full, so the attention gets its most tiles (P); the executor's
  // tables do not depend on the lengths (one counter per op: step_sync_policy).
  tiling_ = plan_step_tiling(cfg_, opt.batch, sms, opt.max_split, opt.tp, opt.last_wave_cost);
  const int pps = shape_.pages_per_seq(), pool = shape_.pool_pages();
  std::vector<int> table;
  if (opt.layout == KvLayout::Paged) {
    table.resize(size_t(opt.batch) * pps);
    for (size_t i = 0; i < table.size(); ++i) table[i] = int(i % size_t(pool));
  }
  g_ = build_step_graph(cfg_, shape_, std::vector<int>(opt.batch, int(opt.max_seq_len - 1)), table, tiling_);
  sched_ = make_order(g_.graph, opt.order);
  const bool in_launch = opt.tp > 1 && opt.collectives_in_launch;
  segs_ = in_launch ? std::vector<StepSegment>{{0, g_.graph.num_tiles(), -1}} : step_segments(g_, sched_);
  ExecPlan plan = make_exec_plan(g_.graph, sched_, step_sync_policy(g_));
  if (tiling_.gate_up_whole > 0) {  // the whole waves' gate/up tiles: one ticket over their K slices
    std::vector<char> gate_up(g_.graph.ops().size(), 0);
    for (const auto& l : g_.layers) gate_up[l.op_gate_up] = 1;
    const std::vector<int> moved = run_slices_whole(
        plan, g_.graph, [&](const Tile& t) { return gate_up[t.op] && t.tn < tiling_.gate_up_whole; });
    for (StepSegment& s : segs_) s.begin = moved[s.begin], s.end = moved[s.end];
  }
  act_rows_ = step_act_rows(opt.batch, opt.tp);
  // Sets the kernel's shared-memory attribute and checks that one CTA fits an SM.
  if (cfg_.head_dim == 64) step::prepare_kernel_d64(act_rows_);
  else step::prepare_kernel_d128(act_rows_);
  grid_ = sms;
  plan_ = std::make_unique<runtime::DevicePlan>(plan, int(segs_.size()));
  if (opt.trace) plan_->enable_trace();

  // Buffers.
  buf_ = std::make_unique<Buffers>();
  Buffers& b = *buf_;
  const int R = act_rows_, B = opt.batch, L = cfg_.num_layers, D = cfg_.head_dim;
  const int64_t d = cfg_.hidden_size, f = cfg_.intermediate_size, V = cfg_.vocab_size;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), qkv = qd + 2 * kvd, Hkv = cfg_.num_kv_heads;
  const int G = cfg_.num_q_heads / cfg_.num_kv_heads;
  b.cache_elems = (opt.layout == KvLayout::Paged ? int64_t(pool) * opt.page_size : int64_t(B) * opt.max_seq_len) * Hkv * D;
  const int x_cols = sm90::step_stage_cols(R), x_blocks = int((d + x_cols - 1) / x_cols);
  b.xres_elems = step::kResidualBuffers * int64_t(x_blocks) * B * x_cols;
  // Collectives in the launch: the stream lives in the exchange region (below) instead.
  if (!(opt.tp > 1 && opt.collectives_in_launch)) b.xres = b.alloc<float>(b.xres_elems);
  if (step_bf16_stream(B, opt.tp)) {
    b.xa_stride = act_elems(R, d);
    b.xa = b.alloc<bf16>(step::kResidualBuffers * b.xa_stride);  // zero: the columns past d stay zero
    b.x_atoms = int32_t(ffn_sm90::packed_atoms(d));
    b.xss = b.alloc<float>(int64_t(step::kResidualBuffers) * b.x_atoms * B);
  }
  b.qkv_acc_elems = int64_t(B) * (qkv + 4);
  b.qkv_acc = b.alloc<float>(b.qkv_acc_elems);
  b.zero_atoms = b.alloc<bf16>(2 * ffn_sm90::kTileRows * 64);  // zeroed (StepParams::zero_atoms)
  for (int l = 0; l < L; ++l) {
    Buffers::Layer y{};
    y.w_qkv = b.alloc<bf16>(packed_elems(qkv, d, false));
    y.w_o = b.alloc<bf16>(packed_elems(d, qd, false));
    y.w_gate_up = b.alloc<bf16>(packed_elems(f, d, true));
    y.w_down = b.alloc<bf16>(packed_elems(d, f, false));
    y.bias = cfg_.qkv_bias ? b.alloc<bf16>(qkv) : nullptr;
    y.h = b.alloc<bf16>(act_elems(R, f));
    y.attn = b.alloc<bf16>(act_elems(R, qd));
    y.k_cache = b.alloc<bf16>(b.cache_elems);
    y.v_cache = b.alloc<bf16>(b.cache_elems);
    b.layers.push_back(y);
  }
  b.embed = b.alloc<bf16>(model_.vocab_size * d);
  b.w_lm = b.alloc<bf16>(packed_elems(V, d, false));
  // Collectives in the launch: the exchange region [stream | LM-head keys | flags] (decode_step_sm90.hpp).
  const int flag_tiles = int((d + ffn_sm90::kTileRows - 1) / ffn_sm90::kTileRows);
  const int64_t xres_bytes = b.xres_elems * 4, maxima_bytes = 2 * int64_t(B) * 8;
  const int64_t flags_bytes = int64_t(step::kResidualBuffers) * flag_tiles * opt.tp * 4;
  if (in_launch) {
    b.maxima_offset = xres_bytes;
    b.flags_offset = xres_bytes + maxima_bytes;
    b.exchange_bytes = b.flags_offset + flags_bytes;
    b.exchange = b.alloc<char>(b.exchange_bytes);
    b.xres = reinterpret_cast<float*>(b.exchange);
    b.maxima = reinterpret_cast<unsigned long long*>(b.exchange + b.maxima_offset);
  } else {
    b.maxima = b.alloc<unsigned long long>(2 * B);
  }
  const int P = tiling_.attention_tiles = g_.graph.op(g_.layers[0].op_attention).num_tiles;
  b.o_part = b.alloc<float>(int64_t(P) * 2 * G * D);
  b.lse_part = b.alloc<float>(int64_t(P) * 2 * G);
  b.merge_count = b.alloc<int32_t>(int64_t(B) * Hkv);
  oproj_merges_ = oproj_merges_pairs(g_, B, opt.oproj_merge_max_batch);  // o_proj merges the split pairs
  b.page_table = opt.layout == KvLayout::Paged ? b.alloc<int32_t>(int64_t(B) * pps) : nullptr;
  b.tokens = b.alloc<int32_t>(B);
  b.seq_lens = b.alloc<int32_t>(B);
  b.active = b.alloc<int32_t>(B);
  b.history = opt.history > 0 ? b.alloc<int32_t>(int64_t(opt.history) * B) : nullptr;
  b.logits = opt.keep_logits ? b.alloc<float>(int64_t(B) * V) : nullptr;
  lengths_.assign(B, 0);
  active_.assign(B, 1);
  set_active({});
  if (opt.layout == KvLayout::Paged && pool >= B * pps) {
    std::vector<int> identity(size_t(B) * pps);
    for (size_t i = 0; i < identity.size(); ++i) identity[i] = int(i);
    set_page_table(identity);
  }

  // The ops' arguments, in graph order.
  const TileGraph& G_ = g_.graph;
  std::vector<StepOpArgs> ops(G_.ops().size());
  b.ws.assign(ops.size(), nullptr);
  b.ws_elems.assign(ops.size(), 0);
  auto gemm = [&](int op, int kind, const bf16* w, const bf16* act, int x_in, int x_out) {
    const Op& o = G_.op(op);
    StepOpArgs a{};
    a.kind = kind;
    a.n = int32_t(o.n);
    a.k = int32_t(o.k);
    a.grid_n = int32_t(o.grid_n);
    a.split = int32_t(o.tiling.split_k);
    if (a.split > step::kMaxSlices)
      bad("op '" + o.name + "' has " + std::to_string(a.split) + " K slices, over " + std::to_string(step::kMaxSlices));
    a.packed_atoms = int32_t(ffn_sm90::packed_atoms(o.k));
    a.w = w;
    a.act = act;
    a.x_in = x_in;
    a.x_out = x_out;
    const int64_t step_cols = o.tiling.bk;
    for (int64_t ks = 0; ks <= o.tiling.split_k; ++ks) a.slice_start[ks] = int16_t((o.k_begin(ks) + step_cols - 1) / step_cols);
    if (a.split > 1 && kind != step::kResidual && kind != step::kQkv) {  // those add into the stream / qkv_acc
      // One fragment-order block per output tile, then each tile's partial sums of squares.
      b.ws_elems[op] = o.grid_n * int64_t(ffn_sm90::kTileRows) * R + o.grid_n * int64_t(R);
      b.ws[op] = b.alloc<float>(b.ws_elems[op]);
      a.ws = b.ws[op];
    }
    return a;
  };
  {
    StepOpArgs& e = ops[g_.op_embed];
    e.kind = step::kEmbed;
    e.n = int32_t(d);
    e.cols = int32_t(tiling_.embed_cols);
    e.x_in = -1;
    e.x_out = 0;
  }
  for (int l = 0; l < L; ++l) {
    const auto& gl = g_.layers[l];
    const Buffers::Layer& y = b.layers[l];
    ops[gl.op_qkv] = gemm(gl.op_qkv, step::kQkv, y.w_qkv, nullptr, 2 * l, -1);
    StepOpArgs& at = ops[gl.op_attention];
    at.kind = step::kAttention;
    at.x_in = at.x_out = -1;
    at.bias = y.bias;
    at.out = y.attn;
    at.k_cache = y.k_cache;
    at.v_cache = y.v_cache;
    StepOpArgs& o = ops[gl.op_o_proj] = gemm(gl.op_o_proj, step::kResidual, y.w_o, y.attn, 2 * l, 2 * l + 1);
    o.zero = b.qkv_acc;
    o.zero_elems = int32_t(b.qkv_acc_elems);
    o.merges = oproj_merges_;
    StepOpArgs& gu = ops[gl.op_gate_up] = gemm(gl.op_gate_up, step::kGateUp, y.w_gate_up, nullptr, 2 * l + 1, -1);
    gu.out = y.h;
    ops[gl.op_down] = gemm(gl.op_down, step::kResidual, y.w_down, y.h, 2 * l + 1, 2 * l + 2);
  }
  ops[g_.op_lm_head] = gemm(g_.op_lm_head, step::kLmHead, b.w_lm, nullptr, 2 * L, -1);
  ops[g_.op_sample].kind = step::kSample;
  ops[g_.op_sample].x_in = ops[g_.op_sample].x_out = -1;
  auto all_reduce = [&](int op, int writer) {  // tiles of the launch only with the collectives in it
    if (op < 0) return;
    StepOpArgs& a = ops[op];
    a.kind = step::kAllReduce;  // its tile tn is the flag's column block (the graph's 128 columns)
    a.x_in = -1;
    a.x_out = writer;
  };
  for (int l = 0; l < L; ++l) {
    all_reduce(g_.layers[l].op_o_proj_reduce, 2 * l + 1);
    all_reduce(g_.layers[l].op_down_reduce, 2 * l + 2);
  }
  all_reduce(g_.op_maxima_reduce, -1);
  b.ops = b.alloc<StepOpArgs>(int64_t(ops.size()));
  TW_CUDA_CHECK(cudaMemcpy(b.ops, ops.data(), ops.size() * sizeof(StepOpArgs), cudaMemcpyHostToDevice));

  step::StepParams& p = b.params;
  p.ep = plan_->params(opt.spin_limit, opt.delay_ns);
  p.ops = b.ops;
  p.batch = B;
  p.act_rows = R;
  p.hidden = int32_t(d);
  p.vocab = int32_t(V);
  p.q_dim = int32_t(qd);
  p.num_kv_heads = int32_t(Hkv);
  p.group = G;
  p.eps = float(cfg_.rms_norm_eps);
  p.scale_log2 = float(1.0 / std::sqrt(double(D)) * 1.4426950408889634);
  p.max_seq_len = opt.layout == KvLayout::Paged ? 0 : opt.max_seq_len;
  p.page_size = opt.layout == KvLayout::Paged ? opt.page_size : 0;
  p.pages_per_seq = opt.layout == KvLayout::Paged ? pps : 0;
  p.page_table = b.page_table;
  p.attn_tiles = P;
  {  // 16-token units of K and V per tile, at least (attention_tiles_for)
    const int64_t unit_bytes = int64_t(kernels::kDecodeStageTokens) * D * 2 * 2;
    p.attn_min_units = opt.attention_min_tile_bytes > 0
                           ? int32_t(std::max<int64_t>(1, opt.attention_min_tile_bytes / unit_bytes))
                           : step::kMinAttentionUnits;
  }
  p.attn_warp_segments = opt.attention_warp_segments;
  p.hold_kinds = 1 << step::kResidual;
  if (B <= opt.hold_every_tile_max_batch)
    p.hold_kinds |= (1 << step::kQkv) | (1 << step::kAttention) | (1 << step::kGateUp);
  p.o_part = b.o_part;
  p.lse_part = b.lse_part;
  p.merge_count = b.merge_count;
  p.oproj_merges = oproj_merges_;
  p.tokens = b.tokens;
  p.seq_lens = b.seq_lens;
  p.active = b.active;
  p.history = b.history;
  p.history_len = opt.history;
  p.embed = b.embed;
  p.embed_vocab = int32_t(model_.vocab_size);
  p.add_residual = opt.rank == 0;
  p.vocab_offset = int32_t(int64_t(opt.rank) * V);
  p.maxima = b.maxima;
  p.logits = b.logits;
  p.xres = b.xres;
  p.x_cols = x_cols;
  p.x_blocks = x_blocks;
  p.writers = 2 * L + 1;
  p.bf16_stream = b.xa != nullptr;
  p.xa = b.xa;
  p.xa_stride = b.xa_stride;
  p.xss = b.xss;
  p.x_atoms = b.x_atoms;
  p.qkv_acc = b.qkv_acc;
  p.qkv_ss = b.qkv_acc + int64_t(B) * qkv;
  p.zero_atoms = b.zero_atoms;
  p.qkv_cols = int32_t(qkv);
  const std::vector<float> inv = cfg_.rope_inv_freq();
  std::copy(inv.begin(), inv.end(), p.inv_freq);
  p.rank = opt.rank;
  p.ranks = opt.tp;
  if (in_launch) {
    p.push = 1;
    p.flags = reinterpret_cast<uint32_t*>(b.exchange + b.flags_offset);
    p.flag_tiles = flag_tiles;
    p.region[opt.rank] = b.exchange;
  }
  make_segment_params();
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

// One launch per segment, each with its own launch state (an epoch that counts steps); a launch after
// a collective first counts the collective's tiles done (StepParams::signal_tiles: their ids are the
// tickets between the two segments).
void DecodeStep::make_segment_params() {
  Buffers& b = *buf_;
  const int32_t* order = plan_->params().order;
  b.segment_params.clear();
  for (size_t i = 0; i < segs_.size(); ++i) {
    step::StepParams q = b.params;
    q.ep = plan_->params_range(segs_[i].begin, segs_[i].end, int(i), opt_.spin_limit, opt_.delay_ns);
    if (i > 0) {
      q.signal_tiles = order + segs_[i - 1].end;
      q.num_signal_tiles = segs_[i].begin - segs_[i - 1].end;
    }
    b.segment_params.push_back(q);
  }
}

void* DecodeStep::exchange_region() const { return buf_->params.push ? buf_->params.xres : nullptr; }
int64_t DecodeStep::exchange_bytes() const { return buf_->exchange_bytes; }

void DecodeStep::set_exchange_alone() {
  set_exchange(std::vector<void*>(opt_.tp, exchange_region()));
  // Flags of 0x7F7F7F7F pass every wait (instance numbers stay far below); this rank's own are
  // overwritten by its tiles' releases, which its waits then pass too.
  TW_CUDA_CHECK(cudaMemset(buf_->params.flags, 0x7F, size_t(buf_->exchange_bytes - buf_->flags_offset)));
}

void DecodeStep::set_exchange(const std::vector<void*>& regions, void* local) {
  Buffers& b = *buf_;
  if (!b.exchange) bad("set_exchange: the step has no collectives in the launch (tp > 1 and collectives_in_launch)");
  if (int(regions.size()) != opt_.tp)
    bad("set_exchange: " + std::to_string(regions.size()) + " regions for " + std::to_string(opt_.tp) + " ranks");
  for (size_t q = 0; q < regions.size(); ++q)
    if (!regions[q]) bad("set_exchange: rank " + std::to_string(q) + "'s region is null");
  step::StepParams& p = b.params;
  if (local) {  // this rank's region moves (NCCL's window), holding what the step's own holds
    TW_CUDA_CHECK(cudaMemcpy(local, b.exchange, size_t(b.exchange_bytes), cudaMemcpyDeviceToDevice));
    char* base = static_cast<char*>(local);
    b.exchange = base;  // (the step's own allocation stays allocated, unused)
    b.xres = p.xres = reinterpret_cast<float*>(base);
    b.maxima = p.maxima = reinterpret_cast<unsigned long long*>(base + b.maxima_offset);
    p.flags = reinterpret_cast<uint32_t*>(base + b.flags_offset);
  }
  // regions[rank] may be another mapping of the local region (NCCL's LSA pointer to itself).
  for (size_t q = 0; q < regions.size(); ++q) p.region[q] = static_cast<char*>(regions[q]);
  make_segment_params();
  exchange_set_ = true;
}

DecodeStep::~DecodeStep() = default;

void DecodeStep::load_weights(const HostWeights& whole) {
  whole.check(model_);  // every tensor present with its size, before anything is uploaded
  // The rank's shard; the embedding table stays whole (each rank reads its B rows: no collective).
  HostWeights shard;
  if (opt_.tp > 1) shard = tensor_parallel_weights(whole, model_, opt_.tp, opt_.rank);
  const HostWeights& w = opt_.tp > 1 ? shard : whole;
  Buffers& b = *buf_;
  const int L = cfg_.num_layers;
  const int64_t d = cfg_.hidden_size, f = cfg_.intermediate_size, V = cfg_.vocab_size;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), qkv = qd + 2 * kvd;
  std::vector<uint16_t> host;
  bf16* staging = nullptr;  // one matrix at a time, before packing
  TW_CUDA_CHECK(cudaMalloc(&staging, sizeof(bf16) * std::max({qkv * d, 2 * f * d, V * d})));
  // Upload host [rows_total, cols] and pack it (pairs: rows pairs of [first; second] halves).
  auto pack = [&](int64_t rows, int64_t cols, bool pairs, bf16* dst) {
    TW_CUDA_CHECK(cudaMemcpy(staging, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    ffn_sm90::pack_weights(staging, dst, rows, cols, pairs, nullptr);
  };
  // RMSNorm folded into the next weight: W[r][c] * g[c], rounded to bf16 (the consumer scales its
  // output rows by rsqrt(mean(x^2) + eps)).
  auto fold_row = [&](const uint16_t* src, const std::vector<uint16_t>& g, int64_t cols, uint16_t* dst) {
    for (int64_t c = 0; c < cols; ++c) dst[c] = float_to_bf16(bf16_to_float(src[c]) * bf16_to_float(g[c]));
  };
  for (int l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const Buffers::Layer& y = b.layers[l];
    const auto& g_in = w.at(p + "input_layernorm.weight");
    const std::vector<uint16_t>* parts[3] = {&w.at(p + "self_attn.q_proj.weight"), &w.at(p + "self_attn.k_proj.weight"),
                                             &w.at(p + "self_attn.v_proj.weight")};
    host.assign(qkv * d, 0);
    for (int64_t row = 0; row < qkv; ++row) {  // q | k | v
      const int part = row < qd ? 0 : row < qd + kvd ? 1 : 2;
      const int64_t local = row - (part == 0 ? 0 : part == 1 ? qd : qd + kvd);
      fold_row(parts[part]->data() + local * d, g_in, d, host.data() + row * d);
    }
    pack(qkv, d, false, y.w_qkv);
    if (cfg_.qkv_bias) {
      host.clear();
      for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
        const auto& bias = w.at(p + "self_attn." + n + ".bias");
        host.insert(host.end(), bias.begin(), bias.end());
      }
      TW_CUDA_CHECK(cudaMemcpy(y.bias, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    }
    host = w.at(p + "self_attn.o_proj.weight");
    pack(d, qd, false, y.w_o);
    const auto& g_post = w.at(p + "post_attention_layernorm.weight");
    const auto& gate = w.at(p + "mlp.gate_proj.weight");
    const auto& up = w.at(p + "mlp.up_proj.weight");
    host.assign(2 * f * d, 0);
    for (int64_t r = 0; r < f; ++r) {
      fold_row(gate.data() + r * d, g_post, d, host.data() + r * d);
      fold_row(up.data() + r * d, g_post, d, host.data() + (f + r) * d);
    }
    pack(f, d, true, y.w_gate_up);
    host = w.at(p + "mlp.down_proj.weight");
    pack(d, f, false, y.w_down);
  }
  const auto& embed = whole.at("model.embed_tokens.weight");
  TW_CUDA_CHECK(cudaMemcpy(b.embed, embed.data(), embed.size() * 2, cudaMemcpyHostToDevice));
  const auto& lm = w.lm_head();
  const auto& g_final = w.at("model.norm.weight");
  host.assign(V * d, 0);
  for (int64_t r = 0; r < V; ++r) fold_row(lm.data() + r * d, g_final, d, host.data() + r * d);
  pack(V, d, false, b.w_lm);
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  TW_CUDA_CHECK(cudaFree(staging));
}

void DecodeStep::random_weights(uint64_t seed, float std) {
  Buffers& b = *buf_;
  const int64_t d = cfg_.hidden_size, f = cfg_.intermediate_size, V = cfg_.vocab_size;
  const int64_t qd = cfg_.q_dim(), qkv = qd + 2 * cfg_.kv_dim();
  uint64_t s = splitmix64(seed);
  auto fill = [&](bf16* p, int64_t n) { fill_random(p, n, s = splitmix64(s), std, nullptr); };
  for (const Buffers::Layer& y : b.layers) {
    fill(y.w_qkv, packed_elems(qkv, d, false));
    fill(y.w_o, packed_elems(d, qd, false));
    fill(y.w_gate_up, packed_elems(f, d, true));
    fill(y.w_down, packed_elems(d, f, false));
    if (y.bias) fill(y.bias, qkv);
  }
  fill(b.embed, model_.vocab_size * d);
  fill(b.w_lm, packed_elems(V, d, false));
  TW_CUDA_CHECK(cudaDeviceSynchronize());
}

void DecodeStep::fill_cache_random(uint64_t seed, cudaStream_t stream) {
  uint64_t s = splitmix64(seed ^ 0x5EED);
  for (const Buffers::Layer& y : buf_->layers) {
    fill_random(y.k_cache, buf_->cache_elems, s = splitmix64(s), 1.f, stream);
    fill_random(y.v_cache, buf_->cache_elems, s = splitmix64(s), 1.f, stream);
  }
}

void DecodeStep::set_lengths(const std::vector<int>& lengths, cudaStream_t stream) {
  if (int(lengths.size()) != opt_.batch)
    bad("set_lengths: " + std::to_string(lengths.size()) + " lengths for batch " + std::to_string(opt_.batch));
  for (int b = 0; b < opt_.batch; ++b)
    if (lengths[b] < 0 || lengths[b] >= opt_.max_seq_len)
      bad("set_lengths: length " + std::to_string(lengths[b]) + " of sequence " + std::to_string(b) +
          " is outside [0, max_seq_len - 1 = " + std::to_string(opt_.max_seq_len - 1) + "]");
  lengths_ = lengths;
  TW_CUDA_CHECK(cudaMemcpyAsync(buf_->seq_lens, lengths_.data(), lengths_.size() * 4, cudaMemcpyHostToDevice, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));  // lengths_ may change before the copy ran
}

void DecodeStep::set_page_table(const std::vector<int>& table, cudaStream_t stream) {
  if (opt_.layout != KvLayout::Paged) bad("set_page_table: the cache is contiguous");
  const int64_t n = int64_t(opt_.batch) * shape_.pages_per_seq(), pool = shape_.pool_pages();
  if (int64_t(table.size()) != n)
    bad("set_page_table: " + std::to_string(table.size()) + " entries, expected batch * pages_per_seq = " + std::to_string(n));
  for (int64_t i = 0; i < n; ++i)
    if (table[i] < 0 || table[i] >= pool)
      bad("set_page_table: entry " + std::to_string(i) + " = " + std::to_string(table[i]) + " is outside [0, " +
          std::to_string(pool) + ")");
  TW_CUDA_CHECK(cudaMemcpyAsync(buf_->page_table, table.data(), n * 4, cudaMemcpyHostToDevice, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  page_table_set_ = true;
}

void DecodeStep::set_tokens(const std::vector<int32_t>& tokens, cudaStream_t stream) {
  if (int(tokens.size()) != opt_.batch)
    bad("set_tokens: " + std::to_string(tokens.size()) + " tokens for batch " + std::to_string(opt_.batch));
  for (int b = 0; b < opt_.batch; ++b)
    if (tokens[b] < 0 || tokens[b] >= model_.vocab_size)
      bad("set_tokens: token " + std::to_string(tokens[b]) + " of sequence " + std::to_string(b) + " is outside [0, " +
          std::to_string(model_.vocab_size) + ")");
  TW_CUDA_CHECK(cudaMemcpyAsync(buf_->tokens, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void DecodeStep::set_active(const std::vector<uint8_t>& active, cudaStream_t stream) {
  if (!active.empty() && int(active.size()) != opt_.batch)
    bad("set_active: " + std::to_string(active.size()) + " flags for batch " + std::to_string(opt_.batch));
  active_ = active.empty() ? std::vector<uint8_t>(opt_.batch, 1) : active;
  std::vector<int32_t> flags(active_.begin(), active_.end());
  TW_CUDA_CHECK(cudaMemcpyAsync(buf_->active, flags.data(), flags.size() * 4, cudaMemcpyHostToDevice, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void DecodeStep::check_before_step() const {
  if (opt_.layout == KvLayout::Paged && !page_table_set_)
    bad("step: the pool has fewer pages than batch * pages_per_seq, so there is no default page table: set one");
  for (int b = 0; b < opt_.batch; ++b)
    if (lengths_[b] >= opt_.max_seq_len)
      bad("step: sequence " + std::to_string(b) + " holds " + std::to_string(lengths_[b]) +
          " tokens: its cache (max_seq_len " + std::to_string(opt_.max_seq_len) + ") has no room for the new one");
}

void DecodeStep::step(cudaStream_t stream) {
  if (segs_.size() > 1)
    bad("step: rank " + std::to_string(opt_.rank) + " of a tensor-parallel step (tp " + std::to_string(opt_.tp) +
        ") runs launch by launch between its collectives: run_segment and collective (TensorParallelLocal on one GPU, "
        "step_over_nccl over NCCL)");
  run_segment(0, stream);
}

void DecodeStep::run_segment(int i, cudaStream_t stream) {
  if (i < 0 || i >= segments())
    bad("run_segment: segment " + std::to_string(i) + " is outside [0, " + std::to_string(segments()) + ")");
  if (buf_->exchange && !exchange_set_)
    bad("step: the collectives are in the launch, and the ranks' exchange regions are not set (set_exchange)");
  if (i == 0) check_before_step();
  if (cfg_.head_dim == 64) step::launch_d64(buf_->segment_params[i], grid_, opt_.overlap_previous, stream);
  else step::launch_d128(buf_->segment_params[i], grid_, opt_.overlap_previous, stream);
  if (i + 1 < segments()) return;
  for (int b = 0; b < opt_.batch; ++b) lengths_[b] += active_[b] ? 1 : 0;
  ++launches_;
}

StepCollective DecodeStep::collective(int i) const {
  if (i < 0 || i + 1 >= segments())
    bad("collective: segment " + std::to_string(i) + " has none (segments: " + std::to_string(segments()) + ")");
  const int op = segs_[i].collective;
  const Buffers& b = *buf_;
  const step::StepParams& p = b.params;
  StepCollective c;
  if (op == g_.op_maxima_reduce) {  // this step's parity of the keys (sample_tile)
    c.kind = StepCollective::MaxU64;
    c.data = b.maxima + (launches_ & 1) * opt_.batch;
    c.count = opt_.batch;
    return c;
  }
  // The stream writer the all-reduce completes: o_proj of layer l is writer 2l + 1, down 2l + 2; its
  // buffer rotates with the step (decode_step_sm90.hpp: residual_buffer).
  int writer = -1;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    if (op == g_.layers[l].op_o_proj_reduce) writer = 2 * l + 1;
    if (op == g_.layers[l].op_down_reduce) writer = 2 * l + 2;
  }
  if (writer < 0) bad("collective: op " + std::to_string(op) + " is not one of the step's all-reduces");
  const int64_t per_buffer = int64_t(p.x_blocks) * p.batch * p.x_cols;
  const uint32_t g = uint32_t(launches_) * uint32_t(p.writers) + uint32_t(writer);  // mod 2^32, as on the device
  c.kind = StepCollective::SumF32;
  c.data = b.xres + int64_t(g % step::kResidualBuffers) * per_buffer;
  c.count = per_buffer;
  return c;
}

std::vector<int32_t> DecodeStep::tokens(cudaStream_t stream) const {
  std::vector<int32_t> out(opt_.batch);
  TW_CUDA_CHECK(cudaMemcpyAsync(out.data(), buf_->tokens, out.size() * 4, cudaMemcpyDeviceToHost, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

std::vector<float> DecodeStep::logits(cudaStream_t stream) const {
  if (!buf_->logits) bad("logits: the step was built without keep_logits");
  std::vector<float> out(size_t(opt_.batch) * cfg_.vocab_size);
  TW_CUDA_CHECK(cudaMemcpyAsync(out.data(), buf_->logits, out.size() * 4, cudaMemcpyDeviceToHost, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

float* DecodeStep::logits_device() const { return buf_->logits; }
int32_t* DecodeStep::tokens_device() const { return buf_->tokens; }

std::vector<int32_t> DecodeStep::history(int64_t launch, cudaStream_t stream) const {
  if (!buf_->history) bad("history: the step was built with history 0");
  if (launch < 0 || launch >= launches_ || launches_ - launch > opt_.history)
    bad("history: launch " + std::to_string(launch) + " is not among the last " + std::to_string(opt_.history) +
        " of " + std::to_string(launches_));
  std::vector<int32_t> out(opt_.batch);
  TW_CUDA_CHECK(cudaMemcpyAsync(out.data(), buf_->history + (launch % opt_.history) * opt_.batch, out.size() * 4,
                                cudaMemcpyDeviceToHost, stream));
  TW_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

void DecodeStep::reset() {
  plan_->reset();
  Buffers& b = *buf_;
  for (size_t i = 0; i < b.ws.size(); ++i)
    if (b.ws[i]) TW_CUDA_CHECK(cudaMemset(b.ws[i], 0, b.ws_elems[i] * sizeof(float)));
  TW_CUDA_CHECK(cudaMemset(b.merge_count, 0, sizeof(int32_t) * opt_.batch * cfg_.num_kv_heads));
  TW_CUDA_CHECK(cudaMemset(b.maxima, 0, sizeof(unsigned long long) * 2 * opt_.batch));
  // The flags too: a flag left from an aborted launch would pass a later wait. (Every rank resets: the
  // flags count from the epochs, which restart.)
  if (b.exchange) TW_CUDA_CHECK(cudaMemset(b.exchange, 0, size_t(b.exchange_bytes)));
  TW_CUDA_CHECK(cudaMemset(b.xres, 0, sizeof(float) * b.xres_elems));
  TW_CUDA_CHECK(cudaMemset(b.qkv_acc, 0, sizeof(float) * b.qkv_acc_elems));
  launches_ = 0;
}

}  // namespace tw
