// Decode attention: plan variants timed side by side, and one launch's per-tile timeline (where the
// time goes: launch ramp, first K/V byte, stream end per warp, merges). Same shapes and cold KV
// sets as bench_attention (Llama-3-8B attention: 32 / 8 heads, d = 128, RoPE + append) unless
// --heads / --dim say otherwise.
//   bench_attention_trace [--cases 1x32768,16x512] [--variants "default;per_sm=1,slots=4;tiles=256"]
//                         [--heads 32/8] [--dim 128] [--trace] [--reps N]
// Variant keys (DecodeAttentionShape overrides): tiles, per_sm, slots, bulk (0/1), rope (0/1), append (0/1),
// few (0: the stream-K kernel where the planner would take the few-token path; "default;few=0" is the A/B).
// A few-token launch's timeline has one row per pair: setup = prologue done, first = K/V landed.
// JSON -> $TW_RESULTS_DIR/<gpu>/attention_trace.json (timelines relative to the first tile's entry).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harness.cuh"
#include "tileweave/ops/attention.hpp"

namespace {

using bf16 = __nv_bfloat16;

__global__ void empty_kernel() {}
namespace k = tw::kernels;

// "per_sm=1,slots=4" -> overrides of `base`.
tw::DecodeAttentionShape apply_variant(tw::DecodeAttentionShape s, const std::string& spec) {
  for (const std::string& kv : tw::bench::split_list(spec, ',')) {
    if (kv == "default") continue;
    const auto eq = kv.find('=');
    if (eq == std::string::npos) throw std::runtime_error("variant item '" + kv + "' is not key=value");
    const std::string key = kv.substr(0, eq);
    const int v = std::stoi(kv.substr(eq + 1));
    if (key == "tiles") s.num_tiles = v;
    else if (key == "per_sm") s.tiles_per_sm = v;
    else if (key == "slots") s.ring_slots = v;
    else if (key == "bulk") s.kv_load = v ? tw::KvLoad::Bulk : tw::KvLoad::CpAsync;
    else if (key == "rope") s.rope_theta = v ? 500000.f : 0.f;
    else if (key == "append") s.append = v != 0;
    else if (key == "few") s.few_tokens = v != 0;
    else throw std::runtime_error("unknown variant key '" + key + "'");
  }
  return s;
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases_arg = "1x32768,1x131072,16x512,16x4096,64x512,16x32768", variants_arg = "default";
  bool trace = false;
  int reps = 60, hq = 32, hkv = 8, dim = 128;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cases") && i + 1 < argc) cases_arg = argv[++i];
    else if (!std::strcmp(argv[i], "--heads") && i + 1 < argc) {
      const std::string h = argv[++i];
      hq = std::stoi(h.substr(0, h.find('/')));
      hkv = std::stoi(h.substr(h.find('/') + 1));
    } else if (!std::strcmp(argv[i], "--dim") && i + 1 < argc) dim = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--variants") && i + 1 < argc) variants_arg = argv[++i];
    else if (!std::strcmp(argv[i], "--trace")) trace = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--cases BxL,...] [--variants \"v1;v2\"] [--heads Q/KV] [--dim D] [--trace] [--reps N]\n",
                   argv[0]);
      return 2;
    }
  }
  const auto gpu = tw::bench::current_gpu();
  const auto floor = tw::bench::measure_floor(gpu);
  std::printf("%s: floor %.3f TB/s; %d / %d heads, head dim %d\n", gpu.prop.name, floor.tbps(), hq, hkv, dim);
  tw::bench::ResultFile result("attention_trace", gpu, floor);
  // What any launch costs back to back (a graph of empty kernels): the few-token cases' baseline.
  const double empty_us = tw::bench::time_us_seq([](int, cudaStream_t st) { empty_kernel<<<132, 256, 0, st>>>(); }, 1);
  std::printf("an empty kernel back to back: %.2f us per launch\n", empty_us);
  result.doc["empty_kernel_us_back_to_back"] = empty_us;
  result.doc["heads"] = {hq, hkv};
  result.doc["head_dim"] = dim;
  size_t free_bytes = 0, total_bytes = 0;
  TW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  cudaEvent_t e0, e1;
  TW_CUDA_CHECK(cudaEventCreate(&e0));
  TW_CUDA_CHECK(cudaEventCreate(&e1));
  std::printf("%4s %6s %-22s %5s %5s %8s %6s | %s\n", "B", "L", "variant", "tiles", "slots", "us", "floor%",
              "trace (us from the first entry): entry max, setup med/max, first landed med/max, warp end min/med/max, "
              "intra-tile warp spread med, segs done max, exit med/max, merges");
  for (const std::string& cs : tw::bench::split_list(cases_arg, ',')) {
    const auto x = cs.find('x');
    const int B = std::stoi(cs.substr(0, x)), L = std::stoi(cs.substr(x + 1));
    const int64_t set_elems = int64_t(B) * L * hkv * dim;
    const int64_t set_bytes = 2 * set_elems * 2;
    const int sets = int(std::clamp<int64_t>((int64_t(512) << 20) / set_bytes + 1, 1, 256));
    if (int64_t(sets) * set_bytes + (int64_t(2) << 30) > int64_t(free_bytes)) continue;
    bf16 *kv = nullptr, *q = nullptr, *kv_new = nullptr, *out = nullptr;
    TW_CUDA_CHECK(cudaMalloc(&kv, size_t(sets) * 2 * set_elems * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&q, size_t(B) * hq * dim * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&kv_new, size_t(B) * hkv * dim * 2 * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&out, size_t(B) * hq * dim * sizeof(bf16)));
    tw::bench::fill_noise_bf16(kv, size_t(sets) * 2 * set_elems, 1);
    tw::bench::fill_noise_bf16(q, size_t(B) * hq * dim, 2);
    tw::bench::fill_noise_bf16(kv_new, size_t(B) * hkv * dim * 2, 3);
    TW_CUDA_CHECK(cudaDeviceSynchronize());
    auto tensors = [&](int s) {
      bf16* kc = kv + size_t(s) * 2 * set_elems;
      return tw::DecodeAttentionTensors{q, kv_new, kv_new + size_t(B) * hkv * dim, kc, kc + set_elems, out};
    };
    tw::DecodeAttentionShape shape;
    shape.batch = B;
    shape.num_q_heads = hq;
    shape.num_kv_heads = hkv;
    shape.head_dim = dim;
    shape.max_seq_len = L;
    const std::vector<int> lens(B, L);
    for (const std::string& vs : tw::bench::split_list(variants_arg, ';')) {
      std::unique_ptr<tw::DecodeAttention> op;
      try {
        op = std::make_unique<tw::DecodeAttention>(apply_variant(shape, vs), lens);
      } catch (const tw::InvalidArgument& e) {
        std::printf("%4d %6d %-22s skipped: %s\n", B, L, vs.c_str(), e.what());
        continue;
      }
      const double us = tw::bench::time_us([&](int s, cudaStream_t st) { op->run(tensors(s), st); }, sets, 10,
                                           set_bytes > (int64_t(4) << 30) ? 20 : reps);
      const double b2b_us = tw::bench::time_us_seq([&](int s, cudaStream_t st) { op->run(tensors(s), st); }, sets);
      const double floor_us = double(op->kv_bytes()) / (floor.tbps() * 1e6);
      nlohmann::json row = {{"B", B}, {"L", L}, {"variant", vs}, {"num_tiles", op->num_tiles()},
                            {"ring_slots", op->ring_slots()}, {"time_us", us}, {"floor_us", floor_us},
                            {"pct_floor", 100 * floor_us / us}, {"back_to_back_us", b2b_us},
                            {"few_tokens", op->few_tokens()}};
      std::printf("%4d %6d %-22s %5d %5s %8.2f %5.1f%% b2b %.2f", B, L, vs.c_str(), op->num_tiles(),
                  op->few_tokens() ? "few" : std::to_string(op->ring_slots()).c_str(), us, 100 * floor_us / us, b2b_us);
      if (trace) {
        const int n = op->num_tiles();
        unsigned long long* d_trace = nullptr;
        TW_CUDA_CHECK(cudaMalloc(&d_trace, size_t(n) * k::kDecodeTraceWords * 8));
        TW_CUDA_CHECK(cudaMemset(d_trace, 0, size_t(n) * k::kDecodeTraceWords * 8));
        // Two untraced launches on other sets, then the traced one on a set not read for a while.
        for (int i = 0; i < 2; ++i) op->run(tensors((i + 1) % sets), nullptr);
        op->set_trace(d_trace);
        TW_CUDA_CHECK(cudaEventRecord(e0));
        op->run(tensors(sets > 3 ? 3 : 0), nullptr);
        TW_CUDA_CHECK(cudaEventRecord(e1));
        TW_CUDA_CHECK(cudaEventSynchronize(e1));
        op->set_trace(nullptr);
        float ms = 0;
        TW_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        std::vector<unsigned long long> h(size_t(n) * k::kDecodeTraceWords);
        TW_CUDA_CHECK(cudaMemcpy(h.data(), d_trace, h.size() * 8, cudaMemcpyDeviceToHost));
        TW_CUDA_CHECK(cudaFree(d_trace));
        unsigned long long t0 = ~0ull;
        for (int c = 0; c < n; ++c) t0 = std::min(t0, h[size_t(c) * k::kDecodeTraceWords + k::kDtEntry]);
        auto at = [&](int c, int w) {
          const unsigned long long v = h[size_t(c) * k::kDecodeTraceWords + w];
          return v == 0 ? -1.0 : double(v - t0) * 1e-3;
        };
        std::vector<double> entry, setup, first, wend_tile, wspread, segs, exitv;
        nlohmann::json tiles = nlohmann::json::array();
        int merges = 0;
        for (int c = 0; c < n; ++c) {
          entry.push_back(at(c, k::kDtEntry));
          first.push_back(at(c, k::kDtFirst));
          setup.push_back(at(c, k::kDtSetup));
          double lo = 1e30, hi = -1;
          for (int w = 0; w < k::kDecodeWarps; ++w) {
            const double v = at(c, k::kDtWarpEnd + w);
            lo = std::min(lo, v), hi = std::max(hi, v);
          }
          wend_tile.push_back(hi);
          wspread.push_back(hi - lo);
          segs.push_back(at(c, k::kDtSegsDone));
          exitv.push_back(at(c, k::kDtExit));
          merges += int(h[size_t(c) * k::kDecodeTraceWords + k::kDtMerges]);
          nlohmann::json t = nlohmann::json::array();
          for (int w = 0; w < k::kDecodeTraceWords; ++w)
            t.push_back(w == k::kDtSm || w == k::kDtMerges || w == k::kDtSegments
                            ? double(h[size_t(c) * k::kDecodeTraceWords + w])
                            : at(c, w));
          tiles.push_back(t);
        }
        std::printf(" | launch %.1f: %.1f, %.1f/%.1f, %.1f/%.1f, %.1f/%.1f/%.1f, %.2f, %.1f, %.1f/%.1f, %d", ms * 1e3,
                    pct(entry, 1), pct(setup, 0.5), pct(setup, 1), pct(first, 0.5), pct(first, 1), pct(wend_tile, 0), pct(wend_tile, 0.5),
                    pct(wend_tile, 1), pct(wspread, 0.5), pct(segs, 1), pct(exitv, 0.5), pct(exitv, 1), merges);
        row["trace"] = {{"launch_us", ms * 1e3}, {"words", "sm entry first warp_end0..3 segs_done counted exit merges segments setup"},
                        {"tiles", tiles}};
      }
      std::printf("\n");
      std::fflush(stdout);
      result.add(row);
    }
    TW_CUDA_CHECK(cudaFree(kv));
    TW_CUDA_CHECK(cudaFree(q));
    TW_CUDA_CHECK(cudaFree(kv_new));
    TW_CUDA_CHECK(cudaFree(out));
  }
  std::printf("wrote %s\n", result.write(gpu).c_str());
  return 0;
}
