#include "tileweave/graph/tile_graph.hpp"

#include <algorithm>
#include <sstream>

namespace tw {

std::string to_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

const char* to_string(TensorRole r) {
  switch (r) {
    case TensorRole::Input: return "input";
    case TensorRole::Weight: return "weight";
    case TensorRole::Intermediate: return "intermediate";
    case TensorRole::Output: return "output";
    case TensorRole::Workspace: return "workspace";
  }
  return "?";
}

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::Gemm: return "gemm";
    case OpKind::GemmSiluMul: return "gemm_silu_mul";
    case OpKind::SiluMul: return "silu_mul";
    case OpKind::DecodeAttention: return "decode_attention";
    case OpKind::PrefillAttention: return "prefill_attention";
    case OpKind::Embed: return "embed";
    case OpKind::Sample: return "sample";
    case OpKind::AllReduce: return "all_reduce";
  }
  return "?";
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_positive(int64_t v, const std::string& what) {
  if (v <= 0) throw InvalidArgument(what + " must be positive, got " + std::to_string(v));
}
}  // namespace

int TileGraph::add_tensor(std::string name, int64_t rows, int64_t cols, int elem_bytes, TensorRole role) {
  check_positive(rows, "rows of tensor '" + name + "'");
  check_positive(cols, "cols of tensor '" + name + "'");
  if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4)
    throw InvalidArgument("element size of tensor '" + name + "' must be 1, 2 or 4 bytes, got " +
                          std::to_string(elem_bytes));
  if (find_tensor(name) >= 0) throw InvalidArgument("tensor name '" + name + "' is used twice");
  tensors_.push_back({std::move(name), rows, cols, elem_bytes, role});
  writers_.emplace_back();
  return static_cast<int>(tensors_.size()) - 1;
}

int TileGraph::find_tensor(const std::string& name) const {
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].name == name) return static_cast<int>(i);
  return -1;
}

void TileGraph::check_tensor(int id, const char* what) const {
  if (id < 0 || id >= static_cast<int>(tensors_.size()))
    throw InvalidArgument(std::string(what) + " tensor id " + std::to_string(id) + " does not exist");
}

int TileGraph::tile_id(int op_id, int64_t tm, int64_t tn, int64_t ks) const {
  const Op& o = ops_.at(op_id);
  return o.first_tile + static_cast<int>((tm * o.grid_n + tn) * o.tiling.split_k + ks);
}

// K columns per even split-K slice: whole BK steps, and no slice may be empty.
static int64_t even_slice(int64_t k, const Tiling& t) { return ceil_div(ceil_div(k, t.split_k), t.bk) * t.bk; }

// Uneven K slices (as cuts) ending in `levels` tail levels. Dynamic tickets balance the SMs only
// to within the length of the tiles they end on: the H200 tile timelines (bench_ffn --trace) show
// SMs running out of work over ~13 us at the end of an 8B FFN of 512 KiB tiles. So the last
// ceil(sms / tiles_per_slice) slices (about one tile per SM, run last by kslices/ orders) are half
// the size of the others, the ones before them likewise a quarter, ... and the rest of K is cut
// into slices of about `big` columns.
std::vector<int64_t> tail_k_cuts(int64_t k, int64_t step, int64_t big, int64_t tiles_per_slice, int sms, int levels) {
  const int64_t stages = (k + step - 1) / step, big_st = std::max<int64_t>(1, (big + step - 1) / step);
  const int64_t per_level = std::max<int64_t>(1, (sms + tiles_per_slice - 1) / tiles_per_slice);
  std::vector<int64_t> back;  // slice sizes in stages, last slice first
  int64_t left = stages;
  for (int lvl = levels; lvl >= 1; --lvl) {
    const int64_t size = std::max<int64_t>(1, big_st >> lvl);
    for (int64_t i = 0; i < per_level && left - size >= big_st; ++i, left -= size) back.push_back(size);
  }
  const int64_t front = std::max<int64_t>(1, (left + big_st / 2) / big_st);
  std::vector<int64_t> cuts;
  int64_t at = 0;
  for (int64_t i = 0; i + 1 < front; ++i) cuts.push_back((at += left / front + (i < left % front)) * step);
  at = left;
  for (auto it = back.rbegin(); it != back.rend(); ++it) {
    cuts.push_back(at * step);
    at += *it;
  }
  return cuts;
}

int64_t Op::k_begin(int64_t ks) const {
  if (ks >= tiling.split_k) return k;
  if (!tiling.k_cuts.empty()) return ks == 0 ? 0 : tiling.k_cuts.at(ks - 1);
  return std::min(k, ks * even_slice(k, tiling));
}

// Every slice non-empty and made of whole BK steps (the last may end at K).
static void check_slices(const Op& o) {
  const Tiling& t = o.tiling;
  if (t.k_cuts.empty()) {
    if (ceil_div(o.k, even_slice(o.k, t)) != t.split_k)
      throw InvalidArgument("op '" + o.name + "': split_k " + std::to_string(t.split_k) + " leaves empty K slices (K=" +
                            std::to_string(o.k) + ", BK=" + std::to_string(t.bk) + ")");
    return;
  }
  if (static_cast<int64_t>(t.k_cuts.size()) != t.split_k - 1)
    throw InvalidArgument("op '" + o.name + "': " + std::to_string(t.k_cuts.size()) + " K cuts for split_k " +
                          std::to_string(t.split_k) + " (need split_k - 1)");
  for (int64_t ks = 0; ks + 1 < t.split_k; ++ks) {
    const int64_t c = t.k_cuts[ks];
    if (c % t.bk || c <= o.k_begin(ks) || c >= o.k)
      throw InvalidArgument("op '" + o.name + "': K cut " + std::to_string(c) + " must be a multiple of BK=" +
                            std::to_string(t.bk) + ", above the previous cut and below K=" + std::to_string(o.k));
  }
}

static void check_tiling(const Tiling& t, const std::string& op) {
  check_positive(t.bm, "BM of op '" + op + "'");
  check_positive(t.bn, "BN of op '" + op + "'");
  check_positive(t.bk, "BK of op '" + op + "'");
  check_positive(t.split_k, "split_k of op '" + op + "'");
}

int TileGraph::add_gemm(std::string name, int a, int b, int c, Tiling t, int residual) {
  GemmExtras x;
  x.residual = residual;
  return add_gemm_ex(std::move(name), OpKind::Gemm, a, b, c, std::move(t), x);
}

int TileGraph::add_gemm_silu_mul(std::string name, int a, int b, int c, Tiling t) {
  return add_gemm_ex(std::move(name), OpKind::GemmSiluMul, a, b, c, std::move(t), {});
}

int TileGraph::add_gemm_ex(std::string name, OpKind kind, int a, int b, int c, Tiling t, const GemmExtras& x,
                           const std::vector<int>& side_outputs, const std::function<void(Tile&)>& per_tile) {
  if (kind != OpKind::Gemm && kind != OpKind::GemmSiluMul)
    throw InvalidArgument("op '" + name + "': add_gemm_ex takes gemm or gemm_silu_mul, got " + to_string(kind));
  check_tensor(a, "A");
  check_tensor(b, "B");
  check_tensor(c, "C");
  check_tiling(t, name);
  const bool gated = kind == OpKind::GemmSiluMul;
  const Tensor &A = tensors_[a], &B = tensors_[b], &C = tensors_[c];
  if (A.cols != B.cols || (gated && B.rows % 2) || C.rows != A.rows || C.cols != (gated ? B.rows / 2 : B.rows))
    throw InvalidArgument("op '" + name + "': shapes A " + std::to_string(A.rows) + "x" + std::to_string(A.cols) +
                          ", B " + std::to_string(B.rows) + "x" + std::to_string(B.cols) + ", C " +
                          std::to_string(C.rows) + "x" + std::to_string(C.cols) + " do not fit " +
                          (gated ? "C = silu(A Bg^T) * (A Bu^T) with B = [gate; up]" : "C = A B^T"));
  auto expect = [&](int id, const char* what, int64_t rows, int64_t cols) {
    if (id < 0) return;
    check_tensor(id, what);
    if (tensors_[id].rows != rows || tensors_[id].cols != cols)
      throw InvalidArgument("op '" + name + "': " + what + " is " + std::to_string(tensors_[id].rows) + "x" +
                            std::to_string(tensors_[id].cols) + ", expected " + std::to_string(rows) + "x" +
                            std::to_string(cols));
  };
  expect(x.residual, "residual", C.rows, C.cols);
  expect(x.bias, "bias", 1, C.cols);
  Op o;
  o.name = std::move(name);
  o.kind = kind;
  o.m = A.rows, o.n = C.cols, o.k = A.cols;
  o.a = a, o.b = b, o.c = c;
  o.residual = x.residual, o.bias = x.bias;
  o.side_outputs = side_outputs;
  for (int id : o.side_outputs) check_tensor(id, "side output");
  o.tiling = t;
  return add_gemm_op(std::move(o), per_tile);
}

// Cuts a GEMM-like op into (tm, tn, ks) tiles. A tile reads its A panel and the B rows of its
// output columns (gate and up rows for SiLU*mul: B = [gate; up]) over its K slice; with split-K
// it also accumulates into the op's fp32 workspace (gate in columns [0, N), up in [N, 2N)).
int TileGraph::add_gemm_op(Op o, const std::function<void(Tile&)>& per_tile) {
  const Tiling& t = o.tiling;
  const bool gated = o.kind == OpKind::GemmSiluMul;
  check_slices(o);
  if (t.split_k > 1)
    o.workspace = add_tensor(o.name + ".partials", o.m, (gated ? 2 : 1) * o.n, 4, TensorRole::Workspace);
  o.grid_m = ceil_div(o.m, t.bm);
  o.grid_n = ceil_div(o.n, t.bn);
  o.first_tile = num_tiles();
  for (int64_t tm = 0; tm < o.grid_m; ++tm)
    for (int64_t tn = 0; tn < o.grid_n; ++tn)
      for (int64_t ks = 0; ks < t.split_k; ++ks) {
        Tile tile;
        tile.op = static_cast<int>(ops_.size());
        tile.tm = tm, tile.tn = tn, tile.ks = ks;
        tile.k0 = o.k_begin(ks);
        tile.k1 = o.k_begin(ks + 1);
        tile.step_cols = t.bk;
        const int64_t r0 = tm * t.bm, r1 = std::min(o.m, r0 + t.bm);
        const int64_t c0 = tn * t.bn, c1 = std::min(o.n, c0 + t.bn);
        tile.reads.push_back({o.a, r0, r1, tile.k0, tile.k1});
        tile.reads.push_back({o.b, c0, c1, tile.k0, tile.k1});
        if (gated) tile.reads.push_back({o.b, o.n + c0, o.n + c1, tile.k0, tile.k1});
        if (o.residual >= 0) tile.reads.push_back({o.residual, r0, r1, c0, c1});
        if (o.bias >= 0) tile.reads.push_back({o.bias, 0, 1, c0, c1});
        if (t.split_k > 1) {
          tile.writes.push_back({o.workspace, r0, r1, c0, c1});
          if (gated) tile.writes.push_back({o.workspace, r0, r1, o.n + c0, o.n + c1});
        }
        tile.writes.push_back({o.c, r0, r1, c0, c1});
        tile.flops = (gated ? 4.0 : 2.0) * (r1 - r0) * (c1 - c0) * (tile.k1 - tile.k0);
        if (per_tile) per_tile(tile);
        tiles_.push_back(std::move(tile));
      }
  return finish_op(std::move(o));
}

int TileGraph::finish_op(Op o) {
  o.num_tiles = num_tiles() - o.first_tile;
  ops_.push_back(std::move(o));
  derive_deps(ops_.back().first_tile);
  return static_cast<int>(ops_.size()) - 1;
}

int TileGraph::add_silu_mul(std::string name, int a, int c, int64_t bm, int64_t bn) {
  check_tensor(a, "A");
  check_tensor(c, "C");
  Tiling t{bm, bn, bn, 1, {}};
  check_tiling(t, name);
  const Tensor &A = tensors_[a], &C = tensors_[c];
  if (A.rows != C.rows || A.cols != 2 * C.cols)
    throw InvalidArgument("op '" + name + "': A must be [M, 2N] for C [M, N]");
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::SiluMul;
  o.m = C.rows, o.n = C.cols, o.k = 0;
  o.a = a, o.c = c;
  o.tiling = t;
  o.grid_m = ceil_div(o.m, bm);
  o.grid_n = ceil_div(o.n, bn);
  o.first_tile = num_tiles();
  for (int64_t tm = 0; tm < o.grid_m; ++tm)
    for (int64_t tn = 0; tn < o.grid_n; ++tn) {
      Tile tile;
      tile.op = static_cast<int>(ops_.size());
      tile.tm = tm, tile.tn = tn;
      const int64_t r0 = tm * bm, r1 = std::min(o.m, r0 + bm);
      const int64_t c0 = tn * bn, c1 = std::min(o.n, c0 + bn);
      tile.reads.push_back({a, r0, r1, c0, c1});
      tile.reads.push_back({a, r0, r1, o.n + c0, o.n + c1});
      tile.writes.push_back({c, r0, r1, c0, c1});
      tile.flops = 4.0 * (r1 - r0) * (c1 - c0);
      tiles_.push_back(std::move(tile));
    }
  return finish_op(std::move(o));
}

int TileGraph::add_embed(std::string name, int tokens, int table, int out, int64_t cols) {
  check_tensor(tokens, "tokens");
  check_tensor(table, "table");
  check_tensor(out, "out");
  check_positive(cols, "columns per tile of op '" + name + "'");
  const Tensor &T = tensors_[tokens], &E = tensors_[table], &C = tensors_[out];
  if (T.rows != C.rows || T.cols != 1 || E.cols != C.cols)
    throw InvalidArgument("op '" + name + "': tokens [M, 1], table [V, N] and out [M, N] do not fit");
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::Embed;
  o.m = C.rows, o.n = C.cols, o.k = 0;
  o.a = tokens, o.b = table, o.c = out;
  const int64_t m = o.m, table_rows = std::min(o.m, E.rows);
  return add_column_op(std::move(o), cols, [&](Tile& tile, int64_t c0, int64_t c1) {
    tile.reads.push_back({tokens, 0, m, 0, 1});
    // Which table rows depends on the tokens: the model charges M rows' worth (rows 0..M-1).
    tile.reads.push_back({table, 0, table_rows, c0, c1});
    tile.writes.push_back({out, 0, m, c0, c1});
  });
}

int TileGraph::add_column_op(Op o, int64_t cols, const std::function<void(Tile&, int64_t, int64_t)>& fill) {
  o.tiling = {o.m, cols, cols, 1, {}};
  o.grid_m = 1, o.grid_n = ceil_div(o.n, cols);
  o.first_tile = num_tiles();
  for (int64_t tn = 0; tn < o.grid_n; ++tn) {
    Tile tile;
    tile.op = static_cast<int>(ops_.size());
    tile.tn = tn;
    fill(tile, tn * cols, std::min(o.n, (tn + 1) * cols));
    tiles_.push_back(std::move(tile));
  }
  return finish_op(std::move(o));
}

int TileGraph::add_sample(std::string name, int maxima, int out) {
  check_tensor(maxima, "maxima");
  check_tensor(out, "out");
  const Tensor& C = tensors_[out];
  if (tensors_[maxima].rows != C.rows || C.cols != 1)
    throw InvalidArgument("op '" + name + "': maxima [M, *] and out [M, 1] do not fit");
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::Sample;
  o.m = C.rows, o.n = 1, o.k = 0;
  o.a = maxima, o.c = out;
  o.tiling = {C.rows, 1, 1, 1, {}};
  o.grid_m = o.grid_n = 1;
  o.first_tile = num_tiles();
  Tile tile;
  tile.op = static_cast<int>(ops_.size());
  tile.reads.push_back({maxima, 0, o.m, 0, tensors_[maxima].cols});
  tile.writes.push_back({out, 0, o.m, 0, 1});
  tiles_.push_back(std::move(tile));
  return finish_op(std::move(o));
}

int TileGraph::add_all_reduce(std::string name, int a, int c, int ranks, int64_t cols) {
  check_tensor(a, "a");
  check_tensor(c, "c");
  check_positive(cols, "columns per tile of op '" + name + "'");
  if (ranks < 2) throw InvalidArgument("op '" + name + "': an all-reduce over " + std::to_string(ranks) + " ranks");
  const Tensor &A = tensors_[a], &C = tensors_[c];
  if (A.rows != C.rows || A.cols != C.cols)
    throw InvalidArgument("op '" + name + "': a [M, N] and c [M, N] do not fit");
  Op o;
  o.name = std::move(name);
  o.kind = OpKind::AllReduce;
  o.m = C.rows, o.n = C.cols, o.k = 0;
  o.a = a, o.c = c;
  o.ranks = ranks;
  const int64_t m = o.m;
  return add_column_op(std::move(o), cols, [&](Tile& tile, int64_t c0, int64_t c1) {
    tile.reads.push_back({a, 0, m, c0, c1});
    tile.writes.push_back({c, 0, m, c0, c1});
  });
}

int64_t TileGraph::link_bytes() const {
  int64_t bytes = 0;
  for (const Op& o : ops_)
    if (o.kind == OpKind::AllReduce) bytes += 2 * (o.ranks - 1) * (o.m * o.n * tensors_[o.c].elem_bytes) / o.ranks;
  return bytes;
}

// A tile depends on every earlier tile whose write overlaps one of its reads (read-after-write).
// All writers of a tensor belong to one op. A GEMM-like producer's C has a regular output grid, so the
// candidate producers of a region are found by index arithmetic and then confirmed by exact overlap:
// linear in the number of edges, not quadratic in tiles. Writes on no grid (decode-attention tiles
// write pair ranges; KV-cache appends and maxima are an op's side outputs) test every writer.
void TileGraph::derive_deps(int first_new_tile) {
  const int op_id = tiles_[first_new_tile].op;
  auto overlapping = [&](int w, const Region& r) {
    for (const Region& wr : tiles_[w].writes)
      if (wr.overlaps(r)) return true;
    return false;
  };
  for (int id = first_new_tile; id < num_tiles(); ++id) {
    Tile& t = tiles_[id];
    for (const Region& r : t.reads) {
      const auto& ws = writers_[r.tensor];
      if (ws.empty()) continue;
      const Op& po = ops_[tiles_[ws.front()].op];
      const bool side = std::find(po.side_outputs.begin(), po.side_outputs.end(), r.tensor) != po.side_outputs.end();
      if (r.tensor != po.c && !side)
        throw InvalidArgument("op '" + ops_[t.op].name + "' reads the internal tensor '" + tensors_[r.tensor].name + "'");
      if (side || po.kind == OpKind::DecodeAttention || po.kind == OpKind::PrefillAttention || po.kind == OpKind::Sample) {
        for (int w : ws)
          if (overlapping(w, r)) t.deps.push_back(w);
        continue;
      }
      const int64_t bm = po.tiling.bm, bn = po.tiling.bn;
      for (int64_t tm = r.r0 / bm; tm <= (r.r1 - 1) / bm && tm < po.grid_m; ++tm)
        for (int64_t tn = r.c0 / bn; tn <= (r.c1 - 1) / bn && tn < po.grid_n; ++tn)
          for (int64_t ks = 0; ks < po.tiling.split_k; ++ks) {
            const int w = tile_id(tiles_[ws.front()].op, tm, tn, ks);
            if (overlapping(w, r)) t.deps.push_back(w);
          }
    }
    std::sort(t.deps.begin(), t.deps.end());
    t.deps.erase(std::unique(t.deps.begin(), t.deps.end()), t.deps.end());
  }
  for (int id = first_new_tile; id < num_tiles(); ++id)
    for (const Region& w : tiles_[id].writes) {
      auto& ws = writers_[w.tensor];
      if (!ws.empty() && tiles_[ws.front()].op != op_id)
        throw InvalidArgument("tensor '" + tensors_[w.tensor].name + "' is written by two ops");
      if (ws.empty() || ws.back() != id) ws.push_back(id);
    }
}

const char* to_string(FfnActivation a) {
  switch (a) {
    case FfnActivation::Relu: return "relu";
    case FfnActivation::GeluTanh: return "gelu_tanh";
    default: return "none";
  }
}

FfnActivation ffn_activation_from(const std::string& name) {
  for (FfnActivation a : {FfnActivation::None, FfnActivation::Relu, FfnActivation::GeluTanh})
    if (name == to_string(a)) return a;
  throw InvalidArgument("activation '" + name + "' is not none, relu or gelu_tanh");
}

FfnGraph build_ffn_graph(const FfnShape& s, const FfnTiling& t) {
  check_positive(s.m, "M");
  if (s.gated && s.act != FfnActivation::None)
    throw InvalidArgument(std::string("a gated FFN's activation is SiLU(gate) * up: activation ") + to_string(s.act) +
                          " is for the plain chain");
  check_positive(s.d, "d (hidden size)");
  check_positive(s.f, "ffn (intermediate size)");
  FfnGraph g;
  auto& G = g.graph;
  g.x = G.add_tensor("x", s.m, s.d, 2, TensorRole::Input);
  g.w_gate_up = G.add_tensor(s.gated ? "w_gate_up" : "w0", s.gated ? 2 * s.f : s.f, s.d, 2, TensorRole::Weight);
  g.h = G.add_tensor("h", s.m, s.f, 2, TensorRole::Intermediate);
  g.w_down = G.add_tensor(s.gated ? "w_down" : "w1", s.d, s.f, 2, TensorRole::Weight);
  g.y = G.add_tensor("y", s.m, s.d, 2, TensorRole::Output);
  g.op_gate_up = s.gated ? G.add_gemm_silu_mul("gate_up", g.x, g.w_gate_up, g.h, t.gate_up)
                         : G.add_gemm("gemm0", g.x, g.w_gate_up, g.h, t.gate_up);
  g.op_down = G.add_gemm(s.gated ? "down" : "gemm1", g.h, g.w_down, g.y, t.down);
  return g;
}

}  // namespace tw
