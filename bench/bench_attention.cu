// Decode attention benchmark: Llama-3-8B attention (32 query heads, 8 KV heads, d = 128), one new
// token per sequence with the fused RoPE + append, B in {1, 16, 64} x L in {512 .. 131072}, plus a
// few paged cases. KV sets are rotated (>= 512 MB in rotation) so L2 holds none of what a replay
// reads: cold, as the SDPA / FlashInfer baselines. The floor is measured in the same run.
// bench/attention_sdpa.py times torch SDPA on the same shapes and merges its numbers into the JSON.
//   bench_attention [--quick]
#include <cuda_bf16.h>

#include <algorithm>
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

__global__ void empty_kernel() {}

void noise(bf16* p, size_t n, uint64_t seed) { tw::bench::fill_noise_bf16(p, n, seed); }

struct Case {
  int batch;
  int len;
  tw::KvLayout layout = tw::KvLayout::Contiguous;
  int page_size = 0;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const auto gpu = tw::bench::current_gpu();
  const auto floor = tw::bench::measure_floor(gpu);
  std::printf("%s: floor %.3f TB/s (bulk %.3f, 16-byte loads %.3f)\n", gpu.prop.name, floor.tbps(), floor.bulk_tbps,
              floor.vec_tbps);
  tw::bench::ResultFile result("bench_attention", gpu, floor);
  // The fixed cost of one graph-replayed launch (empty kernel, 256 blocks): the latency floor.
  auto empty = [](int, cudaStream_t st) { empty_kernel<<<256, 128, 0, st>>>(); };
  const double empty_us = tw::bench::time_us(empty, 1), empty_seq_us = tw::bench::time_us_seq(empty, 1);
  std::printf("empty kernel: %.2f us per graph replay, %.2f us back to back\n", empty_us, empty_seq_us);
  result.doc["empty_launch_us"] = empty_us;
  result.doc["empty_launch_seq_us"] = empty_seq_us;
  result.doc["method"] = "time_us: one launch per CUDA-graph replay, median of per-replay events; seq_us: the sets' "
                         "launches back to back in one graph (>= 8), graph time / launches; KV sets rotated (>= 512 MB)";
  constexpr int kHq = 32, kHkv = 8, kD = 128;
  result.doc["shape"] = {{"num_q_heads", kHq}, {"num_kv_heads", kHkv}, {"head_dim", kD}, {"dtype", "bf16"},
                         {"rope", true}, {"append", true}};

  std::vector<Case> cases;
  for (int b : {1, 16, 64})
    for (int l : {512, 4096, 32768, 131072}) cases.push_back({b, l});
  cases.push_back({16, 4096, tw::KvLayout::Paged, 16});
  cases.push_back({16, 4096, tw::KvLayout::Paged, 128});
  cases.push_back({1, 32768, tw::KvLayout::Paged, 16});
  cases.push_back({64, 32768, tw::KvLayout::Paged, 64});
  if (quick) cases = {{1, 4096}, {16, 32768}};

  size_t free_bytes = 0, total_bytes = 0;
  TW_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  std::printf("%6s %7s %-10s %6s %7s %10s %9s %8s %9s %8s %7s  %s\n", "B", "L", "layout", "sets", "tiles", "time_us",
              "TB/s", "floor%", "seq_us", "floor%", "slots", "variants (back to back, us)");
  for (const Case& c : cases) {
    const int64_t tokens = int64_t(c.batch) * c.len;
    const int64_t set_elems = tokens * kHkv * kD;  // per K (or V)
    const int64_t set_bytes = 2 * set_elems * int64_t(sizeof(bf16));
    const int sets = int(std::clamp<int64_t>((int64_t(512) << 20) / set_bytes + 1, 1, 256));
    if (int64_t(sets) * set_bytes + (int64_t(2) << 30) > int64_t(free_bytes)) {
      std::printf("%6d %7d skipped: %.1f GB of KV does not fit\n", c.batch, c.len, sets * set_bytes * 1e-9);
      continue;
    }
    tw::DecodeAttentionShape shape;
    shape.batch = c.batch;
    shape.num_q_heads = kHq;
    shape.num_kv_heads = kHkv;
    shape.head_dim = kD;
    shape.layout = c.layout;
    std::vector<int> table;
    if (c.layout == tw::KvLayout::Contiguous) {
      shape.max_seq_len = c.len;
    } else {
      // Each set is one pool; pages dealt in a random order, as a page allocator would leave them.
      shape.page_size = c.page_size;
      shape.pages_per_seq = (c.len + c.page_size - 1) / c.page_size;
      shape.num_pages = c.batch * shape.pages_per_seq;
      table.resize(shape.num_pages);
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), std::mt19937(7));
    }
    const int64_t pool_elems = c.layout == tw::KvLayout::Contiguous
                                   ? set_elems
                                   : int64_t(shape.num_pages) * kHkv * c.page_size * kD;
    bf16 *kv = nullptr, *q = nullptr, *kv_new = nullptr, *out = nullptr;
    TW_CUDA_CHECK(cudaMalloc(&kv, size_t(sets) * 2 * pool_elems * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&q, size_t(c.batch) * kHq * kD * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&kv_new, size_t(c.batch) * kHkv * kD * 2 * sizeof(bf16)));
    TW_CUDA_CHECK(cudaMalloc(&out, size_t(c.batch) * kHq * kD * sizeof(bf16)));
    noise(kv, size_t(sets) * 2 * pool_elems, 1);
    noise(q, size_t(c.batch) * kHq * kD, 2);
    noise(kv_new, size_t(c.batch) * kHkv * kD * 2, 3);
    TW_CUDA_CHECK(cudaDeviceSynchronize());

    auto tensors = [&](int s) {
      bf16* k = kv + size_t(s) * 2 * pool_elems;
      return tw::DecodeAttentionTensors{q, kv_new, kv_new + size_t(c.batch) * kHkv * kD, k, k + pool_elems, out};
    };
    const int reps = set_bytes > (int64_t(4) << 30) ? 30 : 100;
    auto time_with = [&](const tw::DecodeAttention& op) {
      return tw::bench::time_us([&](int s, cudaStream_t st) { op.run(tensors(s), st); }, sets, 10, reps);
    };
    tw::DecodeAttention op(shape, std::vector<int>(c.batch, c.len), table);
    const double us = time_with(op);
    const double seq_us = tw::bench::time_us_seq([&](int s, cudaStream_t st) { op.run(tensors(s), st); }, sets);
    // Diagnostic: the floor kernel reading exactly one set's K/V pool (one launch): what one pass
    // over this many bytes costs, ramp-up and tail included -- the bound for any kernel that reads
    // the cache once, which the asymptotic floor_us is not at small sizes.
    auto stream = [&](int s, cudaStream_t st) {
      tw::bench::stream_read(gpu, kv + size_t(s) * 2 * pool_elems, uint64_t(2 * pool_elems) * sizeof(bf16), st);
    };
    const double stream_us = gpu.prop.major >= 9 ? tw::bench::time_us(stream, sets, 10, reps) : 0.0;
    const double stream_seq_us = gpu.prop.major >= 9 ? tw::bench::time_us_seq(stream, sets) : 0.0;
    // Variants on the same data, both timings; a combination that does not fit in smem is left out.
    nlohmann::json variants = nlohmann::json::object(), variants_seq = nlohmann::json::object();
    auto variant = [&](const std::string& name, tw::DecodeAttentionShape v) {
      try {
        const tw::DecodeAttention op_v(v, std::vector<int>(c.batch, c.len), table);
        const bool same = op_v.few_tokens() == op.few_tokens() && op_v.bulk_copy() == op.bulk_copy() && op_v.num_tiles() == op.num_tiles() &&
                          op_v.ring_slots() == op.ring_slots() && op_v.warps_per_tile() == op.warps_per_tile() &&
                          op_v.shape().overlap_previous == op.shape().overlap_previous;
        variants[name] = same ? us : time_with(op_v);
        variants_seq[name] = same ? seq_us : tw::bench::time_us_seq([&](int s, cudaStream_t st) { op_v.run(tensors(s), st); }, sets);
      } catch (const tw::InvalidArgument&) {
      }
    };
    // The default with the other loader, and with the other tiles-per-SM choice (one: tiles cut at
    // pair boundaries; two: cut evenly over every slot).
    tw::DecodeAttentionShape bulk = shape;
    bulk.kv_load = op.bulk_copy() ? tw::KvLoad::CpAsync : tw::KvLoad::Bulk;
    if (gpu.prop.major >= 9 && !quick) variant(op.bulk_copy() ? "cp_async" : "bulk", bulk);
    // Each launch started on the SMs the one before leaves (changes only the back-to-back time).
    tw::DecodeAttentionShape overlapped = shape;
    overlapped.overlap_previous = true;
    if (gpu.prop.major >= 9 && !quick) variant("overlap", overlapped);
    for (int per_sm : {1, 2}) {
      tw::DecodeAttentionShape v = shape;
      v.tiles_per_sm = per_sm;
      if (!quick) variant("tiles" + std::to_string(per_sm), v);
    }
    // One tile on every SM, cut evenly (the one-per-SM plan cuts at pair boundaries: 128 of 132
    // SMs at B = 1 with 8 KV heads).
    if (!quick && c.batch == 1 && c.layout == tw::KvLayout::Contiguous) {
      tw::DecodeAttentionShape v = shape;
      v.num_tiles = gpu.prop.multiProcessorCount;
      v.tiles_per_sm = 1;
      variant("tiles_all_sms", v);
    }
    // Lengths (and the page table) on the device, as the Python op runs: the plan for full caches
    // (these are full), cut again by a one-block kernel before each launch.
    {
      int* meta = nullptr;
      TW_CUDA_CHECK(cudaMalloc(&meta, (size_t(c.batch) + table.size()) * sizeof(int)));
      const std::vector<int> lens(c.batch, c.len);
      TW_CUDA_CHECK(cudaMemcpy(meta, lens.data(), lens.size() * sizeof(int), cudaMemcpyHostToDevice));
      if (!table.empty())
        TW_CUDA_CHECK(cudaMemcpy(meta + c.batch, table.data(), table.size() * sizeof(int), cudaMemcpyHostToDevice));
      const tw::DecodeAttention op_d(shape);
      auto run_d = [&](int s, cudaStream_t st) {
        tw::DecodeAttentionTensors t = tensors(s);
        t.seq_lens = meta;
        t.page_table = table.empty() ? nullptr : meta + c.batch;
        op_d.run(t, st);
      };
      variants["device_lengths"] = tw::bench::time_us(run_d, sets, 10, reps);
      variants_seq["device_lengths"] = tw::bench::time_us_seq(run_d, sets);
      TW_CUDA_CHECK(cudaFree(meta));
    }
    // The number of tiles on the latency-bound case (default ring depth).
    nlohmann::json sweep = nlohmann::json::array();
    const bool sweep_case = c.layout == tw::KvLayout::Contiguous && !quick && c.batch == 1 && c.len == 4096;
    for (int tiles : {64, 128, 256, 264}) {
      if (!sweep_case) break;
      tw::DecodeAttentionShape fixed = shape;
      fixed.num_tiles = tiles;
      fixed.tiles_per_sm = tiles > gpu.prop.multiProcessorCount ? 2 : 1;
      try {
        tw::DecodeAttention op_fixed(fixed, std::vector<int>(c.batch, c.len), table);
        const double t = time_with(op_fixed);
        sweep.push_back({{"num_tiles", tiles}, {"ring_slots", op_fixed.ring_slots()}, {"time_us", t}});
        std::printf("          sweep num_tiles %4d (slots %d): %8.2f us\n", tiles, op_fixed.ring_slots(), t);
      } catch (const tw::InvalidArgument&) {
      }
    }
    const double tbps = double(op.kv_bytes()) / us * 1e-6;
    const double pct = 100.0 * tbps / floor.tbps();
    const char* layout = c.layout == tw::KvLayout::Contiguous ? "contiguous" : "paged";
    const double floor_us = double(op.kv_bytes()) / (floor.tbps() * 1e6);
    std::printf("%6d %7d %-10s %6d %7d %10.2f %9.3f %7.1f%% %9.2f %7.1f%% %7d  %s  stream %.2f (b2b %.2f)\n", c.batch,
                c.len, layout, sets, op.num_tiles(), us, tbps, pct, seq_us, 100 * floor_us / seq_us, op.ring_slots(),
                variants_seq.dump().c_str(), stream_us, stream_seq_us);
    std::fflush(stdout);
    result.add({{"B", c.batch},
                {"L", c.len},
                {"layout", layout},
                {"page_size", c.page_size},
                {"sets", sets},
                {"kv_bytes", op.kv_bytes()},
                {"num_tiles", op.num_tiles()},
                {"ring_slots", op.ring_slots()},
                {"warps_per_tile", op.warps_per_tile()},
                {"smem_bytes", op.smem_bytes()},
                {"kv_load", op.bulk_copy() ? "bulk" : "cp.async"},
                {"time_us", us},
                {"variants_us", variants},
                {"variants_seq_us", variants_seq},
                {"tbps", tbps},
                {"floor_us", floor_us},
                {"pct_floor", pct},
                {"seq_us", seq_us},
                {"seq_pct_floor", 100 * floor_us / seq_us},
                {"stream_us", stream_us},
                {"stream_seq_us", stream_seq_us},
                {"tiles_sweep", sweep}});
    TW_CUDA_CHECK(cudaFree(kv));
    TW_CUDA_CHECK(cudaFree(q));
    TW_CUDA_CHECK(cudaFree(kv_new));
    TW_CUDA_CHECK(cudaFree(out));
  }
  std::printf("wrote %s\n", result.write(gpu).c_str());
  return 0;
}
