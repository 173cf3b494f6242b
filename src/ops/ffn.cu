#include "tileweave/ops/ffn.hpp"

#include <algorithm>
#include <optional>

#include "ffn_sm90.hpp"
#include "tileweave/model/ffn_splits.hpp"
#include "tileweave/model/validation.hpp"  // sm90_ffn_tiling: the tiling the planner scores too
#include "tileweave/kernels/activation.cuh"
#include "tileweave/kernels/sm80/weight_tile.cuh"
#include "tileweave/order/orders.hpp"
#include "tileweave/runtime/exec_plan.hpp"
#include "tileweave/runtime/executor.cuh"
#include "tileweave/util/cuda_check.hpp"

namespace tw {

namespace {

using bf16 = __nv_bfloat16;
namespace sm80 = kernels::sm80;

// One GEMM op of the chain as the kernel sees it.
struct GemmOpDesc {
  const bf16* x;  // activations [m, k]
  const bf16* w;  // weights [n or 2n, k]
  bf16* c;        // output [m, n]
  float* ws;      // split-K accumulator [m, ws_cols] (zero between launches)
  int64_t m, n, k, slice;
  int32_t split, silu_mul;  // silu_mul: tile columns are 32 gate/up pairs, else 64 plain columns
  int32_t act;              // plain columns: FfnActivation of the output (kernels::ffn_activate)
};

struct ChainParams {
  GemmOpDesc ops[2];
};


template <int NT, int BK, int KS>
__device__ void run_tile(const runtime::ExecParams& ep, runtime::BlockSlots& slots, const GemmOpDesc& o,
                         const DeviceTile& t, char* smem) {
  constexpr int R = 8 * NT;
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int warp = tid / 32 / KS;  // the warp's 16-row group; with KS > 1 only group leaders hold sums
  const bool holds_result = (tid / 32) % KS == 0;
  const int64_t m0 = int64_t(t.tm) * R;
  const int64_t cols = (o.silu_mul ? 32 : 64) / KS;  // output columns of this tile
  const int64_t c0 = int64_t(t.tn) * cols;
  sm80::WeightTileArgs a{o.w, o.k, o.x, o.k, m0, o.m, int64_t(t.ks) * o.slice, min(o.k, int64_t(t.ks + 1) * o.slice)};
  auto wait = [&] { return runtime::wait_dependencies(ep, slots, t); };
  float acc[NT][4];
  bool ok;
  if (o.silu_mul) {
    // Warp w's 16 rows: gate rows c0+8w..+7, then the matching up rows, so each thread holds a
    // gate value and its up partner (acc[j][e] and acc[j][e+2]) and the epilogue needs no shuffle.
    ok = sm80::weight_tile_mainloop<NT, BK, KS>(acc, a, [&](int r) -> int64_t {
      const int64_t col = c0 + 8 * (r / 16) + (r % 8);
      return col < o.n ? ((r % 16) < 8 ? col : o.n + col) : -1;
    }, wait, smem);
  } else {
    ok = sm80::weight_tile_mainloop<NT, BK, KS>(acc, a, [&](int r) -> int64_t { return c0 + r < o.n ? c0 + r : -1; }, wait, smem);
  }
  if (!ok) return;  // aborted wait: publish nothing, the launch is failing

  // This thread's results: f(m, col, a, b) with a = the value (gate for SiLU*mul), b = its up
  // partner (0 for a plain GEMM), only in-bounds rows and columns, only on result-holding warps.
  auto for_each_result = [&](auto&& f) {
#pragma unroll
    for (int j = 0; j < NT && holds_result; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t m = m0 + 8 * j + 2 * q + e;
        if (m >= o.m) continue;
        if (o.silu_mul) {
          const int64_t col = c0 + 8 * warp + g;
          if (col < o.n) f(m, col, acc[j][e], acc[j][e + 2]);
        } else {
          const int64_t col = c0 + 16 * warp + g;
          if (col < o.n) f(m, col, acc[j][e], 0.f);
          if (col + 8 < o.n) f(m, col + 8, acc[j][e + 2], 0.f);
        }
      }
  };
  if (o.split == 1) {
    for_each_result([&](int64_t m, int64_t col, float a, float b) {
      o.c[m * o.n + col] = __float2bfloat16(o.silu_mul ? kernels::silu(a) * b : kernels::ffn_activate(o.act, a));
    });
  } else {
    // Split-K: every slice adds its partial sums into one fp32 accumulator with fire-and-forget
    // reductions (RED: no round trip for the issuer); the slice that arrives last reads the sums
    // once, writes the output and zeroes the accumulator for the next launch. (Reading per-slice
    // partials instead costs the last slice one L2 round trip per slice: measured 1.6x slower at M=16.)
    const int64_t ws_cols = o.silu_mul ? 2 * o.n : o.n;
    for_each_result([&](int64_t m, int64_t col, float a, float b) {
      float* row = o.ws + m * ws_cols;
      atomicAdd(row + col, a);
      if (o.silu_mul) atomicAdd(row + o.n + col, b);
    });
    if (runtime::arrive_split(ep, slots, t, o.split)) {
      const int64_t rows = min(int64_t(R), o.m - m0), ncols = min(cols, o.n - c0);
      for (int64_t i = tid; i < rows * ncols; i += blockDim.x) {
        const int64_t m = m0 + i / ncols, col = c0 + i % ncols;
        float* p = o.ws + m * ws_cols + col;
        const float s0 = __ldcg(p);
        p[0] = 0.f;
        if (o.silu_mul) {
          const float s1 = __ldcg(p + o.n);
          p[o.n] = 0.f;
          o.c[m * o.n + col] = __float2bfloat16(kernels::silu(s0) * s1);
        } else {
          o.c[m * o.n + col] = __float2bfloat16(kernels::ffn_activate(o.act, s0));
        }
      }
    }
  }
  runtime::signal_done(ep, t);
}

template <int NT, int BK, int KS>
__global__ void __launch_bounds__(sm80::kThreads) ffn_kernel(const runtime::ExecParams ep, const ChainParams cp) {
  extern __shared__ __align__(128) char smem[];
  __shared__ runtime::BlockSlots slots;
  runtime::begin_launch(ep, slots);
  while (runtime::next_tile(ep, slots) >= 0) {
    const DeviceTile t = slots.cur;
    run_tile<NT, BK, KS>(ep, slots, cp.ops[t.op], t, smem);
  }
  runtime::end_launch(ep, slots);
}

using KernelFn = void (*)(const runtime::ExecParams, const ChainParams);

int nt_for(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

// Instantiated variants: KS = 1 with BK 64/128 for every NT; KS = 2 and 4 (BK 64) for NT <= 2.
template <int BK>
KernelFn kernel_for_bk(int nt) {
  switch (nt) {
    case 1: return ffn_kernel<1, BK, 1>;
    case 2: return ffn_kernel<2, BK, 1>;
    case 4: return ffn_kernel<4, BK, 1>;
    default: return ffn_kernel<8, BK, 1>;
  }
}
KernelFn kernel_for(int nt, int bk, int ks) {
  if (ks == 4) return nt == 1 ? ffn_kernel<1, 64, 4> : ffn_kernel<2, 64, 4>;
  if (ks == 2) return nt == 1 ? ffn_kernel<1, 64, 2> : ffn_kernel<2, 64, 2>;
  return bk == 128 ? kernel_for_bk<128>(nt) : kernel_for_bk<64>(nt);
}

template <int BK>
int smem_for_bk(int nt) {
  switch (nt) {
    case 1: return sm80::TileShape<1, BK>::smem_bytes;
    case 2: return sm80::TileShape<2, BK>::smem_bytes;
    case 4: return sm80::TileShape<4, BK>::smem_bytes;
    default: return sm80::TileShape<8, BK>::smem_bytes;
  }
}
int smem_for(int nt, int bk, int ks) {
  if (ks == 4) return nt == 1 ? sm80::TileShape<1, 64, 4>::smem_bytes : sm80::TileShape<2, 64, 4>::smem_bytes;
  if (ks == 2) return nt == 1 ? sm80::TileShape<1, 64, 2>::smem_bytes : sm80::TileShape<2, 64, 2>::smem_bytes;
  return bk == 128 ? smem_for_bk<128>(nt) : smem_for_bk<64>(nt);
}

// Measured on the H200 (bench/results/h200/ffn*.json): 64 with 16-row tiles at M <= 16, 128 above.
int bk_for(const FfnOptions& opt, int64_t m) {
  if (opt.bk != 0 && opt.bk != 64 && opt.bk != 128)
    throw InvalidArgument("FFN: bk must be 64 or 128 (or 0 for the default), got " + std::to_string(opt.bk));
  return opt.bk ? opt.bk : m <= 16 ? 64 : 128;
}

// Warps per 16-row weight group at M <= 16 by default: 4 (16-row tiles) for d <= 4096, else 2
// (32-row tiles); 64-row tiles above M = 16. Measured on the H200 (bench/results/h200/ffn.json):
// 16-row tiles win on the 8B FFN and the chain (fewer split-K reductions), 32-row tiles on the 70B
// FFN (more weight bytes in flight per block, half the activation re-reads).
int ks_for(const FfnOptions& opt, const FfnShape& s) {
  if (opt.k_split_warps < 0 || opt.k_split_warps == 3 || opt.k_split_warps > 4)
    throw InvalidArgument("FFN: k_split_warps must be 1, 2 or 4 (or 0 for the default), got " + std::to_string(opt.k_split_warps));
  const int ks = opt.k_split_warps ? opt.k_split_warps : s.m <= 16 && bk_for(opt, s.m) == 64 ? (s.d <= 4096 ? 4 : 2) : 1;
  if (ks > 1 && (s.m > 16 || (opt.bk != 0 && opt.bk != 64)))
    throw InvalidArgument("FFN: k_split_warps " + std::to_string(ks) + " needs M <= 16 and bk 64 (M=" +
                          std::to_string(s.m) + ", bk=" + std::to_string(opt.bk) + ")");
  return ks;
}


// K slices: 128 KiB of weights per tile at M <= 16 (64 rows x 1024 or 16 rows x 4096), so tiles
// are small against a block's share of the stream and the last wave is short. Larger M has more
// work per weight byte and more row blocks, so it needs fewer slices (and fewer reductions).
int auto_split(int64_t k, int64_t m, int weight_rows) {
  const int64_t target = (65536 / weight_rows) * std::max<int64_t>(1, m / 16);
  return static_cast<int>(std::max<int64_t>(1, (k + target / 2) / target));
}
int normalise_split(int64_t k, int split, int bk) {
  // Slices are whole BK steps; recompute the count so no slice is empty.
  const int64_t slice = ((k + split - 1) / split + bk - 1) / bk * bk;
  return static_cast<int>((k + slice - 1) / slice);
}


void use_mode(int& mode, int want) {
  if (mode && mode != want)
    throw InvalidArgument("FusedFfn: this object already ran " + std::string(mode == 1 ? "fused" : "as two kernels") +
                          "; its counters cannot serve the other mode (make a second object)");
  mode = want;
}

// This device's GPU preset (for the planner's ranking; gpu_preset_for_device).
GpuPreset device_preset(int sms) {
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return gpu_preset_for_device("", sms, 0);
  }
  return gpu_preset_for_device(prop.name, sms, prop.l2CacheSize);
}

// "auto" is sm90 on an sm_90 device (and sm80 where there is none, e.g. for the model on a CPU).
bool use_sm90(const FfnOptions& opt) {
  if (opt.mainloop == "sm80") return false;
  if (opt.mainloop == "sm90") return true;
  if (opt.mainloop != "auto")
    throw InvalidArgument("FFN: mainloop must be auto, sm80 or sm90, got '" + opt.mainloop + "'");
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9;
}

// sm90 tiles: 128 weight rows x all activation rows of a row block (model/validation.hpp's
// sm90_ffn_tiling: the planner scores the same tiling). The first GEMM in ~4 MiB slices (unsplit at
// the Llama sizes: its tiles then end in plain stores, and a down tile's h columns are complete when
// one tile per column block is; H200, packed weights, against 512 KiB slices: 8B 87.5 -> 85.3 us at
// M = 1, 103.0 -> 91.9 at M = 64, 127.6 -> 106.9 at M = 128 unpacked; 70B 362.6 -> 327.3 at M = 64),
// the down GEMM in ~512 KiB x rows/128 (512 KiB beat 128 KiB by 10-15% at M <= 64), each split
// further where its tiles would leave SMs idle.
// `named`: the preset of splits "model:<preset>" (null: this device's).
FfnTiling sm90_tiling(const FfnShape& s, const FfnOptions& opt, const GpuPreset* named) {
  if (opt.bk || opt.k_split_warps)
    throw InvalidArgument("FFN: bk and k_split_warps are sm80 options (mainloop '" + opt.mainloop + "' runs sm90 tiles)");
  const int sms = ffn_sm90::sm_count(), rows = sm90_tile_rows(s.m, opt.tile_rows);
  if (is_stream_k_order(opt.order)) {  // even slices: the tickets cut the ops, not the slices' sizes
    const FfnTiling k = sm90_ffn_stream_k_tiling(s, sms, rows);
    if (!opt.split_gate_up && !opt.split_down) return k;
    return sm90_ffn_tiling(s, sms, opt.split_gate_up ? opt.split_gate_up : int(k.gate_up.split_k),
                           opt.split_down ? opt.split_down : int(k.down.split_k), "even", rows);
  }
  FfnSplits sp{opt.split_gate_up, opt.split_down};
  // (The device query only where the model chooses; whole waves only with the order they come with.)
  if (opt.splits != "rules" && !sp.split_gate_up && !sp.split_down && opt.down_slices == "tail:1" &&
      rows == sm90::fit_act_rows(s.m))
    sp = choose_ffn_splits(s, named ? *named : device_preset(sms), opt.whole_waves && opt.order == FfnOptions{}.order);
  FfnTiling t = sm90_ffn_tiling(s, sms, sp.split_gate_up, sp.split_down, sp.whole_waves ? "even" : opt.down_slices, rows);
  t.whole_waves = sp.whole_waves;
  return t;
}

}  // namespace

namespace ffn_sm90 {

void check_operand(const char* op, const void* p, const char* name) {
  if (!p) throw InvalidArgument(std::string(op) + ": " + name + " is null");
  if (reinterpret_cast<uintptr_t>(p) % 16) throw InvalidArgument(std::string(op) + ": " + name + " is not 16-byte aligned");
}

// The SMs tiles are spread over (132 on the H100/H200 SXM where no GPU is visible, e.g. the CLI).
int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 132;
  }
  return sms;
}

}  // namespace ffn_sm90

FfnTiling FusedFfn::tiling_for(const FfnShape& s, const FfnOptions& opt) {
  if (s.m <= 0) throw InvalidArgument("FFN: M must be >= 1, got " + std::to_string(s.m));
  if (s.d <= 0 || s.d % 8) throw InvalidArgument("FFN: d must be a positive multiple of 8, got " + std::to_string(s.d));
  if (s.f <= 0 || s.f % 8) throw InvalidArgument("FFN: ffn size must be a positive multiple of 8, got " + std::to_string(s.f));
  if (opt.split_gate_up < 0) throw InvalidArgument("FFN: split_gate_up must be >= 0, got " + std::to_string(opt.split_gate_up));
  if (opt.split_down < 0) throw InvalidArgument("FFN: split_down must be >= 0, got " + std::to_string(opt.split_down));
  if (opt.splits != "model" && opt.splits != "rules" && (opt.splits.rfind("model:", 0) != 0 || opt.splits.size() == 6))
    throw InvalidArgument("FFN: splits must be 'model', 'model:<preset>' or 'rules', got '" + opt.splits + "'");
  // Loaded here, where a bad preset is refused at every M, and used where the model chooses.
  const std::optional<GpuPreset> named =
      opt.splits.size() > 6 ? std::optional<GpuPreset>(find_gpu_preset(opt.splits.substr(6))) : std::nullopt;
  if (use_sm90(opt)) return sm90_tiling(s, opt, named ? &*named : nullptr);
  if (opt.tile_rows != FfnOptions{}.tile_rows)
    throw InvalidArgument("FFN: tile_rows is an option of the sm90 tile body (mainloop '" + opt.mainloop + "' runs sm80 tiles)");
  const int64_t rows = 8 * nt_for(s.m);
  const int bk = bk_for(opt, s.m), ks = ks_for(opt, s);
  const int wrows = 64 / ks, step = bk * ks;  // weight rows per tile, K per pipeline stage
  const int sg = normalise_split(s.d, opt.split_gate_up ? opt.split_gate_up : auto_split(s.d, s.m, wrows), step);
  const int sd = normalise_split(s.f, opt.split_down ? opt.split_down : auto_split(s.f, s.m, wrows), step);
  FfnTiling t;
  t.gate_up = {rows, (s.gated ? 32 : 64) / ks, step, sg};
  t.down = {rows, 64 / ks, step, sd};
  return t;
}

FusedFfn::FusedFfn(const FfnShape& shape, const FfnOptions& opt) : shape_(shape) { init(opt, nullptr); }
FusedFfn::FusedFfn(const FfnShape& shape, const FfnOptions& opt, const Schedule& order) : shape_(shape) {
  init(opt, &order);
}

void FusedFfn::init(const FfnOptions& opt, const Schedule* order) {
  if (opt.ticket_lead < 0 || opt.ticket_lead > 64)
    throw InvalidArgument("FFN: ticket_lead " + std::to_string(opt.ticket_lead) + " is not in 0..64");
  const FfnTiling tiling = tiling_for(shape_, opt);
  g_ = build_ffn_graph(shape_, tiling);
  const TileGraph& G = g_.graph;

  sm90_ = use_sm90(opt);
  int dev = 0, sms = 0, fit = 1, major = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (sm90_) {
    if (major != 9) throw InvalidArgument("FFN: mainloop sm90 needs an sm_90 GPU (H100/H200); this one is sm_" + std::to_string(major) + "x");
    act_rows_ = static_cast<int>(G.op(g_.op_gate_up).tiling.bm);
    smem_ = ffn_sm90::prepare_kernel(act_rows_);  // over half the SM's shared memory: one CTA per SM
  } else {
    const int nt = nt_for(shape_.m);
    act_rows_ = 8 * nt;
    bk_ = bk_for(opt, shape_.m);
    ks_ = ks_for(opt, shape_);
    const KernelFn k = kernel_for(nt, bk_, ks_);
    smem_ = smem_for(nt, bk_, ks_);
    TW_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_));
    TW_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, k, sm80::kThreads, smem_));
  }
  if (opt.blocks_per_sm < 0 || opt.blocks_per_sm > fit)
    throw InvalidArgument("FFN: blocks_per_sm " + std::to_string(opt.blocks_per_sm) + " is outside [0, " +
                          std::to_string(fit) + "] (the blocks that fit on one SM)");
  grid_ = sms * (opt.blocks_per_sm ? opt.blocks_per_sm : fit);
  fit_per_sm_ = fit;
  sms_ = sms;
  spin_limit_ = opt.spin_limit;
  delay_ns_ = opt.delay_ns;

  if (order) {
    sched_ = *order;
  } else if (opt.order == "dataflow") {
    // Lag = the tiles in flight: a down tile is taken about when its producers finish.
    sched_ = dataflow_order(G, make_order(G, "col_major"), grid_);
  } else {
    // "op_by_op_column" / "op_by_op" are the names the H200 results use for the catalog's
    // col_major / row_major (each op's tiles in turn), "streamk" a ticket per block of the grid.
    // (whole_waves: the model's plan for the default order, ffn_splits.hpp)
    sched_ = make_order(G, tiling.whole_waves ? ffn_whole_waves_order(grid_) : ffn_order_spec(opt.order, grid_));
  }
  ExecPlan plan = make_exec_plan(G, sched_, {{g_.op_gate_up, opt.sync}});  // validates the schedule
  if (sm90_) run_whole_units(plan, G);  // the body runs a ticket of every slice of a tile in one go
  TW_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  TW_CUDA_CHECK(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));

  plan_ = std::make_unique<runtime::DevicePlan>(plan);
  const bool split_tiles = std::any_of(plan.order.begin(), plan.order.end(), [&](int32_t id) { return plan.tiles[id].arrive >= 0; });
  split_finisher_ = sm90_ && opt.split_finisher && split_tiles && ffn_sm90::split_finisher_pays(act_rows_) &&
                    split_finisher_last(G, sched_);
  packed_ = opt.packed_weights;
  overlap_ = opt.overlap_previous;
  ticket_lead_ = opt.ticket_lead;
  if (packed_ && !sm90_)
    throw InvalidArgument("FFN: packed_weights is a layout of the sm90 tile body (mainloop '" + opt.mainloop + "')");
  if (overlap_ && !sm90_)
    throw InvalidArgument("FFN: overlap_previous needs the sm90 tile body (mainloop '" + opt.mainloop + "')");
  if (opt.trace) {
    if (!sm90_) throw InvalidArgument("FFN: trace is recorded by the sm90 tile body only (mainloop '" + opt.mainloop + "')");
    plan_->enable_trace();
  }
  TW_CUDA_CHECK(cudaMalloc(&h_, sizeof(bf16) * shape_.m * shape_.f));
  const Op& gu = G.op(g_.op_gate_up);
  const Op& dn = G.op(g_.op_down);
  // Split-K accumulators, zeroed once: each launch's last slice leaves them zero again. sm90 keeps
  // one block per output tile in the consumers' fragment order (tile rows x act rows floats).
  auto ws_floats = [&](const Op& o, size_t sm80_floats) -> size_t {
    if (o.tiling.split_k <= 1) return 0;
    return sm90_ ? size_t(o.grid_m) * o.grid_n * ffn_sm90::kTileRows * act_rows_ : sm80_floats;
  };
  const size_t ws_gu = ws_floats(gu, size_t(shape_.m) * (shape_.gated ? 2 : 1) * shape_.f);
  const size_t ws_dn = ws_floats(dn, size_t(shape_.m) * shape_.d);
  ws_down_offset_ = (ws_gu + 63) / 64 * 64;
  ws_bytes_ = sizeof(float) * (ws_down_offset_ + ws_dn + 1);
  TW_CUDA_CHECK(cudaMalloc(&ws_, ws_bytes_));
  TW_CUDA_CHECK(cudaMemset(ws_, 0, ws_bytes_));
}

FusedFfn::~FusedFfn() {
  cudaFree(h_);
  cudaFree(ws_);
  if (fork_) cudaEventDestroy(fork_);
  if (join_) cudaEventDestroy(join_);
}

struct FusedFfn::Launch {
  ChainParams cp;              // sm80
  ffn_sm90::Maps maps;         // sm90
  ffn_sm90::OpArgs ops[2];
};

FusedFfn::Launch FusedFfn::prepare(const bf16* x, const bf16* w_gate_up, const bf16* w_down, bf16* y) const {
  ffn_sm90::check_operand("FusedFfn", x, "x");
  ffn_sm90::check_operand("FusedFfn", w_gate_up, "w_gate_up");
  ffn_sm90::check_operand("FusedFfn", w_down, "w_down");
  ffn_sm90::check_operand("FusedFfn", y, "y");
  const TileGraph& G = g_.graph;
  const Op& gu = G.op(g_.op_gate_up);
  const Op& dn = G.op(g_.op_down);
  // Slices as the graph cut them (whole BK steps): tile.k0 = ks * slice.
  const int64_t sl_gu = G.tile(gu.first_tile).k1 - G.tile(gu.first_tile).k0;
  const int64_t sl_dn = G.tile(dn.first_tile).k1 - G.tile(dn.first_tile).k0;
  Launch l{};
  l.cp.ops[g_.op_gate_up] = {x, w_gate_up, h_, ws_, shape_.m, shape_.f, shape_.d, sl_gu,
                             static_cast<int32_t>(gu.tiling.split_k), shape_.gated ? 1 : 0, int32_t(shape_.act)};
  l.cp.ops[g_.op_down] = {h_, w_down, y, ws_ + ws_down_offset_, shape_.m, shape_.d, shape_.f, sl_dn,
                          static_cast<int32_t>(dn.tiling.split_k), 0, 0};
  if (sm90_) {
    const int64_t m = shape_.m, d = shape_.d, f = shape_.f;
    const int step = static_cast<int>(gu.tiling.bk);
    if (!packed_) {  // packed weights are read by bulk copies; their maps stay zero and unused
      l.maps.w0 = shape_.gated ? ffn_sm90::gate_up_map(w_gate_up, f, d) : ffn_sm90::weight_map(w_gate_up, f, d);
      l.maps.w1 = ffn_sm90::weight_map(w_down, d, f);
    }
    l.maps.x = ffn_sm90::act_map(x, m, d, act_rows_);
    l.maps.h = ffn_sm90::act_map(h_, m, f, act_rows_);
    auto args = [&](const Op& o, bf16* out, float* ws, bool silu, int act, const bf16* w, bool publish) {
      ffn_sm90::OpArgs a{out, ws, int32_t(m), int32_t(o.n), int32_t(o.grid_n), int32_t(o.tiling.split_k), silu ? 1 : 0,
                         act, packed_ ? w : nullptr, int32_t(ffn_sm90::packed_atoms(o.k)), publish ? 1 : 0, {}};
      // Slices as the graph cut them (whole stages; the last rounded up to cover K).
      for (int64_t ks = 0; ks <= o.tiling.split_k; ++ks) a.slice_start[ks] = int16_t((o.k_begin(ks) + step - 1) / step);
      return a;
    };
    // h is read by the down tiles (or, as two kernels, by the consumer kernel); y by no tile.
    l.ops[g_.op_gate_up] = args(gu, h_, ws_, shape_.gated, int(shape_.act), w_gate_up, true);
    l.ops[g_.op_down] = args(dn, y, ws_ + ws_down_offset_, false, 0, w_down, false);
  }
  return l;
}

FfnPackedSize FusedFfn::packed_size() const {
  const int64_t block = ffn_sm90::kTileRows * 64;
  return {ffn_sm90::packed_tiles(shape_.f, shape_.gated) * ffn_sm90::packed_atoms(shape_.d) * block,
          ffn_sm90::packed_tiles(shape_.d, false) * ffn_sm90::packed_atoms(shape_.f) * block};
}

void FusedFfn::pack(const bf16* w_gate_up, const bf16* w_down, bf16* packed_gate_up, bf16* packed_down,
                    cudaStream_t stream) const {
  if (!packed_) throw InvalidArgument("FusedFfn::pack: this object was built without packed_weights");
  ffn_sm90::check_operand("FusedFfn", w_gate_up, "w_gate_up");
  ffn_sm90::check_operand("FusedFfn", w_down, "w_down");
  ffn_sm90::check_operand("FusedFfn", packed_gate_up, "packed_gate_up");
  ffn_sm90::check_operand("FusedFfn", packed_down, "packed_down");
  ffn_sm90::pack_weights(w_gate_up, packed_gate_up, shape_.f, shape_.d, shape_.gated, stream);
  ffn_sm90::pack_weights(w_down, packed_down, shape_.d, shape_.f, false, stream);
}

void FusedFfn::launch(const Launch& l, const runtime::ExecParams& ep, int grid, cudaStream_t stream) const {
  if (sm90_) {
    ffn_sm90::launch(ep, l.maps, l.ops, act_rows_, grid, overlap_, ticket_lead_, split_finisher_, stream);
  } else {
    kernel_for(act_rows_ / 8, bk_, ks_)<<<grid, sm80::kThreads, smem_, stream>>>(ep, l.cp);
    TW_CUDA_CHECK_LAUNCH();
  }
}

void FusedFfn::reset() {
  plan_->reset();
  TW_CUDA_CHECK(cudaMemset(ws_, 0, ws_bytes_));
}

void FusedFfn::run(const bf16* x, const bf16* w_gate_up, const bf16* w_down, bf16* y, cudaStream_t stream) const {
  const Launch l = prepare(x, w_gate_up, w_down, y);
  use_mode(mode_, 1);
  launch(l, plan_->params(spin_limit_, delay_ns_), grid_, stream);
}

void FusedFfn::run_two_kernels(const bf16* x, const bf16* w_gate_up, const bf16* w_down, bf16* y, cudaStream_t stream,
                               cudaStream_t consumer_stream) const {
  const Launch l = prepare(x, w_gate_up, w_down, y);
  // The plan's tickets (a whole ticket of K slices, run_whole_units, is one): gate/up's first, then down's.
  const std::vector<int32_t>& order = plan_->host().order;
  const int n = static_cast<int>(order.size());
  int n_gu = 0;
  while (n_gu < n && g_.graph.tile(order[n_gu]).op == g_.op_gate_up) ++n_gu;
  for (int i = n_gu; i < n; ++i)
    if (g_.graph.tile(order[i]).op == g_.op_gate_up)
      throw InvalidArgument("FusedFfn::run_two_kernels: schedule '" + sched_.name + "' interleaves the ops (ticket " +
                            std::to_string(i) + "); use op_by_op or op_by_op_column");
  use_mode(mode_, 2);
  const runtime::ExecParams prod = plan_->params_range(0, n_gu, 0, spin_limit_, delay_ns_);
  const runtime::ExecParams cons = plan_->params_range(n_gu, n, 1, spin_limit_, delay_ns_);
  const int full = sms_ * fit_per_sm_;
  const int grid_p = std::min(n_gu, full), grid_c = std::min(n - n_gu, full);
  TW_CUDA_CHECK(cudaEventRecord(fork_, stream));
  TW_CUDA_CHECK(cudaStreamWaitEvent(consumer_stream, fork_, 0));
  launch(l, prod, grid_p, stream);
  runtime::launch_wait_for_producer(prod, cons, grid_p, consumer_stream);
  launch(l, cons, grid_c, consumer_stream);
  TW_CUDA_CHECK(cudaEventRecord(join_, consumer_stream));
  TW_CUDA_CHECK(cudaStreamWaitEvent(stream, join_, 0));
}

}  // namespace tw
