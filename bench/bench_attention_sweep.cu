// The attention half of issue 16's shape sweep: decode attention (one new token per sequence, RoPE and
// the KV append fused) on head layouts, head dims, batches and lengths generated from a seed, with the
// streaming-read floor measured in the same run. bench/attention_sweep_sdpa.py then times torch SDPA on
// the same shapes (the peer) and merges its numbers in.
//   bench_attention_sweep [--seed N] [--count N] [--cases 3,8,..] [--out DIR] [--tiles-sweep] [--few-ab]
// The grid: N shapes (default 40): (query, KV) heads from {(8,1), (12,2), (14,2), (16,8), (28,4),
// (32,8), (40,8), (64,8)}, head dim 64 / 128 / 256, B in {1 .. 64}, the longest length log-uniform in
// [1, 131072] (at most 4 GiB of K/V), equal or ragged lengths (each uniform in [1, longest]),
// contiguous or paged 16 / 32 / 64 (pages shuffled). A shape the op refuses (a head dim it has no
// kernel for) is recorded with the op's message: a miss. Times are back to back (launches in one CUDA
// graph, KV sets rotated so L2 holds none of a launch's input), as the bars read them.
// Writes attention_sweep.json: per case the shape, us, kv_bytes, floor_us, pct_floor, memory_bound
// (>= 64 MB of K/V); and a summary. --tiles-sweep also times each shape at the planner's candidates
// (decode_plan_candidates: `tiles_sweep`), the data its cost model is fitted to. --few-ab also times
// each shape the op runs on the few-token path with that path off (`stream_k_us`: the A/B in one run).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.cuh"
#include "tileweave/ops/attention.hpp"

namespace {

using bf16 = __nv_bfloat16;
using namespace tw::bench;

struct AttnCase {
  int hq, hkv, d, batch;
  std::vector<int> lens;
  bool ragged;
  tw::KvLayout layout;
  int page_size;
};

std::vector<AttnCase> attention_grid(uint64_t seed, int count) {
  static const int kHeads[][2] = {{8, 1}, {12, 2}, {14, 2}, {16, 8}, {28, 4}, {32, 8}, {40, 8}, {64, 8}};
  static const int kDims[] = {64, 128, 128, 256};
  static const int kBatch[] = {1, 2, 4, 8, 16, 32, 64};
  static const int kPages[] = {16, 32, 64};
  std::mt19937_64 rng(seed ^ 0xA77E);
  std::vector<AttnCase> out;
  for (int i = 0; i < count; ++i) {
    AttnCase c;
    const auto& h = kHeads[rng() % std::size(kHeads)];
    c.hq = h[0], c.hkv = h[1];
    c.d = kDims[rng() % std::size(kDims)];
    c.batch = kBatch[rng() % std::size(kBatch)];
    const double lg = std::uniform_real_distribution<double>(0.0, std::log2(131072.0))(rng);
    // At most 4 GiB of K and V: long contexts at large batches are cut down to fit the rotation.
    const int64_t cap = (int64_t(4) << 30) / (int64_t(c.batch) * c.hkv * c.d * 4);
    const int longest = int(std::clamp<int64_t>(int64_t(std::exp2(lg)), 1, std::min<int64_t>(cap, 131072)));
    c.ragged = rng() % 2 == 1;
    for (int b = 0; b < c.batch; ++b)
      c.lens.push_back(c.ragged && b > 0 ? 1 + int(rng() % uint64_t(longest)) : longest);
    c.layout = rng() % 2 ? tw::KvLayout::Paged : tw::KvLayout::Contiguous;
    c.page_size = c.layout == tw::KvLayout::Paged ? kPages[rng() % std::size(kPages)] : 0;
    out.push_back(c);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 16;
  int count = 40;
  std::string out_dir;
  bool tiles_sweep = false, few_ab = false;
  std::vector<int> only;  // --cases: the grid's case numbers (as printed, from 1) to run; all when empty
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--seed") && has) seed = std::stoull(argv[++i]);
    else if (!std::strcmp(argv[i], "--count") && has) count = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--out") && has) out_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--tiles-sweep")) tiles_sweep = true;
    else if (!std::strcmp(argv[i], "--few-ab")) few_ab = true;
    else if (!std::strcmp(argv[i], "--cases") && has) {
      try {
        only = parse_counts(argv[++i], "--cases");
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "bench_attention_sweep: %s\n", e.what());
        return 2;
      }
    } else {
      std::fprintf(stderr, "bench_attention_sweep: unknown or incomplete argument '%s'\n"
                           "usage: bench_attention_sweep [--seed N] [--count N] [--cases 3,8,..] [--out DIR] [--tiles-sweep] "
                           "[--few-ab]\n", argv[i]);
      return 2;
    }
  }
  if (count < 1) {
    std::fprintf(stderr, "bench_attention_sweep: --count %d must be >= 1\n", count);
    return 2;
  }
  if (!out_dir.empty()) setenv("TW_RESULTS_DIR", out_dir.c_str(), 1);
  const Gpu gpu = current_gpu();
  const Floor floor = measure_floor(gpu);
  std::printf("%s: floor %.3f TB/s; seed %llu, %d decode-attention shapes\n", gpu.prop.name, floor.tbps(),
              (unsigned long long)seed, count);
  ResultFile rf("attention_sweep", gpu, floor);
  rf.doc["seed"] = seed;
  rf.doc["method"] = "back to back: the launches of one CUDA graph (>= 8, KV sets in turn, >= 512 MB in rotation, so L2 "
                     "holds none of a launch's input), median graph time / launches; ours = DecodeAttention with default "
                     "options (RoPE and the new token's append fused); peer (bench/attention_sweep_sdpa.py) = torch SDPA "
                     "on contiguous caches of the same lengths, a mask for ragged ones";
  int n = 0, supported = 0, mem_cases = 0, mem_at_floor = 0;
  std::printf("%4s %9s %4s %4s %-10s %8s %7s %10s %8s %7s\n", "#", "heads", "d", "B", "layout", "longest", "ragged",
              "ours us", "KV MB", "%floor");
  for (const AttnCase& c : attention_grid(seed, count)) {
    ++n;
    if (!only.empty() && std::find(only.begin(), only.end(), n) == only.end()) continue;
    const int longest = *std::max_element(c.lens.begin(), c.lens.end());
    const char* layout = c.layout == tw::KvLayout::Paged ? "paged" : "contiguous";
    nlohmann::json j{{"op", "decode_attention"}, {"num_q_heads", c.hq}, {"num_kv_heads", c.hkv}, {"head_dim", c.d},
                     {"batch", c.batch}, {"lengths", c.lens}, {"longest", longest}, {"ragged", c.ragged},
                     {"layout", layout}, {"page_size", c.page_size}};
    tw::DecodeAttentionShape shape;
    shape.batch = c.batch;
    shape.num_q_heads = c.hq;
    shape.num_kv_heads = c.hkv;
    shape.head_dim = c.d;
    shape.layout = c.layout;
    std::vector<int> table;
    if (c.layout == tw::KvLayout::Contiguous) {
      shape.max_seq_len = longest;
    } else {
      shape.page_size = c.page_size;
      shape.pages_per_seq = (longest + c.page_size - 1) / c.page_size;
      shape.num_pages = c.batch * shape.pages_per_seq;
      table.resize(shape.num_pages);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), std::mt19937(7));
    }
    try {
      const tw::DecodeAttention op(shape, c.lens, table);
      const int64_t pool_elems = c.layout == tw::KvLayout::Contiguous
                                     ? int64_t(c.batch) * c.hkv * longest * c.d
                                     : int64_t(shape.num_pages) * c.hkv * c.page_size * c.d;
      const int64_t set_bytes = 2 * pool_elems * 2;
      const int sets = int(std::clamp<int64_t>((int64_t(512) << 20) / set_bytes + 1, 1, 64));
      size_t free_bytes = 0, total = 0;
      TW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
      if (int64_t(sets) * set_bytes + (int64_t(2) << 30) > int64_t(free_bytes))
        throw tw::InvalidArgument("the K/V sets do not fit the GPU's memory");
      bf16* kv = dev_alloc<bf16>(size_t(sets) * 2 * pool_elems);
      bf16* q = dev_alloc<bf16>(size_t(c.batch) * c.hq * c.d);
      bf16* kv_new = dev_alloc<bf16>(size_t(c.batch) * c.hkv * c.d * 2);
      bf16* out = dev_alloc<bf16>(size_t(c.batch) * c.hq * c.d);
      fill_noise_bf16(kv, size_t(sets) * 2 * pool_elems, 1);
      fill_noise_bf16(q, size_t(c.batch) * c.hq * c.d, 2);
      fill_noise_bf16(kv_new, size_t(c.batch) * c.hkv * c.d * 2, 3);
      TW_CUDA_CHECK(cudaDeviceSynchronize());
      auto run = [&](int s, cudaStream_t st) {
        bf16* k = kv + size_t(s) * 2 * pool_elems;
        op.run({q, kv_new, kv_new + size_t(c.batch) * c.hkv * c.d, k, k + pool_elems, out}, st);
      };
      const double us = time_us_seq(run, sets);
      const double floor_us = double(op.kv_bytes()) / (floor.tbps() * 1e6);
      const bool memory_bound = op.kv_bytes() >= (int64_t(64) << 20);
      j["us"] = us;
      j["kv_bytes"] = op.kv_bytes();
      j["floor_us"] = floor_us;
      j["pct_floor"] = 100 * floor_us / us;
      j["memory_bound"] = memory_bound;
      j["sets"] = sets;
      j["num_tiles"] = op.num_tiles();
      j["few_tokens"] = op.few_tokens();
      double stream_k_us = 0;
      if (few_ab && op.few_tokens()) {
        tw::DecodeAttentionShape v = shape;
        v.few_tokens = false;
        const tw::DecodeAttention alt(v, c.lens, table);
        stream_k_us = time_us_seq([&](int s, cudaStream_t st) {
          bf16* k = kv + size_t(s) * 2 * pool_elems;
          alt.run({q, kv_new, kv_new + size_t(c.batch) * c.hkv * c.d, k, k + pool_elems, out}, st);
        }, sets);
        j["stream_k_us"] = stream_k_us;
      }
      if (tiles_sweep) {
        nlohmann::json sweep = nlohmann::json::array();
        for (const auto& [t, per_sm] : tw::decode_plan_candidates(shape, c.lens, gpu.prop.multiProcessorCount)) {
          tw::DecodeAttentionShape v = shape;
          v.num_tiles = t;
          v.tiles_per_sm = per_sm;
          try {
            const tw::DecodeAttention alt(v, c.lens, table);
            auto run_alt = [&](int s, cudaStream_t st) {
              bf16* k = kv + size_t(s) * 2 * pool_elems;
              alt.run({q, kv_new, kv_new + size_t(c.batch) * c.hkv * c.d, k, k + pool_elems, out}, st);
            };
            sweep.push_back({{"num_tiles", alt.num_tiles()}, {"tiles_per_sm", v.tiles_per_sm}, {"us", time_us_seq(run_alt, sets)}});
          } catch (const tw::InvalidArgument& e) {
            sweep.push_back({{"num_tiles", t}, {"tiles_per_sm", v.tiles_per_sm}, {"refused", e.what()}});
          }
        }
        j["tiles_sweep"] = sweep;
      }
      ++supported;
      mem_cases += memory_bound;
      mem_at_floor += memory_bound && floor_us / us >= 0.9;
      std::printf("%4d %4d/%-4d %4d %4d %-10s %8d %7s %10.2f %8.1f %6.1f%%", n, c.hq, c.hkv, c.d, c.batch, layout, longest,
                  c.ragged ? "yes" : "no", us, op.kv_bytes() / 1e6, 100 * floor_us / us);
      if (op.few_tokens()) std::printf("  few-token path");
      if (stream_k_us > 0) std::printf(" (stream-K %.2f us)", stream_k_us);
      std::printf("\n");
      for (bf16* p : {kv, q, kv_new, out}) TW_CUDA_CHECK(cudaFree(p));
    } catch (const tw::InvalidArgument& e) {
      j["unsupported"] = e.what();
      std::printf("%4d %4d/%-4d %4d %4d %-10s %8d %7s  not run: %s\n", n, c.hq, c.hkv, c.d, c.batch, layout, longest,
                  c.ragged ? "yes" : "no", e.what());
    }
    std::fflush(stdout);
    rf.add(j);
  }
  rf.doc["summary"] = {{"cases", n}, {"supported", supported}, {"memory_bound_ge_64mb", mem_cases},
                       {"memory_bound_ge_64mb_at_90pct_floor", mem_at_floor}};
  std::printf("%d of %d shapes run; %d of %d memory-bound (>= 64 MB) at >= 90%% of the floor\n-> %s\n", supported, n,
              mem_at_floor, mem_cases, rf.write(gpu).c_str());
  return 0;
}
