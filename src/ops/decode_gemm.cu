#include "tileweave/ops/decode_gemm.hpp"

#include <algorithm>

#include "ffn_sm90.hpp"
#include "tileweave/model/validation.hpp"  // sm90_op_tiling
#include "tileweave/ops/ffn.hpp"            // FfnOptions::ticket_lead, split_finisher
#include "tileweave/order/orders.hpp"
#include "tileweave/runtime/exec_plan.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace tw {
using bf16 = __nv_bfloat16;

namespace {
// K slices per output tile: as many as fill one wave of SMs, and none once the tiles alone do.
// A split unit's epilogue (fp32 reduction in L2, then the last slice's read-back) holds up its
// SM's stream for ~1 us at M = 1 and ~3 us at M = 64, more than the SMs left idle by a partial
// last wave cost: on the H200 the 8B gate_up (224 tiles) ran 62.8 / 65.0 / 68.1 / 74.4 us at
// M = 1 cut in 1 / 2 / 4 / 8 slices, while the 8B down (32 tiles) was best at 4 (one wave of
// 128): 50.6 / 35.8 / 34.3 / 35.9 us (bench_gemm --split-sweep).
int one_wave_split(int64_t tiles, int64_t stages, int sms) {
  return int(std::clamp<int64_t>(sms / tiles, 1, std::min<int64_t>(stages, ffn_sm90::kMaxSlices)));
}
}  // namespace

DecodeGemm::DecodeGemm(int64_t m, int64_t n, int64_t k, const DecodeGemmOptions& opt)
    : m_(m), n_(n), k_(k), packed_(opt.packed_weights), overlap_(opt.overlap_previous), spin_limit_(opt.spin_limit) {
  if (m < 1) throw InvalidArgument("DecodeGemm: M must be >= 1, got " + std::to_string(m));
  if (n < 1) throw InvalidArgument("DecodeGemm: N must be >= 1, got " + std::to_string(n));
  if (k < 8 || k % 8) throw InvalidArgument("DecodeGemm: K must be a positive multiple of 8, got " + std::to_string(k));
  int dev = 0, major = 0, sms = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  if (major != 9) throw InvalidArgument("DecodeGemm: needs an sm_90 GPU (H100/H200); this one is sm_" + std::to_string(major) + "x");
  const int64_t rows = sm90_tile_rows(m, opt.tile_rows), step = ffn_sm90::stage_cols_for(int(rows));
  const int64_t out_tiles = ((m + rows - 1) / rows) * ((n + ffn_sm90::kTileRows - 1) / ffn_sm90::kTileRows);
  // Stream-K: even slices, one ticket of equal K work per SM (FfnOptions::order says more).
  const bool stream_k = is_stream_k_order(opt.order);
  const int split = opt.split_k      ? opt.split_k
                    : stream_k ? stream_k_split(m, n, k, sms, int(rows))
                               : one_wave_split(out_tiles, (k + step - 1) / step, sms);
  const Tiling t = sm90_op_tiling(m, n, k, 0, split, stream_k ? "even" : opt.k_slices, sms, int(rows));
  const int x = g_.add_tensor("x", m, k, 2, TensorRole::Input);
  const int w = g_.add_tensor("w", n, k, 2, TensorRole::Weight);
  const int y = g_.add_tensor("y", m, n, 2, TensorRole::Output);
  op_ = g_.add_gemm("gemm", x, w, y, t);
  sched_ = make_order(g_, ffn_order_spec(opt.order, sms));
  plan_ = std::make_unique<runtime::DevicePlan>(make_exec_plan(g_, sched_));
  if (opt.trace) plan_->enable_trace();  // the FFN's tile body stamps the times (ffn_sm90.cu)
  act_rows_ = static_cast<int>(t.bm);
  split_finisher_ = FfnOptions{}.split_finisher && ffn_sm90::split_finisher_pays(act_rows_) && split_finisher_last(g_, sched_);
  ffn_sm90::prepare_kernel(act_rows_);
  grid_ = sms;  // one CTA per SM (the tile body takes over half an SM's shared memory)
  const Op& o = g_.op(op_);
  const size_t ws_floats = o.tiling.split_k > 1 ? size_t(o.grid_m) * o.grid_n * ffn_sm90::kTileRows * act_rows_ : 1;
  TW_CUDA_CHECK(cudaMalloc(&ws_, ws_floats * sizeof(float)));
  TW_CUDA_CHECK(cudaMemset(ws_, 0, ws_floats * sizeof(float)));
}

DecodeGemm::~DecodeGemm() { cudaFree(ws_); }

int64_t DecodeGemm::packed_size() const {
  return ffn_sm90::packed_tiles(n_, false) * ffn_sm90::packed_atoms(k_) * ffn_sm90::kTileRows * 64;
}

void DecodeGemm::pack(const bf16* w, bf16* packed, cudaStream_t stream) const {
  if (!packed_) throw InvalidArgument("DecodeGemm::pack: this object was built without packed_weights");
  ffn_sm90::check_operand("DecodeGemm", w, "w");
  ffn_sm90::check_operand("DecodeGemm", packed, "packed");
  ffn_sm90::pack_weights(w, packed, n_, k_, false, stream);
}

void DecodeGemm::run(bf16* y, const bf16* x, const bf16* w, cudaStream_t stream) const {
  ffn_sm90::check_operand("DecodeGemm", y, "y");
  ffn_sm90::check_operand("DecodeGemm", x, "x");
  ffn_sm90::check_operand("DecodeGemm", w, "w");
  const Op& o = g_.op(op_);
  const int step = static_cast<int>(o.tiling.bk);
  ffn_sm90::Maps maps{};
  if (!packed_) maps.w0 = ffn_sm90::weight_map(w, n_, k_);
  maps.x = ffn_sm90::act_map(x, m_, k_, act_rows_);
  maps.h = maps.x;  // the body prefetches every map; this op reads only x
  maps.w1 = maps.w0;
  ffn_sm90::OpArgs ops[2]{};
  ops[0] = {y, ws_, int32_t(m_), int32_t(n_), int32_t(o.grid_n), int32_t(o.tiling.split_k), 0, 0,
            packed_ ? w : nullptr, int32_t(ffn_sm90::packed_atoms(k_)), 0, {}};  // y: read by no tile
  for (int64_t ks = 0; ks <= o.tiling.split_k; ++ks) ops[0].slice_start[ks] = int16_t((o.k_begin(ks) + step - 1) / step);
  ops[1] = ops[0];  // no tile of op 1 exists
  ffn_sm90::launch(plan_->params(spin_limit_), maps, ops, act_rows_, grid_, overlap_, FfnOptions{}.ticket_lead,
                   split_finisher_, stream);
}

}  // namespace tw
