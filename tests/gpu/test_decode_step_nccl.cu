// The tensor-parallel step over NCCL, one process per GPU: run under the launcher,
//   scripts/tp_launch.sh N build-gpu/tests/tileweave_gpu_tests --gtest_filter='DecodeStepNccl.*'
// Every rank makes the same random weights (one seed, broadcast from rank 0), and every step's inputs
// come from rank 0 (broadcast): the whole model's greedy tokens, which rank 0 computes on its GPU
// with the one-GPU step. Each rank checks its block of the logits against the whole model's and the
// sampled tokens against the whole model's (near ties excepted), over 64 steps, with the collectives
// between launches and in the launch. Skipped (with a message) when not started by the launcher.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gpu_util.cuh"
#include "tileweave/ops/decode_step.hpp"
#ifdef TW_HAVE_NCCL
#include "tileweave/ops/decode_step_nccl.hpp"
#endif

namespace tw {
namespace {

#ifdef TW_HAVE_NCCL

template <class T>
void broadcast(const NcclRank& comm, T* host, size_t n, ncclDataType_t type) {
  T* dev = nullptr;
  TW_CUDA_CHECK(cudaMalloc(&dev, n * sizeof(T)));
  TW_CUDA_CHECK(cudaMemcpy(dev, host, n * sizeof(T), cudaMemcpyHostToDevice));
  ASSERT_EQ(ncclBroadcast(dev, dev, n, type, 0, comm.comm(), nullptr), ncclSuccess);
  TW_CUDA_CHECK(cudaMemcpy(host, dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  TW_CUDA_CHECK(cudaFree(dev));
}
#endif

TEST(DecodeStepNccl, TokensMatchWholeModel) {
#ifndef TW_HAVE_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  if (!std::getenv("TW_WORLD_SIZE"))
    GTEST_SKIP() << "not started by scripts/tp_launch.sh N: the NCCL test needs one process per GPU";
  const NcclRank comm = NcclRank::from_env();
  const int tp = comm.size(), rank = comm.rank();
  ModelConfig cfg = named_config("tiny-llama");
  cfg.num_kv_heads = 4;  // divisible by 2 and 4 ranks
  uint64_t seed = test::fresh_seed();
  broadcast(comm, &seed, 1, ncclUint64);
  const HostWeights w = random_weights(cfg, seed, 0.08f);
  const int B = 3, steps = 64, V = int(cfg.vocab_size), Vs = V / tp;
  for (bool in_launch : {false, true}) {
    if (in_launch && tp == 1) continue;
#ifndef TW_HAVE_NCCL_DEVICE
    if (in_launch) continue;
#endif
    SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(rank) + (in_launch ? " in launch" : "") +
                 ", seed " + std::to_string(seed));
    DecodeStepOptions opt;
    opt.batch = B;
    opt.max_seq_len = steps + 8;
    opt.keep_logits = true;
    opt.spin_limit = 1u << 24;
    std::unique_ptr<DecodeStep> whole;  // rank 0 only
    if (rank == 0) {
      whole = std::make_unique<DecodeStep>(cfg, opt);
      whole->load_weights(w);
    }
    opt.tp = tp;
    opt.rank = rank;
    opt.collectives_in_launch = in_launch;
    DecodeStep st(cfg, opt);
    st.load_weights(w);
#ifdef TW_HAVE_NCCL_DEVICE
    std::unique_ptr<NcclExchange> exchange;
    if (in_launch) exchange = std::make_unique<NcclExchange>(st, comm);
#endif
    std::vector<int32_t> in = {11, 200, 3};
    int differ = 0;
    double worst = 0;
    for (int s = 0; s < steps; ++s) {
      st.set_tokens(in);
      step_over_nccl(st, comm);
      std::vector<float> ref(size_t(B) * V);
      std::vector<int32_t> ref_tokens(B);
      if (rank == 0) {
        whole->set_tokens(in);
        whole->step();
        ref = whole->logits();
        ref_tokens = whole->tokens();
      }
      broadcast(comm, ref.data(), ref.size(), ncclFloat32);
      broadcast(comm, ref_tokens.data(), ref_tokens.size(), ncclInt32);
      const std::vector<float> mine = st.logits();  // [B][Vs]: this rank's vocabulary block
      const std::vector<int32_t> tok = st.tokens();
      for (int b = 0; b < B; ++b) {
        const float* r = &ref[size_t(b) * V + size_t(rank) * Vs];
        const double err = test::rel_error(&mine[size_t(b) * Vs], r, Vs);
        worst = std::max(worst, err);
        ASSERT_LT(err, 2e-2) << "step " << s << " sequence " << b;
        if (tok[b] != ref_tokens[b]) {
          ++differ;
          const float* full = &ref[size_t(b) * V];
          double ss = 0;
          for (int v = 0; v < V; ++v) ss += double(full[v]) * full[v];
          EXPECT_LT(full[ref_tokens[b]] - full[tok[b]], 4 * 2e-2 * std::sqrt(ss / V))
              << "step " << s << " sequence " << b << ": token " << tok[b] << " against the whole model's " << ref_tokens[b];
        }
      }
      in = ref_tokens;
    }
    EXPECT_EQ(st.plan().error(), 0u);
    EXPECT_LE(differ, 2) << "greedy tokens differ in " << differ << " of " << steps * B;
    std::printf("  rank %d of %d%s: logits within %.2e of the whole model's, %d of %d tokens differ\n", rank, tp,
                in_launch ? " (in launch)" : "", worst, differ, steps * B);
  }
#endif
}

}  // namespace
}  // namespace tw
