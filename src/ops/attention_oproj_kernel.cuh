// The attention -> o_proj executor kernel (private to src/ops; AttentionOproj drives it). Blocks of
// 128 threads take tickets in schedule order and run the ticket's tile: op 0 tiles are decode-
// attention work tiles (kernels/attention/decode.cuh), op 1 tiles are o_proj GEMM tiles (the sm80
// weight tile, kernels/sm80/weight_tile.cuh). Instantiated per head dim in attention_oproj_d64.cu /
// attention_oproj_d128.cu (two translation units build in parallel).
//
// No deadlock: attention tiles wait for nothing; an o_proj tile waits only for attention tiles,
// which have smaller tickets (make_exec_plan validated the schedule as a topological order under
// tile sync). The host launches at most as many blocks as are resident at once (it checks the
// occupancy), so every ticket-holding block runs, and the argument in runtime/executor.cuh applies:
// the smallest unfinished ticket always has finished producers and makes progress.
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

#include "tileweave/kernels/attention/decode.cuh"
#include "tileweave/kernels/sm80/weight_tile.cuh"
#include "tileweave/runtime/executor.cuh"

namespace tw::detail {

namespace sm80 = kernels::sm80;

constexpr int kAttentionOp = 0;  // op ids in AttentionOprojGraph: attention first, o_proj second
static_assert(kernels::kDecodeThreads == sm80::kThreads, "one block shape runs both tile bodies");

// The o_proj GEMM: Y[m, n] = X[m, k] . W[n, k]^T (+ R), X = the attention output O.
struct OprojArgs {
  const __nv_bfloat16* x;         // O [m, k], written by the attention tiles of this launch
  const __nv_bfloat16* w;         // Wo [n, k]
  const __nv_bfloat16* residual;  // [m, n] or nullptr
  __nv_bfloat16* y;               // [m, n]
  float* ws;                      // split-K accumulator [m, n], zero between launches
  int64_t m, n, k, slice;         // slice: K columns per split-K slice (whole stages)
  int32_t split;
};

// The last K slice of output block (m0, c0) to arrive: Y = the accumulated sums (+ R), and the
// accumulator re-zeroed for the next launch. kBatch sums per thread at a time, all loaded before any
// is stored: a store between two loads keeps the next load from issuing (they may alias), one L2
// round trip per element (as in the FFN). (All 32 sums of a 64 x 64 tile at once spilled registers.)
__device__ __forceinline__ void finish_split(const OprojArgs& o, int64_t m0, int64_t c0, int64_t tile_rows,
                                             int64_t tile_cols) {
  constexpr int kBatch = 8;
  const int64_t rows = min(tile_rows, o.m - m0), cols = min(tile_cols, o.n - c0), count = rows * cols;
  for (int64_t i0 = threadIdx.x; i0 < count; i0 += kBatch * blockDim.x) {
    int64_t at[kBatch];
    float sum[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0 + int64_t(u) * blockDim.x;
      at[u] = i < count ? (m0 + i / cols) * o.n + c0 + i % cols : -1;
      sum[u] = at[u] >= 0 ? __ldcg(o.ws + at[u]) : 0.f;
    }
    if (o.residual)
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        if (at[u] >= 0) sum[u] += __bfloat162float(o.residual[at[u]]);
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (at[u] >= 0) {
        o.ws[at[u]] = 0.f;
        o.y[at[u]] = __float2bfloat16(sum[u]);
      }
  }
}

// Output block (tm, tn) over K slice ks: 8 * NT rows of O x 64 / KS rows of Wo.
template <int NT, int BK, int KS>
__device__ __forceinline__ void oproj_tile(const runtime::ExecParams& ep, runtime::BlockSlots& slots,
                                           const OprojArgs& o, const DeviceTile& t, char* smem) {
  constexpr int kRows = 8 * NT, kCols = sm80::kWeightRows / KS;
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int group = tid / 32 / KS;  // the warp's 16-row group; with KS > 1 only group leaders hold sums
  const bool holds_result = (tid / 32) % KS == 0;
  const int64_t m0 = int64_t(t.tm) * kRows, c0 = int64_t(t.tn) * kCols;
  const sm80::WeightTileArgs a{o.w, o.k, o.x, o.k, m0, o.m, int64_t(t.ks) * o.slice, min(o.k, int64_t(t.ks + 1) * o.slice)};
  float acc[NT][4];
  // Wo's first stages stream while warp 0 waits for the attention tiles holding these rows and heads
  // (up to all P of them: the wide wait polls them with one round trip).
  const bool ok = sm80::weight_tile_mainloop<NT, BK, KS>(
      acc, a, [&](int r) -> int64_t { return c0 + r < o.n ? c0 + r : -1; },
      [&] { return runtime::wait_dependencies<8>(ep, slots, t); }, smem);
  if (!ok) return;  // aborted wait: publish nothing, the launch is failing

  // This thread's results: acc[j][e] is row m0 + 8j + 2q + (e & 1) of column c0 + 16G + g + 8(e / 2)
  // (weight_tile.cuh's fragment layout); f(m, col, value) for those inside Y.
  auto for_each_result = [&](auto&& f) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = m0 + 8 * j + 2 * q + (e & 1), col = c0 + 16 * group + g + 8 * (e / 2);
        if (holds_result && m < o.m && col < o.n) f(m, col, acc[j][e]);
      }
  };
  // Residuals are all loaded before any store (see finish_split). Each element's residual is read
  // by the thread that writes it, so the residual may alias y.
  auto add_residual = [&](int64_t m, int64_t col, float& v) { v += __bfloat162float(o.residual[m * o.n + col]); };
  if (o.split == 1) {
    if (o.residual) for_each_result(add_residual);
    for_each_result([&](int64_t m, int64_t col, float& v) { o.y[m * o.n + col] = __float2bfloat16(v); });
  } else {
    // Split-K as in the FFN: every slice adds into the fp32 accumulator with fire-and-forget
    // reductions; the slice that arrives last reads the sums, stores and re-zeroes the accumulator.
    for_each_result([&](int64_t m, int64_t col, float& v) { atomicAdd(o.ws + m * o.n + col, v); });
    if (runtime::arrive_split(ep, slots, t, o.split)) finish_split(o, m0, c0, kRows, kCols);
  }
  runtime::signal_done(ep, t);
}

template <int D, int G, bool kPaged, int NT, int BK, int KS>
__global__ void __launch_bounds__(sm80::kThreads, 2)
    attention_oproj_kernel(const runtime::ExecParams ep, const __grid_constant__ kernels::DecodeParams ap,
                           const OprojArgs op) {
  extern __shared__ __align__(128) char smem[];
  __shared__ runtime::BlockSlots slots;
  runtime::begin_launch(ep, slots);
  while (runtime::next_tile(ep, slots) >= 0) {
    const DeviceTile t = slots.cur;
    if (t.op == kAttentionOp) {
      // No dependencies, so no wait_dependencies: its barrier would hold all 4 warps for the next
      // ticket's atomic and descriptor load. Thread 32 draws it alone (only warp 1 starts its KV
      // stream a round trip later); next_tile's barrier orders it before its use.
      if (threadIdx.x == 32) runtime::prefetch_next(ep, slots);
      kernels::decode_work_tile<D, G, kPaged, false>(ap, t.tn, smem);
      runtime::signal_done(ep, t);  // this tile's O rows (or its partials and merge count) are out
    } else {
      oproj_tile<NT, BK, KS>(ep, slots, op, t, smem);
    }
  }
  runtime::end_launch(ep, slots);
}

struct AttentionOprojKernel {
  void (*fn)(const runtime::ExecParams, const kernels::DecodeParams, const OprojArgs) = nullptr;
  int gemm_smem = 0;  // the o_proj tile's shared memory
};

// The o_proj tile shapes of attention_oproj_tiling: 16 rows of O x 16 weight rows x 4 x 64 K (B <= 16),
// or 64 x 64 x 128.
template <int D, int G, bool kPaged>
AttentionOprojKernel make_attention_oproj_kernel(bool small_batch) {
  if (small_batch) return {attention_oproj_kernel<D, G, kPaged, 2, 64, 4>, sm80::TileShape<2, 64, 4>::smem_bytes};
  return {attention_oproj_kernel<D, G, kPaged, 8, 128, 1>, sm80::TileShape<8, 128, 1>::smem_bytes};
}

template <int D>
AttentionOprojKernel pick_attention_oproj_kernel(int g, bool paged, bool small_batch) {
  auto by_layout = [&](auto group) {
    constexpr int kG = decltype(group)::value;
    return paged ? make_attention_oproj_kernel<D, kG, true>(small_batch)
                 : make_attention_oproj_kernel<D, kG, false>(small_batch);
  };
  switch (g) {
    case 1: return by_layout(std::integral_constant<int, 1>{});
    case 2: return by_layout(std::integral_constant<int, 2>{});
    case 4: return by_layout(std::integral_constant<int, 4>{});
    default: return by_layout(std::integral_constant<int, 8>{});
  }
}

AttentionOprojKernel attention_oproj_kernel_d64(int g, bool paged, bool small_batch);
AttentionOprojKernel attention_oproj_kernel_d128(int g, bool paged, bool small_batch);

}  // namespace tw::detail
