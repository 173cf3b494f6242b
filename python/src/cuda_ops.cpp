// The GPU ops for Python, built only with CUDA (TW_HAVE_CUDA). They take raw device pointers and a
// cudaStream_t as integers: python/tileweave/ops.py checks the torch tensors (dtype, device, shape,
// contiguity, naming the argument), passes tensor.data_ptr() and the caller's current stream, so
// nothing here depends on torch's C++ ABI and nothing is copied. A plan object (FusedFfn,
// DecodeGemm, DecodeAttention, PrefillAttention, DecodeStep) allocates and uploads when it is made:
// make it before a CUDA graph captures its runs.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tileweave/llm/weights.hpp"
#include "tileweave/ops/attention.hpp"
#include "tileweave/ops/decode_gemm.hpp"
#include "tileweave/ops/decode_step.hpp"
#include "tileweave/ops/ffn.hpp"
#include "tileweave/ops/prefill_attention.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tw::py {

ModelConfig config_from(const std::string& name_or_dir);  // model.cpp: a named config or a folder's config.json
HostWeights weights_from(const ModelConfig& c, const nb::dict& tensors);  // model.cpp: {name: bytes of bf16}

namespace {

using bf16 = __nv_bfloat16;
template <class T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}
cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// y = FFN(x) with the fused executor. One plan per (m, d, ffn, gated, packed); its intermediate
// and counters are its own, so one stream at a time.
struct FfnPlan {
  std::unique_ptr<FusedFfn> op;
  // activation: "silu" (gated), or the plain chain's "identity", "relu", "gelu_tanh".
  FfnPlan(int64_t m, int64_t d, int64_t ffn, const std::string& activation, bool packed) {
    const bool gated = activation == "silu";
    FfnShape s{m, d, ffn, gated};
    if (!gated) s.act = ffn_activation_from(activation == "identity" ? "none" : activation);
    FfnOptions o;
    o.packed_weights = packed;
    op = std::make_unique<FusedFfn>(s, o);
  }
  void run(uintptr_t x, uintptr_t w_gate_up, uintptr_t w_down, uintptr_t y, uintptr_t stream) const {
    op->run(ptr<const bf16>(x), ptr<const bf16>(w_gate_up), ptr<const bf16>(w_down), ptr<bf16>(y), stream_of(stream));
  }
  void pack(uintptr_t w_gate_up, uintptr_t w_down, uintptr_t out_gate_up, uintptr_t out_down, uintptr_t stream) const {
    op->pack(ptr<const bf16>(w_gate_up), ptr<const bf16>(w_down), ptr<bf16>(out_gate_up), ptr<bf16>(out_down),
             stream_of(stream));
  }
  std::tuple<int64_t, int64_t> packed_size() const {
    const FfnPackedSize s = op->packed_size();
    return {s.gate_up, s.down};
  }
};

struct GemmPlan {
  std::unique_ptr<DecodeGemm> op;
  GemmPlan(int64_t m, int64_t n, int64_t k, bool packed) {
    DecodeGemmOptions o;
    o.packed_weights = packed;
    op = std::make_unique<DecodeGemm>(m, n, k, o);
  }
  void run(uintptr_t y, uintptr_t x, uintptr_t w, uintptr_t stream) const {
    op->run(ptr<bf16>(y), ptr<const bf16>(x), ptr<const bf16>(w), stream_of(stream));
  }
  void pack(uintptr_t w, uintptr_t out, uintptr_t stream) const {
    op->pack(ptr<const bf16>(w), ptr<bf16>(out), stream_of(stream));
  }
  int64_t packed_size() const { return op->packed_size(); }
};

// Decode attention for a shape: the lengths (and the page table) are int32 device arrays given to
// each run, cut on the GPU (DecodeAttention(shape)).
struct AttentionPlan {
  std::unique_ptr<DecodeAttention> op;
  AttentionPlan(int batch, int num_q_heads, int num_kv_heads, int head_dim, bool paged, int64_t max_seq_len,
                int page_size, int num_pages, int pages_per_seq, float scale, float rope_theta, bool append) {
    DecodeAttentionShape s;
    s.batch = batch;
    s.num_q_heads = num_q_heads;
    s.num_kv_heads = num_kv_heads;
    s.head_dim = head_dim;
    s.layout = paged ? KvLayout::Paged : KvLayout::Contiguous;
    s.max_seq_len = paged ? 0 : max_seq_len;
    s.page_size = paged ? page_size : 0;
    s.num_pages = paged ? num_pages : 0;
    s.pages_per_seq = paged ? pages_per_seq : 0;
    s.scale = scale;
    s.rope_theta = rope_theta;
    s.append = append;
    op = std::make_unique<DecodeAttention>(s);
  }
  // page_table = 0 for a contiguous cache.
  void run(uintptr_t q, uintptr_t k_new, uintptr_t v_new, uintptr_t k_cache, uintptr_t v_cache, uintptr_t out,
           uintptr_t seq_lens, uintptr_t page_table, uintptr_t stream) const {
    DecodeAttentionTensors t{ptr<const bf16>(q), ptr<const bf16>(k_new), ptr<const bf16>(v_new),
                             ptr<bf16>(k_cache),  ptr<bf16>(v_cache),    ptr<bf16>(out),
                             ptr<const int>(seq_lens), ptr<const int>(page_table)};
    op->run(t, stream_of(stream));
  }
};

// Prefill attention for fixed sequence offsets: the work tiles are planned from them (and the
// offsets uploaded) when the plan is made. cu_seqlens_k empty: keys = queries.
struct PrefillAttentionPlan {
  std::unique_ptr<PrefillAttention> op;
  PrefillAttentionPlan(int num_q_heads, int num_kv_heads, int head_dim, bool causal, float scale,
                       std::vector<int> cu_seqlens_q, std::vector<int> cu_seqlens_k, bool fp8, const std::string& mainloop) {
    PrefillAttentionShape s;
    s.num_q_heads = num_q_heads;
    s.num_kv_heads = num_kv_heads;
    s.head_dim = head_dim;
    s.causal = causal;
    s.scale = scale;
    s.fp8 = fp8;
    s.mainloop = mainloop;
    op = std::make_unique<PrefillAttention>(s, std::move(cu_seqlens_q), std::move(cu_seqlens_k));
  }
  // lse = 0: no log-sum-exp output.
  void run(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t out, uintptr_t lse, uintptr_t stream) const {
    PrefillAttentionTensors t{ptr<const bf16>(q), ptr<const bf16>(k), ptr<const bf16>(v), ptr<bf16>(out),
                              ptr<float>(lse)};
    op->run(t, stream_of(stream));
  }
};

// A whole decode step of a Llama/Qwen2-family model; its state (weights, caches, tokens, lengths)
// lives on the device in the object.
struct StepPlan {
  std::unique_ptr<DecodeStep> op;
  StepPlan(const std::string& config, int batch, int64_t max_seq_len, bool paged, int page_size, bool keep_logits) {
    DecodeStepOptions o;
    o.batch = batch;
    o.max_seq_len = max_seq_len;
    o.layout = paged ? KvLayout::Paged : KvLayout::Contiguous;
    o.page_size = page_size;
    o.keep_logits = keep_logits;
    op = std::make_unique<DecodeStep>(config_from(config), o);
  }
};

}  // namespace

void bind_cuda_ops(nb::module_& m) {
  m.attr("has_cuda") = true;
  m.def("device_capability", [] {
    int dev = 0, major = 0, minor = 0;
    TW_CUDA_CHECK(cudaGetDevice(&dev));
    TW_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    TW_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return std::make_tuple(major, minor);
  });

  nb::class_<FfnPlan>(m, "FfnPlan")
      .def(nb::init<int64_t, int64_t, int64_t, const std::string&, bool>(), "m"_a, "d"_a, "ffn"_a, "activation"_a,
           "packed"_a)
      .def("run", &FfnPlan::run, "x"_a, "w_gate_up"_a, "w_down"_a, "y"_a, "stream"_a)
      .def("pack", &FfnPlan::pack, "w_gate_up"_a, "w_down"_a, "out_gate_up"_a, "out_down"_a, "stream"_a)
      .def("packed_size", &FfnPlan::packed_size);
  nb::class_<GemmPlan>(m, "GemmPlan")
      .def(nb::init<int64_t, int64_t, int64_t, bool>(), "m"_a, "n"_a, "k"_a, "packed"_a)
      .def("run", &GemmPlan::run, "y"_a, "x"_a, "w"_a, "stream"_a)
      .def("pack", &GemmPlan::pack, "w"_a, "out"_a, "stream"_a)
      .def("packed_size", &GemmPlan::packed_size);
  nb::class_<AttentionPlan>(m, "AttentionPlan")
      .def(nb::init<int, int, int, int, bool, int64_t, int, int, int, float, float, bool>(), "batch"_a,
           "num_q_heads"_a, "num_kv_heads"_a, "head_dim"_a, "paged"_a, "max_seq_len"_a, "page_size"_a, "num_pages"_a,
           "pages_per_seq"_a, "scale"_a, "rope_theta"_a, "append"_a)
      .def("run", &AttentionPlan::run, "q"_a, "k_new"_a, "v_new"_a, "k_cache"_a, "v_cache"_a, "out"_a, "seq_lens"_a,
           "page_table"_a, "stream"_a)
      .def("take_error", [](AttentionPlan& p) { return p.op->take_device_error(); })
      .def_prop_ro("num_tiles", [](const AttentionPlan& p) { return p.op->num_tiles(); });
  nb::class_<PrefillAttentionPlan>(m, "PrefillAttentionPlan")
      .def(nb::init<int, int, int, bool, float, std::vector<int>, std::vector<int>, bool, const std::string&>(),
           "num_q_heads"_a, "num_kv_heads"_a, "head_dim"_a, "causal"_a, "scale"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a,
           "fp8"_a, "mainloop"_a)
      .def("run", &PrefillAttentionPlan::run, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "stream"_a)
      .def_prop_ro("flops", [](const PrefillAttentionPlan& p) { return p.op->flops(); });
  nb::class_<StepPlan>(m, "StepPlan")
      .def(nb::init<const std::string&, int, int64_t, bool, int, bool>(), "config"_a, "batch"_a, "max_seq_len"_a,
           "paged"_a, "page_size"_a, "keep_logits"_a)
      .def("load_weights",
           [](StepPlan& p, const nb::dict& tensors) { p.op->load_weights(weights_from(p.op->config(), tensors)); })
      .def("random_weights", [](StepPlan& p, uint64_t seed) { p.op->random_weights(seed); }, "seed"_a)
      .def("set_lengths", [](StepPlan& p, const std::vector<int>& l, uintptr_t s) { p.op->set_lengths(l, stream_of(s)); })
      .def("set_tokens", [](StepPlan& p, const std::vector<int32_t>& t, uintptr_t s) { p.op->set_tokens(t, stream_of(s)); })
      .def("step", [](StepPlan& p, uintptr_t s) { p.op->step(stream_of(s)); }, "stream"_a)
      .def("tokens", [](const StepPlan& p, uintptr_t s) { return p.op->tokens(stream_of(s)); }, "stream"_a)
      .def("logits", [](const StepPlan& p, uintptr_t s) { return p.op->logits(stream_of(s)); }, "stream"_a)
      .def_prop_ro("tokens_ptr", [](const StepPlan& p) { return reinterpret_cast<uintptr_t>(p.op->tokens_device()); })
      .def_prop_ro("logits_ptr", [](const StepPlan& p) { return reinterpret_cast<uintptr_t>(p.op->logits_device()); })
      .def_prop_ro("lengths", [](const StepPlan& p) { return p.op->lengths(); })
      .def_prop_ro("batch", [](const StepPlan& p) { return p.op->shape().batch; })
      .def_prop_ro("vocab_size", [](const StepPlan& p) { return p.op->config().vocab_size; });
}

}  // namespace tw::py
