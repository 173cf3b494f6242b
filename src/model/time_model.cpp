#include "tileweave/model/time_model.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace tw {

void TimeParams::validate() const {
  if (!(read_tbps > 0)) throw InvalidArgument("read bandwidth must be positive, got " + to_text(read_tbps) + " TB/s");
  if (!(gemm_tflops > 0)) throw InvalidArgument("GEMM peak must be positive, got " + to_text(gemm_tflops) + " TFLOP/s");
  if (!(sm_stream_gbps > 0)) throw InvalidArgument("per-SM streaming rate must be positive, got " + to_text(sm_stream_gbps) + " GB/s");
  if (!(launch_us >= 0)) throw InvalidArgument("launch cost must be >= 0, got " + to_text(launch_us) + " us");
  if (slots < 1) throw InvalidArgument("tiles in flight must be at least 1, got " + std::to_string(slots));
}

TimeParams time_params(const GpuPreset& gpu, int slots) {
  return {gpu.read_tbps, gpu.gemm_tflops, gpu.sm_stream_gbps, gpu.launch_us, slots};
}

// Times in microseconds: bytes / (TB/s * 1e6), FLOPs / (TFLOP/s * 1e6).
OpTime op_time(const std::string& name, int tiles, double bytes, double flops, const TimeParams& p) {
  p.validate();
  OpTime o;
  o.name = name;
  o.tiles = tiles;
  o.bytes = bytes;
  o.flops = flops;
  o.intensity = bytes > 0 ? flops / bytes : 0;
  o.compute_bound = o.intensity > p.gemm_tflops / p.read_tbps;
  o.memory_us = bytes / (p.read_tbps * 1e6);
  o.compute_us = flops / (p.gemm_tflops * 1e6);
  if (tiles <= 0) return o;
  const int64_t full = tiles / p.slots, rest = tiles % p.slots;
  o.waves = double(tiles) / p.slots;
  o.tail_efficiency = double(tiles) / (double(full + (rest > 0)) * p.slots);
  // A wave of r tiles moves r tiles' share of the bytes at min(floor, r SMs' streaming rate), and
  // computes r tiles' share of the FLOPs on r of the P SMs' share of the peak.
  auto wave_us = [&](int64_t r) {
    const double tbps = std::min(p.read_tbps, r * p.sm_stream_gbps / 1000.0);
    const double mem = bytes * r / tiles / (tbps * 1e6);
    const double comp = flops * r / tiles / (p.gemm_tflops * 1e6 * r / p.slots);
    return std::max(mem, comp);
  };
  o.us = full * wave_us(p.slots) + (rest > 0 ? wave_us(rest) : 0.0);
  return o;
}

TimePrediction predict_time(const TrafficReport& r, const TimeParams& p) {
  p.validate();
  TimePrediction t;
  t.ridge = p.gemm_tflops / p.read_tbps;
  double bytes = 0, flops = 0;
  for (const OpTraffic& o : r.per_op) {
    t.ops.push_back(op_time(o.name, o.tiles, double(o.dram_read + o.dram_write), o.flops, p));
    bytes += double(o.dram_read + o.dram_write);
    flops += o.flops;
    t.separate_us += t.ops.back().us + p.launch_us;
  }
  // One launch: the ops' tiles overlap (a consumer starts while its producer's last wave runs), so
  // the whole chain is one roofline and only the last op's partial wave is exposed.
  const double roof = std::max(bytes / (p.read_tbps * 1e6), flops / (p.gemm_tflops * 1e6));
  const double tail = t.ops.empty() ? 0.0 : t.ops.back().us - std::max(t.ops.back().memory_us, t.ops.back().compute_us);
  t.fused_us = roof + std::max(tail, 0.0) + p.launch_us;
  return t;
}

}  // namespace tw
