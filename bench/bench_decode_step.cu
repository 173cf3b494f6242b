// The whole decode step in one launch (ops/decode_step.hpp) against the floor: the step's weights and
// K/V bytes at the streaming-read floor measured in the same run. Random weights and caches on the
// device; every sequence's cache holds kv_len - 1 tokens and the step appends the kv_len-th, with the
// sequences inactive (their lengths do not advance) so that every timed launch is the same step.
// Weights are GBs: L2 holds nothing of one launch for the next, no rotation needed.
// bench/decode_step_torch.py times torch.compile + CUDA graph on the same cases and merges its
// numbers into the JSON; scripts/hf_check.py the error against transformers.
//   bench_decode_step [--cases llama-3.2-1b:1:1024,...] [--layout paged] [--no-model] [--trace] [--max-split 0,2] [--attn-kib 0,64]
//                     [--hold-max-batch 4,16]   (DecodeStepOptions::hold_every_tile_max_batch, each value a run)
//                     [--oproj-merge 0,16]      (DecodeStepOptions::oproj_merge_max_batch, each value a run)
//                     [--ragged]   (--ragged: each sequence's cache holds a length drawn from [kv_len / 2, kv_len], fixed seed)
//                     [--config-json [NAME=]PATH ...]   (a transformers config.json or its folder, usable in --cases as
//                     NAME: the folder's name or the file's stem by default; bench/configs holds some no test names)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "harness.cuh"
#include "step_bench.cuh"
#include "tileweave/llm/config.hpp"
#include "tileweave/model/cache_model.hpp"
#include "tileweave/order/orders.hpp"
#include "tileweave/ops/decode_step.hpp"

namespace {

struct Case {
  std::string model;
  int batch = 1, kv_len = 1024;
};

std::vector<Case> parse_cases(const std::string& s) {
  std::vector<Case> out;
  for (const std::string& item : tw::bench::split_list(s)) {
    const auto parts = tw::bench::split_list(item, ':');
    if (parts.size() != 3) throw std::invalid_argument("--cases: '" + item + "' is not model:batch:kv_len");
    out.push_back({parts[0], tw::bench::parse_counts(parts[1], "batch")[0], tw::bench::parse_counts(parts[2], "kv_len")[0]});
  }
  return out;
}

// --config-json [NAME=]PATH, named as bench/decode_step_torch.py names it (so that --merge matches).
std::pair<std::string, tw::ModelConfig> load_config_arg(const std::string& arg) {
  const size_t eq = arg.find('=');
  const std::string path = eq == std::string::npos ? arg : arg.substr(eq + 1);
  std::string name = eq == std::string::npos ? "" : arg.substr(0, eq);
  if (name.empty()) {
    std::filesystem::path p = std::filesystem::path(path).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();  // a trailing slash
    name = (p.filename() == "config.json" ? std::filesystem::absolute(p).parent_path().filename()
            : p.extension() == ".json"    ? p.stem()
                                          : p.filename()).string();
  }
  return {name, tw::load_hf_config(path)};
}

}  // namespace

#ifdef TW_STAGE_TRACE
namespace tw::step { void dump_stage_trace_d128(const char*); void dump_stage_trace_d64(const char*); }
#endif

int main(int argc, char** argv) {
  std::string cases_arg = "llama-3.2-1b:1:1024,llama-3.2-1b:1:32768,llama-3.2-1b:16:4096,llama-3-8b:1:1024,"
                          "llama-3-8b:16:4096,qwen2-0.5b:1:1024,qwen2-7b:1:1024";
  tw::KvLayout layout = tw::KvLayout::Contiguous;
  bool model = true, trace = false, ragged = false;
  std::vector<int> split_variants{0}, attn_kib_variants{0}, warp_seg_variants{tw::DecodeStepOptions{}.attention_warp_segments};
  std::vector<double> last_wave_variants{tw::DecodeStepOptions{}.last_wave_cost};
  std::vector<int> hold_variants{tw::DecodeStepOptions{}.hold_every_tile_max_batch};
  std::vector<int> merge_variants{tw::DecodeStepOptions{}.oproj_merge_max_batch};
  std::map<std::string, tw::ModelConfig> configs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cases") && i + 1 < argc) cases_arg = argv[++i];
    else if (!std::strcmp(argv[i], "--config-json") && i + 1 < argc) configs.insert(load_config_arg(argv[++i]));
    else if (!std::strcmp(argv[i], "--layout") && i + 1 < argc) layout = std::string(argv[++i]) == "paged" ? tw::KvLayout::Paged : tw::KvLayout::Contiguous;
    else if (!std::strcmp(argv[i], "--no-model")) model = false;
    else if (!std::strcmp(argv[i], "--trace")) trace = true;
    else if (!std::strcmp(argv[i], "--ragged")) ragged = true;
    else if (!std::strcmp(argv[i], "--max-split") && i + 1 < argc) {
      split_variants.clear();
      for (const auto& v : tw::bench::split_list(argv[++i])) split_variants.push_back(std::stoi(v));
    } else if (!std::strcmp(argv[i], "--warp-segments") && i + 1 < argc) {
      warp_seg_variants.clear();
      for (const auto& v : tw::bench::split_list(argv[++i])) warp_seg_variants.push_back(std::stoi(v));
    } else if (!std::strcmp(argv[i], "--last-wave") && i + 1 < argc) {
      last_wave_variants.clear();
      for (const auto& v : tw::bench::split_list(argv[++i])) last_wave_variants.push_back(std::stod(v));
    } else if (!std::strcmp(argv[i], "--hold-max-batch") && i + 1 < argc) {
      hold_variants.clear();
      for (const auto& v : tw::bench::split_list(argv[++i])) hold_variants.push_back(std::stoi(v));
    } else if (!std::strcmp(argv[i], "--oproj-merge") && i + 1 < argc) {
      merge_variants.clear();
      for (const auto& v : tw::bench::split_list(argv[++i])) merge_variants.push_back(std::stoi(v));
    } else if (!std::strcmp(argv[i], "--attn-kib") && i + 1 < argc) {
      attn_kib_variants.clear();
      for (const auto& v : tw::bench::split_list(argv[++i])) attn_kib_variants.push_back(std::stoi(v));
    }
    else {
      std::fprintf(stderr, "usage: bench_decode_step [--cases model:batch:kv,...] [--layout contiguous|paged] [--no-model] [--trace] [--max-split N,...] [--attn-kib N,...] [--warp-segments N,...] [--last-wave COST,...] [--hold-max-batch B,...] [--oproj-merge B,...] [--ragged] [--config-json [NAME=]PATH ...]\n");
      return 2;
    }
  }
  const std::vector<Case> cases = parse_cases(cases_arg);
  const auto gpu = tw::bench::current_gpu();
  const auto floor = tw::bench::measure_floor(gpu);
  std::printf("%s: floor %.3f TB/s (bulk %.3f, vec %.3f)\n", gpu.prop.name, floor.tbps(), floor.bulk_tbps, floor.vec_tbps);
  tw::bench::ResultFile res("decode_step", gpu, floor);
  res.doc["layout"] = layout == tw::KvLayout::Paged ? "paged16" : "contiguous";
  res.doc["ragged"] = ragged;
  std::vector<std::string> rows;
  for (const Case& c : cases)
  for (int max_split : split_variants)
  for (int attn_kib : attn_kib_variants)
  for (int warp_seg : warp_seg_variants)
  for (double last_wave : last_wave_variants)
  for (int hold : hold_variants)
  for (int merge : merge_variants) {
    const auto named = configs.find(c.model);
    const tw::ModelConfig cfg = named != configs.end() ? named->second : tw::named_config(c.model);
    tw::DecodeStepOptions opt;
    opt.batch = c.batch;
    opt.max_seq_len = c.kv_len;
    opt.layout = layout;
    opt.trace = trace;
    opt.max_split = max_split;
    opt.attention_warp_segments = warp_seg;
    opt.last_wave_cost = last_wave;
    opt.hold_every_tile_max_batch = hold;
    opt.oproj_merge_max_batch = merge;
    opt.attention_min_tile_bytes = int64_t(attn_kib) << 10;
    tw::DecodeStep st(cfg, opt);
    tw::bench::prepare_timed_step(st, c.kv_len, 0x5EED + c.batch, 0xCAC4E);
    std::vector<int> attended(c.batch, c.kv_len);  // tokens each sequence attends to after the append
    if (ragged) {
      std::mt19937 rng(0x5EED + c.batch);
      std::vector<int> cached(c.batch);
      for (int b = 0; b < c.batch; ++b) {
        attended[b] = c.kv_len / 2 + int(rng() % uint32_t(c.kv_len - c.kv_len / 2 + 1));
        attended[b] = std::max(attended[b], 1);
        cached[b] = attended[b] - 1;
      }
      st.set_lengths(cached);
    }
    const int64_t wbytes = cfg.decode_weight_bytes(), kvbytes = cfg.kv_bytes(attended);
    const double floor_us = double(wbytes + kvbytes) / (floor.tbps() * 1e6);
    auto launch = [&](int, cudaStream_t s) { st.step(s); };
    const double replay = tw::bench::time_us(launch, 1, 3, 20);
    const double b2b = tw::bench::time_us_seq(launch, 1, 2, 10, 8);
    if (trace) st.step();  // the traced launch: one step after the timed ones
#ifdef TW_STAGE_TRACE
    if (trace) {
      cudaDeviceSynchronize();
      const char* dir = std::getenv("TW_RESULTS_DIR");
      const std::string path = std::string(dir ? dir : ".") + "/stage_" + c.model + "_" + std::to_string(c.batch) + "_" + std::to_string(c.kv_len) + ".bin";
      if (cfg.head_dim == 128) tw::step::dump_stage_trace_d128(path.c_str()); else tw::step::dump_stage_trace_d64(path.c_str());
    }
#endif
    if (st.plan().error()) throw std::runtime_error("a bounded wait expired");
    nlohmann::json j{{"model", c.model}, {"batch", c.batch}, {"kv_len", c.kv_len}, {"step_us", b2b},
                     {"lengths", attended},
                     {"step_replay_us", replay}, {"floor_us", floor_us}, {"pct_floor", 100.0 * floor_us / b2b},
                     {"weight_bytes", wbytes}, {"kv_bytes", kvbytes}, {"tiles", st.graph().graph.num_tiles()},
                     {"attention_tiles", st.tiling().attention_tiles}, {"act_rows", st.act_rows()},
                     {"max_split", max_split},
                     {"attention_min_tile_kib", attn_kib}, {"attention_warp_segments", warp_seg},
                     {"last_wave_cost", last_wave}, {"gate_up_whole", st.tiling().gate_up_whole},
                     {"hold_every_tile_max_batch", hold}, {"oproj_merge_max_batch", merge},
                     {"oproj_merges", st.oproj_merges()},
                     {"splits", {{"qkv", st.tiling().qkv.split_k}, {"o_proj", st.tiling().o_proj.split_k},
                                 {"gate_up", st.tiling().gate_up.split_k}, {"down", st.tiling().down.split_k},
                                 {"lm_head", st.tiling().lm_head.split_k}}}};
    if (model) {
      // The traffic model on the step's graph at this case's lengths: the DRAM bytes it predicts.
      tw::DecodeStepShape shape = st.shape();
      std::vector<int> table;
      if (layout == tw::KvLayout::Paged)
        for (int i = 0; i < c.batch * shape.pages_per_seq(); ++i) table.push_back(i);
      const tw::StepGraph g = tw::build_step_graph(cfg, shape, st.lengths(), table, st.tiling());
      tw::CacheConfig cc;
      cc.capacity_bytes = gpu.prop.l2CacheSize;
      cc.in_flight = gpu.prop.multiProcessorCount;
      const tw::TrafficReport sim = tw::simulate(g.graph, tw::make_order(g.graph, "kslices/col_major"), cc);
      j["model_read_bytes"] = sim.dram_read;
      j["model_write_bytes"] = sim.dram_write;
    }
    if (trace) j["timeline"] = tw::bench::op_timeline(st);
    res.add(j);
    char row[256];
    std::snprintf(row, sizeof row,
                  "%-13s B=%-3d KV=%-6d split<=%-2d attn=%-3dK wseg=%-2d hold<=%-3d om=%d gu=%lldx%-2lld %8.1f us b2b %8.1f replay floor %7.1f %5.1f%%",
                  c.model.c_str(), c.batch, c.kv_len, max_split, attn_kib, warp_seg, hold, int(st.oproj_merges()),
                  (long long)st.tiling().gate_up_whole, (long long)st.tiling().gate_up.split_k, b2b, replay, floor_us,
                  100.0 * floor_us / b2b);
    rows.push_back(row);
    std::printf("%s\n", row);
    std::fflush(stdout);
  }
  std::printf("-> %s\n", res.write(gpu).c_str());
  for (const auto& r : rows) std::printf("%s\n", r.c_str());
  return 0;
}
