// A tensor-parallel decode step (DecodeStep with tp; issue 21) against each rank's floor: the rank's
// weights and K/V bytes at the streaming-read floor measured in the same run. Random weights and
// caches; every sequence's cache holds kv_len - 1 tokens and the step appends the kv_len-th, the
// sequences inactive so that every timed step is the same step. Steps are timed back to back on the
// stream (events around `--steps` steps; a step is 2L + 2 launches with a collective between each two).
//
//   scripts/tp_launch.sh 2 build-gpu/bench/bench_decode_step_tp --model llama-3-70b
//       one process per GPU, collectives over NCCL; also times the NCCL all-reduce of one message alone.
//       Rank 0 writes bench/results/<gpu>x<N>/decode_step_tp.json.
//   build-gpu/bench/bench_decode_step_tp --model llama-3-70b --tp 2
//       alone (no launcher): rank 0's step on this GPU with its collectives left out -- what one rank's
//       launches cost without communication. Writes bench/results/<gpu>/decode_step_tp_one_rank_*.json.
//
//   [--cases batch:kv,...] (default 1:1024,1:4096,16:1024,16:4096) [--steps N] [--layout paged]
//   [--whole]: also the rank's shard as a model of its own in one launch (no collectives, no launch
//              boundaries): what the boundaries between the rank's launches cost
//   [--trace]: per-op timelines of one more step (rank 0)
//   [--in-launch]: the collectives as tiles of one launch (NCCL's symmetric memory under the launcher;
//              alone, DecodeStep::set_exchange_alone: its all-reduce tiles wait for nobody and sum its
//              own part: the launch without the link's latency)
//   [--side-by-side]: also every rank on this GPU at once (TensorParallelLocal: with --in-launch the
//              ranks' launches side by side on the SMs split between them), against the whole model
//              in one launch: what the split and the all-reduce tiles cost at equal bandwidth
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harness.cuh"
#include "step_bench.cuh"
#include "tileweave/ops/decode_step.hpp"
#ifdef TW_HAVE_NCCL
#include "tileweave/ops/decode_step_nccl.hpp"
#endif

namespace {

struct Case {
  int batch = 1, kv_len = 1024;
};

double elapsed_us(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  TW_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return 1e3 * ms;
}

int run(int argc, char** argv) {
  std::string model = "llama-3-70b", cases_arg = "1:1024,1:4096,16:1024,16:4096";
  int tp = 2, steps = 10;
  bool whole = false, trace = false, in_launch = false, side_by_side = false;
  tw::KvLayout layout = tw::KvLayout::Contiguous;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
    else if (!std::strcmp(argv[i], "--tp") && i + 1 < argc) tp = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--cases") && i + 1 < argc) cases_arg = argv[++i];
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--whole")) whole = true;
    else if (!std::strcmp(argv[i], "--trace")) trace = true;
    else if (!std::strcmp(argv[i], "--in-launch")) in_launch = true;
    else if (!std::strcmp(argv[i], "--side-by-side")) side_by_side = true;
    else if (!std::strcmp(argv[i], "--layout") && i + 1 < argc) layout = std::string(argv[++i]) == "paged" ? tw::KvLayout::Paged : tw::KvLayout::Contiguous;
    else {
      std::fprintf(stderr, "usage: bench_decode_step_tp [--model NAME] [--tp N] [--cases batch:kv,...] [--steps N] [--layout contiguous|paged] [--whole] [--trace] [--in-launch] [--side-by-side]\n");
      return 2;
    }
  }
  if (steps < 1) throw tw::InvalidArgument("--steps " + std::to_string(steps) + " must be >= 1");
  std::vector<Case> cases;
  for (const std::string& item : tw::bench::split_list(cases_arg)) {
    const auto parts = tw::bench::split_list(item, ':');
    if (parts.size() != 2) throw tw::InvalidArgument("--cases: '" + item + "' is not batch:kv_len");
    cases.push_back({tw::bench::parse_counts(parts[0], "batch")[0], tw::bench::parse_counts(parts[1], "kv_len")[0]});
  }

  // One rank per process under the launcher (NCCL), else rank 0 alone with no collectives.
  const bool launched = std::getenv("TW_WORLD_SIZE") != nullptr;
  int rank = 0;
#ifdef TW_HAVE_NCCL
  std::unique_ptr<tw::NcclRank> comm;
  if (launched) {
    comm = std::make_unique<tw::NcclRank>(tw::NcclRank::from_env());
    tp = comm->size();
    rank = comm->rank();
  }
#else
  if (launched) throw tw::InvalidArgument("this build has no NCCL: it runs one rank alone (start it without the launcher)");
#endif
  const tw::ModelConfig cfg = tw::named_config(model), shard = tw::tensor_parallel_shard(cfg, tp);
  auto gpu = tw::bench::current_gpu();
  const auto floor = tw::bench::measure_floor(gpu);
  if (rank == 0)
    std::printf("%s: floor %.3f TB/s (bulk %.3f, vec %.3f); %s, tp %d, %s\n", gpu.prop.name, floor.tbps(), floor.bulk_tbps,
                floor.vec_tbps, model.c_str(), tp, launched ? "one rank per GPU over NCCL" : "rank 0 alone, no collectives");
  if (launched) gpu.slug += "x" + std::to_string(tp);
  // One file per way of running: under the launcher the issue's decode_step_tp.json (its collectives in
  // the launch or between, as `mode` says); alone, one per placement of the collectives.
  tw::bench::ResultFile res(launched ? "decode_step_tp"
                                     : in_launch ? "decode_step_tp_one_rank_in_launch" : "decode_step_tp_one_rank_between_launches",
                            gpu, floor);
  res.doc["mode"] = std::string(launched ? "nccl" : in_launch ? "one_rank_own_region" : "one_rank_no_collectives") +
                    (in_launch ? "_in_launch" : "_between_launches");
  res.doc["layout"] = layout == tw::KvLayout::Paged ? "paged16" : "contiguous";
  cudaStream_t stream;
  TW_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  TW_CUDA_CHECK(cudaEventCreate(&e0));
  TW_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<std::string> rows;
  // Step time of a DecodeStep of `model_cfg` (rank `r` of `ranks`), back to back; traced: one step more.
  auto time_steps = [&](const tw::ModelConfig& model_cfg, int ranks, int r, const Case& c, bool with_trace,
                        nlohmann::json* timeline, int* launches) {
    tw::DecodeStepOptions opt;
    opt.batch = c.batch;
    opt.max_seq_len = c.kv_len;
    opt.layout = layout;
    opt.tp = ranks;
    opt.rank = r;
    opt.trace = with_trace;
    opt.collectives_in_launch = in_launch && ranks > 1;
    tw::DecodeStep st(model_cfg, opt);
#ifdef TW_HAVE_NCCL_DEVICE
    std::unique_ptr<tw::NcclExchange> exchange;
    if (opt.collectives_in_launch && launched) exchange = std::make_unique<tw::NcclExchange>(st, *comm);
#else
    if (opt.collectives_in_launch && launched) throw tw::InvalidArgument("--in-launch: this build's NCCL has no device API (2.28+)");
#endif
    if (opt.collectives_in_launch && !launched) st.set_exchange_alone();
    tw::bench::prepare_timed_step(st, c.kv_len, 0x5EED + c.batch + 7919 * r, 0xCAC4E + r);
    auto one_step = [&] {
#ifdef TW_HAVE_NCCL
      if (comm && ranks > 1) return tw::step_over_nccl(st, *comm, stream);
#endif
      for (int i = 0; i < st.segments(); ++i) st.run_segment(i, stream);
    };
    for (int i = 0; i < 2; ++i) one_step();  // warm-up
    TW_CUDA_CHECK(cudaEventRecord(e0, stream));
    for (int i = 0; i < steps; ++i) one_step();
    TW_CUDA_CHECK(cudaEventRecord(e1, stream));
    TW_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (st.plan().error()) throw std::runtime_error("a bounded wait expired");
    if (with_trace) {
      one_step();
      *timeline = tw::bench::op_timeline(st);
    }
    *launches = st.segments();
    return elapsed_us(e0, e1) / steps;
  };
  for (const Case& c : cases) {
    nlohmann::json timeline;
    int launches = 0, unused = 0;
    const double step_us = time_steps(cfg, tp, rank, c, trace && rank == 0, &timeline, &launches);
    // The shard as a model of its own: the same tiles in one launch.
    const double whole_us = whole ? time_steps(shard, 1, 0, c, false, nullptr, &unused) : -1;
    // Every rank on this GPU, and the whole model in one launch.
    double side_us = -1, model_us = -1;
    if (side_by_side && !launched) {
      tw::DecodeStepOptions opt;
      opt.batch = c.batch;
      opt.max_seq_len = c.kv_len;
      opt.layout = layout;
      opt.collectives_in_launch = in_launch;
      tw::TensorParallelLocal ranks(cfg, tp, opt);
      for (int r = 0; r < tp; ++r) tw::bench::prepare_timed_step(ranks.rank(r), c.kv_len, 0x5EED + r, 0xCAC4E + r);
      for (int i = 0; i < 2; ++i) ranks.step(stream);
      TW_CUDA_CHECK(cudaEventRecord(e0, stream));
      for (int i = 0; i < steps; ++i) ranks.step(stream);
      TW_CUDA_CHECK(cudaEventRecord(e1, stream));
      TW_CUDA_CHECK(cudaStreamSynchronize(stream));
      side_us = elapsed_us(e0, e1) / steps;
      for (int r = 0; r < tp; ++r)
        if (ranks.rank(r).plan().error()) throw std::runtime_error("a bounded wait expired (side by side)");
      model_us = time_steps(cfg, 1, 0, c, false, nullptr, &unused);
    }
    // The NCCL all-reduce of one message of the step (the fp32 stream [B, d]) alone: the median of 50.
    double allreduce_us = -1;
#ifdef TW_HAVE_NCCL
    if (comm) {
      const size_t n = size_t(c.batch) * cfg.hidden_size;
      float* msg = nullptr;
      TW_CUDA_CHECK(cudaMalloc(&msg, n * sizeof(float)));
      TW_CUDA_CHECK(cudaMemset(msg, 0, n * sizeof(float)));
      std::vector<double> t;
      for (int i = 0; i < 60; ++i) {
        TW_CUDA_CHECK(cudaEventRecord(e0, stream));
        if (ncclAllReduce(msg, msg, n, ncclFloat32, ncclSum, comm->comm(), stream) != ncclSuccess)
          throw std::runtime_error("ncclAllReduce failed");
        TW_CUDA_CHECK(cudaEventRecord(e1, stream));
        TW_CUDA_CHECK(cudaStreamSynchronize(stream));
        if (i >= 10) t.push_back(elapsed_us(e0, e1));
      }
      TW_CUDA_CHECK(cudaFree(msg));
      std::sort(t.begin(), t.end());
      allreduce_us = t[t.size() / 2];
    }
#endif
    const int64_t wbytes = shard.decode_weight_bytes(), kvbytes = shard.kv_bytes(std::vector<int>(c.batch, c.kv_len));
    const double floor_us = double(wbytes + kvbytes) / (floor.tbps() * 1e6);
    const tw::StepCollectives k = tw::step_collectives(cfg, tp, c.batch);
    nlohmann::json j{{"model", model}, {"tp", tp}, {"batch", c.batch}, {"kv_len", c.kv_len}, {"step_us", step_us},
                     {"floor_us", floor_us}, {"pct_floor", 100.0 * floor_us / step_us}, {"rank_weight_bytes", wbytes},
                     {"rank_kv_bytes", kvbytes}, {"launches_per_step", launches},
                     {"collectives_per_step", k.all_reduces + k.max_reduces}, {"link_bytes", k.link_bytes},
                     {"torch_tp_us", nullptr}};
    if (allreduce_us >= 0) j["allreduce_us"] = allreduce_us;
    else j["allreduce_us"] = nullptr;
    if (whole) j["shard_one_launch_us"] = whole_us;
    if (side_us >= 0) j["ranks_side_by_side_us"] = side_us, j["model_one_launch_us"] = model_us;
    if (trace && rank == 0) j["timeline"] = timeline;
    res.add(j);
    char row[256];
    std::snprintf(row, sizeof row, "%-12s tp=%d B=%-3d KV=%-6d %9.1f us  floor %8.1f  %5.1f%%  %d launches  all-reduce %s us  one launch %s us",
                  model.c_str(), tp, c.batch, c.kv_len, step_us, floor_us, 100.0 * floor_us / step_us, launches,
                  allreduce_us >= 0 ? std::to_string(allreduce_us).c_str() : "-", whole ? std::to_string(whole_us).c_str() : "-");
    rows.push_back(row);
    if (side_us >= 0) {
      std::snprintf(row, sizeof row, "    every rank on this GPU: %.1f us; the whole model in one launch: %.1f us", side_us, model_us);
      rows.push_back(row);
      if (rank == 0) std::printf("%s\n", row);
    }
    if (rank == 0) std::printf("%s\n", row), std::fflush(stdout);
  }
  if (rank == 0) {
    std::printf("-> %s\n", res.write(gpu).c_str());
    for (const auto& r : rows) std::printf("%s\n", r.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode_step_tp: %s\n", e.what());
    return 1;
  }
}
