// Tensor parallelism on one GPU: every rank's DecodeStep in this process, their collectives local
// reductions over the ranks' buffers (TensorParallelLocal). The one-GPU check of the step that runs
// one rank per GPU over NCCL (decode_step_nccl.cu): the same launches, the same buffers reduced.
#include <algorithm>
#include <string>

#include "tileweave/ops/decode_step.hpp"
#include "tileweave/util/cuda_check.hpp"

namespace tw {

namespace {

constexpr int kMaxLocalRanks = 8;
struct LocalParts {
  void* p[kMaxLocalRanks];
};

// Element i of every rank's buffer: the sum in rank order (fp32) or the max (u64), written back to each.
__global__ void all_reduce_sum_kernel(LocalParts parts, int ranks, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int r = 0; r < ranks; ++r) s += static_cast<const float*>(parts.p[r])[i];
    for (int r = 0; r < ranks; ++r) static_cast<float*>(parts.p[r])[i] = s;
  }
}
__global__ void all_reduce_max_kernel(LocalParts parts, int ranks, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    unsigned long long m = 0;
    for (int r = 0; r < ranks; ++r) m = max(m, static_cast<const unsigned long long*>(parts.p[r])[i]);
    for (int r = 0; r < ranks; ++r) static_cast<unsigned long long*>(parts.p[r])[i] = m;
  }
}

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("tensor-parallel step: " + what); }

}  // namespace

void all_reduce_local(const std::vector<StepCollective>& parts, cudaStream_t stream) {
  if (parts.empty() || parts.size() > size_t(kMaxLocalRanks))
    bad(std::to_string(parts.size()) + " ranks for a local all-reduce (1 to " + std::to_string(kMaxLocalRanks) + ")");
  LocalParts lp{};
  for (size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].kind != parts[0].kind || parts[r].count != parts[0].count)
      bad("rank " + std::to_string(r) + "'s collective differs from rank 0's (kind or count)");
    lp.p[r] = parts[r].data;
  }
  const int64_t n = parts[0].count;
  const int blocks = int(std::min<int64_t>((n + 255) / 256, 1024));
  if (n == 0) return;
  if (parts[0].kind == StepCollective::SumF32) all_reduce_sum_kernel<<<blocks, 256, 0, stream>>>(lp, int(parts.size()), n);
  else all_reduce_max_kernel<<<blocks, 256, 0, stream>>>(lp, int(parts.size()), n);
  TW_CUDA_CHECK_LAUNCH();
}

TensorParallelLocal::TensorParallelLocal(const ModelConfig& c, int tp, DecodeStepOptions opt) {
  if (tp < 1 || tp > kMaxLocalRanks)
    bad("tp " + std::to_string(tp) + " is outside [1, " + std::to_string(kMaxLocalRanks) + "] for one GPU");
  opt.tp = tp;
  const bool in_launch = tp > 1 && opt.collectives_in_launch;
  if (in_launch) {
    // The ranks' launches wait on one another, so all of them must be resident at once: each takes a
    // share of the SMs, and none starts before the previous one ends (an overlapped launch of a
    // rank's next step could take SMs another rank's current step still needs).
    int dev = 0, sms = 0;
    TW_CUDA_CHECK(cudaGetDevice(&dev));
    TW_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (opt.sms == 0) opt.sms = sms / tp;
    if (opt.sms < 1 || int64_t(opt.sms) * tp > sms)
      bad(std::to_string(tp) + " ranks of " + std::to_string(opt.sms) + " SMs do not fit this GPU's " + std::to_string(sms));
    opt.overlap_previous = false;
  }
  for (int r = 0; r < tp; ++r) {
    opt.rank = r;
    ranks_.push_back(std::make_unique<DecodeStep>(c, opt));
  }
  if (!in_launch) return;
  std::vector<void*> regions;
  for (auto& r : ranks_) regions.push_back(r->exchange_region());
  for (auto& r : ranks_) r->set_exchange(regions);
  events_.resize(tp + 1);
  for (auto& e : events_) TW_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  streams_.resize(tp);
  for (auto& s : streams_) TW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
}

TensorParallelLocal::~TensorParallelLocal() {
  for (auto& e : events_) cudaEventDestroy(e);
  for (auto& s : streams_) cudaStreamDestroy(s);
}

void TensorParallelLocal::load_weights(const HostWeights& w) {
  for (auto& r : ranks_) r->load_weights(w);
}
void TensorParallelLocal::set_lengths(const std::vector<int>& lengths, cudaStream_t stream) {
  for (auto& r : ranks_) r->set_lengths(lengths, stream);
}
void TensorParallelLocal::set_page_table(const std::vector<int>& table, cudaStream_t stream) {
  for (auto& r : ranks_) r->set_page_table(table, stream);
}
void TensorParallelLocal::set_tokens(const std::vector<int32_t>& tokens, cudaStream_t stream) {
  for (auto& r : ranks_) r->set_tokens(tokens, stream);
}
void TensorParallelLocal::set_active(const std::vector<uint8_t>& active, cudaStream_t stream) {
  for (auto& r : ranks_) r->set_active(active, stream);
}

void TensorParallelLocal::step(cudaStream_t stream) {
  if (!streams_.empty()) {  // collectives in the launch: every rank's launch side by side, joined on `stream`
    TW_CUDA_CHECK(cudaEventRecord(events_[0], stream));
    for (int r = 0; r < tp(); ++r) {
      TW_CUDA_CHECK(cudaStreamWaitEvent(streams_[r], events_[0]));
      ranks_[r]->step(streams_[r]);
      TW_CUDA_CHECK(cudaEventRecord(events_[1 + r], streams_[r]));
    }
    for (int r = 0; r < tp(); ++r) TW_CUDA_CHECK(cudaStreamWaitEvent(stream, events_[1 + r]));
    return;
  }
  const int n = ranks_[0]->segments();
  std::vector<StepCollective> parts(ranks_.size());
  for (int i = 0; i < n; ++i) {
    for (auto& r : ranks_) r->run_segment(i, stream);
    if (i + 1 == n) break;
    for (size_t r = 0; r < ranks_.size(); ++r) parts[r] = ranks_[r]->collective(i);
    all_reduce_local(parts, stream);
  }
}

std::vector<float> TensorParallelLocal::logits(cudaStream_t stream) const {
  const int B = ranks_[0]->shape().batch;
  const int64_t Vs = ranks_[0]->config().vocab_size, V = Vs * tp();
  std::vector<float> out(size_t(B) * V);
  for (int r = 0; r < tp(); ++r) {
    const std::vector<float> part = ranks_[r]->logits(stream);
    for (int b = 0; b < B; ++b) std::copy_n(part.begin() + b * Vs, Vs, out.begin() + b * V + r * Vs);
  }
  return out;
}

}  // namespace tw
