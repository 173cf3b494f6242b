// The tile graph: ops cut into tiles, each tile with the tensor regions it reads and writes
// and the tiles it depends on. It is the one truth consumed by the traffic model (host) and
// by the GPU executor (which uploads the same tiles, dependencies and schedule).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tw {

// A bad argument from a user: the message names the value. The CLI maps it to exit code 2.
struct InvalidArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
// A number as an error message shows it (shortest form: 0.02, 1e-06, 4096).
std::string to_text(double v);

enum class TensorRole { Input, Weight, Intermediate, Output, Workspace };
const char* to_string(TensorRole r);

// A 2-D row-major tensor in device memory (rows x cols elements).
struct Tensor {
  std::string name;
  int64_t rows = 0, cols = 0;
  int elem_bytes = 2;
  TensorRole role = TensorRole::Input;
  int64_t bytes() const { return rows * cols * elem_bytes; }
};

// A half-open rectangle [r0, r1) x [c0, c1) of one tensor.
struct Region {
  int tensor = -1;
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  int64_t rows() const { return r1 - r0; }
  int64_t cols() const { return c1 - c0; }
  bool overlaps(const Region& o) const {
    return tensor == o.tensor && r0 < o.r1 && o.r0 < r1 && c0 < o.c1 && o.c0 < c1;
  }
};

enum class OpKind {
  Gemm,         // C[M,N] = A[M,K] . B[N,K]^T  (B is a PyTorch Linear weight, [out, in])
  GemmSiluMul,  // C[M,N] = silu(A . Bg^T) * (A . Bu^T), B = [gate; up] stacked as [2N, K]
  SiluMul,      // C[M,N] = silu(A[:, :N]) * A[:, N:2N]   (the unfused elementwise op)
  DecodeAttention,  // split-KV decode attention (graph/attention_graph.hpp): C = out [B, Hq*D]; its
                    // tiles form a 1 x P grid (tile c at tm = 0, tn = c), each writing the output
                    // of a range of (sequence, KV head) pairs, so the writes are not a regular grid
  Embed,            // C[M, N] = table[token[m], :] (column blocks)
  Sample,           // C[M, 1] = the greedy token of each row, from the LM head's running maxima
  AllReduce,        // C[M, N] = the sum of A[M, N] over `ranks` tensor-parallel ranks (column blocks); a
                    // ring moves 2 (ranks - 1) / ranks of each block over every rank's link
  PrefillAttention, // full (or causal) attention over packed sequences (graph/prefill_attention_graph.hpp):
                    // a tile per (query tile, head) item, reading its Q rows and every K/V row they see;
                    // C = out [total_q, Hq*D]
};
const char* to_string(OpKind k);

struct Tiling {
  int64_t bm = 64, bn = 128, bk = 64;
  int64_t split_k = 1;  // K is cut into split_k slices; the slices' partial sums are reduced in-launch
  // Uneven slices (optional): where each slice after the first begins, ascending multiples of bk
  // inside (0, K), split_k - 1 of them. Empty: even slices of whole bk steps.
  std::vector<int64_t> k_cuts;
};

// Uneven K slices ending on short ones (Tiling::k_cuts): the last `levels` groups of
// ceil(sms / tiles_per_slice) slices -- about one tile per SM each, run last by kslices/ orders --
// are 1/2^levels, ..., 1/2 the size of the others, which are about `big` columns; all whole
// `step`s. See the definition for why.
std::vector<int64_t> tail_k_cuts(int64_t k, int64_t step, int64_t big, int64_t tiles_per_slice, int sms, int levels);

struct Op {
  std::string name;
  OpKind kind = OpKind::Gemm;
  int64_t m = 0, n = 0, k = 0;
  Tiling tiling;
  int a = -1, b = -1, c = -1;  // tensor ids
  int residual = -1;           // Gemm: R [M, N] added to C in the epilogue (-1: none)
  int bias = -1;               // [1, N] added to C (-1: none)
  int ranks = 1;               // AllReduce: the ranks summed
  // Tensors the op's tiles write besides C, at places no grid describes (a consumer of them depends on
  // every tile whose write overlaps its read): the KV-cache rows a QKV projection appends, the LM
  // head's running maxima.
  std::vector<int> side_outputs;
  int workspace = -1;          // fp32 split-K accumulator [M, N] ([M, 2N] gate|up) when split_k > 1:
                               // every slice adds into it; the last slice to finish writes C
  int64_t grid_m = 0, grid_n = 0;
  int first_tile = 0, num_tiles = 0;  // tiles [first_tile, first_tile + num_tiles) belong to this op
  // First K column of slice ks, 0 <= ks <= split_k (slice ks is [k_begin(ks), k_begin(ks + 1))).
  int64_t k_begin(int64_t ks) const;
};

// One unit of work. A GEMM tile computes output block (tm, tn) over K slice ks. A decode-attention
// tile is tn = its work tile index and [k0, k1) its 16-token KV units.
// Reads of a GEMM tile are K-panels: the model walks them in column steps of `step_cols`
// (the tiling's bk), so a tile's operand blocks stream through the cache as on the GPU.
struct Tile {
  int op = -1;
  int64_t tm = 0, tn = 0, ks = 0;
  int64_t k0 = 0, k1 = 0;           // K range of this tile
  int64_t step_cols = 0;            // 0: one step
  std::vector<Region> reads, writes;
  std::vector<int> deps;            // producer tiles, derived from write->read overlap
  double flops = 0;
};

// The optional parts of a GEMM op (Op says what each is).
struct GemmExtras {
  int residual = -1, bias = -1;
};

struct DecodeAttentionShape;
struct DecodePlan;
struct DecodeAttentionTensorIds;
struct PrefillAttentionShape;
struct PrefillAttentionTensorIds;

class TileGraph {
 public:
  int add_tensor(std::string name, int64_t rows, int64_t cols, int elem_bytes, TensorRole role);
  // Adds an op and cuts it into tiles. Ops must be added producers first.
  // residual >= 0: C = A . B^T + R (R [M, N], read by every K slice, since any may finish last).
  int add_gemm(std::string name, int a, int b, int c, Tiling t, int residual = -1);
  int add_gemm_silu_mul(std::string name, int a, int b_gate_up, int c, Tiling t);
  // Either GEMM kind with its optional parts. `per_tile`, if given, may add reads and writes to each tile
  // before its dependencies are derived (writes to tensors other than C must be in side_outputs).
  int add_gemm_ex(std::string name, OpKind kind, int a, int b, int c, Tiling t, const GemmExtras& x,
                  const std::vector<int>& side_outputs = {}, const std::function<void(Tile&)>& per_tile = {});
  // Embedding rows: tile c copies columns [c * cols, (c + 1) * cols) of table[token[m]] into out for all
  // rows m.
  int add_embed(std::string name, int tokens, int table, int out, int64_t cols);
  // One tile: the greedy token of every row from `maxima` (written by an earlier op's tiles) into out.
  int add_sample(std::string name, int maxima, int out);
  // The all-reduce of a tensor-parallel rank's part `a` into `c` (both [M, N]) over `ranks` ranks, in
  // tiles of `cols` columns: tile j reads and writes column block j, so a consumer of a block waits only
  // for the producers of that block (and their reduction).
  int add_all_reduce(std::string name, int a, int c, int ranks, int64_t cols);
  // Bytes the graph's all-reduces move over each rank's link (ring: 2 (ranks - 1) / ranks of each
  // block's bytes).
  int64_t link_bytes() const;
  int add_silu_mul(std::string name, int a, int c, int64_t bm, int64_t bn);
  // The P work tiles of a decode-attention plan (defined in attention_graph.cpp). Tile c reads q,
  // k_new, v_new of its pairs and the K/V rows of its units, and writes the output of its whole
  // pair range: the last tile to finish a pair merges it, and which one that is is only known at
  // run time, so a consumer of a pair's output depends on every tile holding a part of the pair.
  // kv_granule > 1: each read of cache rows is rounded out to whole granules of tokens (the model's
  // block grid of the cache then has granule-row blocks rather than single rows; a decode step's
  // graph uses the 16-token unit).
  int add_decode_attention(std::string name, const DecodeAttentionShape& s, const std::vector<int>& seq_lens,
                           const std::vector<int>& page_table, const DecodePlan& plan, const DecodeAttentionTensorIds& t,
                           int kv_granule = 1);
  // Prefill attention's items (defined in prefill_attention_graph.cpp) in the kernel's order, head by
  // head over plan_prefill_tiles(s, cu_q, cu_k, block_n, block_m): item (tile, head) reads its Q rows
  // of the head, the K and V rows of its sequence that it sees (the first kv_tiles x block_n), and
  // writes its output rows of the head. q, k, v may be column ranges of one tensor (a fused QKV
  // projection's output). Its order grid is (head, tile): the row-major order is the kernel's.
  int add_prefill_attention(std::string name, const PrefillAttentionShape& s, const std::vector<int>& cu_q,
                            const std::vector<int>& cu_k, int block_m, int block_n, const PrefillAttentionTensorIds& t);

  const std::vector<Tensor>& tensors() const { return tensors_; }
  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<Tile>& tiles() const { return tiles_; }
  const Tensor& tensor(int id) const { return tensors_.at(id); }
  const Op& op(int id) const { return ops_.at(id); }
  const Tile& tile(int id) const { return tiles_.at(id); }
  int num_tiles() const { return static_cast<int>(tiles_.size()); }
  int find_tensor(const std::string& name) const;  // -1 if absent

  // Bytes of a region (elements x element size of its tensor).
  int64_t bytes(const Region& r) const { return r.rows() * r.cols() * tensors_.at(r.tensor).elem_bytes; }

  // Tiles of `op` in row-major (tm, tn, ks) order: id = first_tile + (tm*grid_n + tn)*split_k + ks.
  int tile_id(int op, int64_t tm, int64_t tn, int64_t ks = 0) const;

 private:
  void check_tensor(int id, const char* what) const;
  int add_gemm_op(Op o, const std::function<void(Tile&)>& per_tile = {});  // tiles of a Gemm or GemmSiluMul op
  int finish_op(Op o);  // registers o, whose tiles were just appended, and derives their dependencies
  // An op of column blocks (all M rows, `cols` columns a tile: embed, all-reduce): o's tiling and grid
  // set, tile tn given its reads and writes by fill(tile, c0, c1), then finish_op.
  int add_column_op(Op o, int64_t cols, const std::function<void(Tile&, int64_t, int64_t)>& fill);
  void derive_deps(int first_new_tile);
  std::vector<Tensor> tensors_;
  std::vector<Op> ops_;
  std::vector<Tile> tiles_;
  // For every tensor, the tiles that write it (dependency derivation indexes these).
  std::vector<std::vector<int>> writers_;
};

// The Llama-style FFN: H = silu(X Wg^T) * (X Wu^T); Y = H Wd^T.
// The plain chain's activation on its first GEMM's output (the gated FFN's is SiLU(gate) * up):
// none, ReLU, or GeLU with the tanh approximation (PyTorch's gelu(approximate="tanh")).
enum class FfnActivation : int32_t { None = 0, Relu = 1, GeluTanh = 2 };
const char* to_string(FfnActivation a);
FfnActivation ffn_activation_from(const std::string& name);  // "none" | "relu" | "gelu_tanh"; else InvalidArgument

struct FfnShape {
  int64_t m = 16, d = 4096, f = 14336;
  bool gated = true;  // false: the research notes' plain two-GEMM chain Y = act(X W0^T) W1^T
  FfnActivation act = FfnActivation::None;  // the plain chain's act; a gated FFN takes None
};
struct FfnTiling {
  Tiling gate_up{64, 128, 64, 1, {}};
  Tiling down{64, 128, 64, 1, {}};
  // The splits are for the last wave only: the executor's schedule runs each split op's whole waves
  // of output tiles unsplit (order "waves:<SMs>/...", choose_ffn_splits).
  bool whole_waves = false;
};
struct FfnGraph {
  TileGraph graph;
  int x = -1, w_gate_up = -1, h = -1, w_down = -1, y = -1;
  int op_gate_up = -1, op_down = -1;
};
FfnGraph build_ffn_graph(const FfnShape& s, const FfnTiling& t);

}  // namespace tw
