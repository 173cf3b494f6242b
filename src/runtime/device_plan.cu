#include "tileweave/runtime/device_plan.hpp"

#include <cuda/atomic>
#include <algorithm>
#include <cstring>
#include <vector>

#include "tileweave/util/cuda_check.hpp"

namespace tw::runtime {

namespace {
// CuSync's wait kernel, for two kernels on two streams: launched on the consumer's stream before
// the consumer kernel, it returns once all `producer_blocks` of the producer's current launch have
// started, so consumer blocks (which spin) can never hold the SMs the producer still needs.
// The consumer's epoch counts its completed launches, so the target needs no host argument
// (and the launch can be captured in a CUDA graph).
__global__ void wait_for_producer(const ExecState* producer, const ExecState* consumer, uint32_t producer_blocks) {
  using ref = cuda::atomic_ref<const uint32_t, cuda::thread_scope_device>;
  const uint32_t target = producer_blocks * (ref(consumer->epoch).load(cuda::memory_order_relaxed) + 1);
  while (static_cast<int32_t>(ref(producer->started).load(cuda::memory_order_acquire) - target) < 0) __nanosleep(128);
}

size_t align_up(size_t v) { return (v + 255) & ~size_t(255); }
}  // namespace

DevicePlan::DevicePlan(const ExecPlan& plan, int slots) : plan_(plan), slots_(slots) {
  if (slots < 1) throw InvalidArgument("DevicePlan: " + std::to_string(slots) + " launch-state slots (need >= 1)");
  // One allocation: [state | signals | arrivals] (zeroed) then [order | tiles | waits | units | ordered] (uploaded).
  const size_t state_b = align_up(size_t(slots) * sizeof(ExecState));
  const size_t sig_b = align_up(sizeof(uint32_t) * (plan.num_signal_counters + 1));
  const size_t arr_b = align_up(sizeof(uint32_t) * (plan.num_arrive_counters + 1));
  const size_t order_b = align_up(sizeof(int32_t) * plan.order.size());
  const size_t tiles_b = align_up(sizeof(DeviceTile) * plan.tiles.size());
  const size_t ordered_b = align_up(sizeof(DeviceTile) * plan.order.size());
  const size_t waits_b = align_up(sizeof(WaitEntry) * (plan.waits.size() + 1));
  const size_t units_b = align_up(sizeof(int32_t) * (plan.units.size() + 1));
  counter_bytes_ = state_b + sig_b + arr_b;
  const size_t total = counter_bytes_ + order_b + tiles_b + waits_b + units_b + ordered_b;
  TW_CUDA_CHECK(cudaMalloc(&mem_, total));
  std::vector<char> host(total, 0);
  std::memcpy(host.data() + counter_bytes_, plan.order.data(), sizeof(int32_t) * plan.order.size());
  std::memcpy(host.data() + counter_bytes_ + order_b, plan.tiles.data(), sizeof(DeviceTile) * plan.tiles.size());
  std::memcpy(host.data() + counter_bytes_ + order_b + tiles_b, plan.waits.data(), sizeof(WaitEntry) * plan.waits.size());
  std::memcpy(host.data() + counter_bytes_ + order_b + tiles_b + waits_b, plan.units.data(), sizeof(int32_t) * plan.units.size());
  const size_t ordered_at = counter_bytes_ + order_b + tiles_b + waits_b + units_b;
  for (size_t i = 0; i < plan.order.size(); ++i)
    std::memcpy(host.data() + ordered_at + sizeof(DeviceTile) * i, &plan.tiles[plan.order[i]], sizeof(DeviceTile));
  TW_CUDA_CHECK(cudaMemcpy(mem_, host.data(), total, cudaMemcpyHostToDevice));
  p_.state = reinterpret_cast<ExecState*>(mem_);
  p_.signals = reinterpret_cast<uint32_t*>(mem_ + state_b);
  p_.arrivals = reinterpret_cast<uint32_t*>(mem_ + state_b + sig_b);
  p_.order = reinterpret_cast<const int32_t*>(mem_ + counter_bytes_);
  p_.tiles = reinterpret_cast<const DeviceTile*>(mem_ + counter_bytes_ + order_b);
  p_.waits = reinterpret_cast<const WaitEntry*>(mem_ + counter_bytes_ + order_b + tiles_b);
  p_.ordered = reinterpret_cast<const DeviceTile*>(mem_ + ordered_at);
  p_.num_tiles = static_cast<int32_t>(plan.order.size());
  if (!plan.units.empty()) {
    p_.units = reinterpret_cast<const int32_t*>(mem_ + counter_bytes_ + order_b + tiles_b + waits_b);
    p_.num_units = static_cast<int32_t>(plan.units.size()) - 1;
  }
}

DevicePlan::~DevicePlan() {
  cudaFree(mem_);
  cudaFree(trace_);
}

void DevicePlan::enable_trace() {
  if (trace_) return;
  const size_t bytes = sizeof(unsigned long long) * kTraceWords * plan_.tiles.size();
  TW_CUDA_CHECK(cudaMalloc(&trace_, bytes));
  TW_CUDA_CHECK(cudaMemset(trace_, 0, bytes));
  p_.trace = trace_;
}

std::vector<DevicePlan::TileTimes> DevicePlan::read_trace() const {
  if (!trace_) throw InvalidArgument("DevicePlan::read_trace: tracing is off (call enable_trace before the launch)");
  std::vector<unsigned long long> w(kTraceWords * plan_.tiles.size());
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  TW_CUDA_CHECK(cudaMemcpy(w.data(), trace_, sizeof(w[0]) * w.size(), cudaMemcpyDeviceToHost));
  unsigned long long t0 = ~0ull;
  for (size_t i = 0; i < plan_.tiles.size(); ++i)
    if (w[i * kTraceWords + kTraceTaken]) t0 = std::min(t0, w[i * kTraceWords + kTraceTaken]);
  std::vector<TileTimes> out;
  for (size_t i = 0; i < plan_.tiles.size(); ++i) {
    const unsigned long long* r = &w[i * kTraceWords];
    auto us = [&](int k) { return r[k] ? (double(r[k]) - double(t0)) * 1e-3 : -1.0; };
    out.push_back({int(i), int(r[kTraceSm]), us(kTraceTaken), us(kTraceReady), us(kTraceStarted), us(kTraceComputed),
                   us(kTraceDone), us(kTraceMark1), us(kTraceMark2)});
  }
  return out;
}

ExecParams DevicePlan::params(uint32_t spin_limit, uint32_t delay_ns) const {
  ExecParams p = p_;
  p.spin_limit = spin_limit;
  p.delay_ns = delay_ns;
  return p;
}

ExecParams DevicePlan::params_range(int begin, int end, int slot, uint32_t spin_limit, uint32_t delay_ns) const {
  if (begin < 0 || end < begin || end > p_.num_tiles || slot < 0 || slot >= slots_)
    throw InvalidArgument("DevicePlan::params_range: tickets [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") slot " + std::to_string(slot) + " out of range");
  if (p_.units)  // a range of positions would cut through tickets of several tiles
    throw InvalidArgument("DevicePlan::params_range: the schedule has units (tickets of several tiles); run it whole");
  ExecParams p = params(spin_limit, delay_ns);
  p.order += begin;
  p.ordered += begin;
  p.num_tiles = end - begin;
  p.state += slot;
  return p;
}

uint32_t DevicePlan::error() const {
  std::vector<ExecState> s(slots_);
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  TW_CUDA_CHECK(cudaMemcpy(s.data(), p_.state, sizeof(ExecState) * s.size(), cudaMemcpyDeviceToHost));
  uint32_t error = 0;
  for (const ExecState& e : s) error |= e.error;
  return error;
}

void DevicePlan::reset() {
  TW_CUDA_CHECK(cudaDeviceSynchronize());
  TW_CUDA_CHECK(cudaMemset(mem_, 0, counter_bytes_));
}

void launch_wait_for_producer(const ExecParams& producer, const ExecParams& consumer, int producer_blocks,
                              cudaStream_t stream) {
  wait_for_producer<<<1, 1, 0, stream>>>(producer.state, consumer.state, static_cast<uint32_t>(producer_blocks));
  TW_CUDA_CHECK_LAUNCH();
}

}  // namespace tw::runtime
