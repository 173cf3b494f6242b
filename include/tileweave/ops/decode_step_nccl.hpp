// A tensor-parallel rank's decode step over NCCL, one process per GPU (built when NCCL is found:
// TW_HAVE_NCCL). Each launch of the rank's step (DecodeStep::run_segment) is followed on the same
// stream by its collective as an in-place ncclAllReduce: the sum of the fp32 stream's parts after
// o_proj and down, the max of the LM head's 64-bit (value, index) keys before sampling.
#pragma once

#include <nccl.h>

#include <string>

#include "tileweave/ops/decode_step.hpp"

namespace tw {

// A communicator of this process's rank. From the environment scripts/tp_launch.sh sets: TW_RANK,
// TW_WORLD_SIZE, TW_NCCL_ID_FILE (rank 0 writes the NCCL unique id there; the others wait for it, up
// to timeout_s), and TW_LOCAL_RANK (the GPU; default TW_RANK). InvalidArgument names a missing or bad
// variable, a timeout, or an NCCL error.
class NcclRank {
 public:
  static NcclRank from_env(double timeout_s = 120);
  NcclRank(int rank, int size, const ncclUniqueId& id);  // on the current device
  ~NcclRank();
  NcclRank(NcclRank&& o) noexcept;
  NcclRank(const NcclRank&) = delete;
  NcclRank& operator=(const NcclRank&) = delete;
  NcclRank& operator=(NcclRank&&) = delete;
  ncclComm_t comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

// One step of `step` (rank comm.rank() of comm.size(), as its options say: InvalidArgument otherwise):
// with the collectives between launches, each as an ncclAllReduce on the stream; with them in the
// launch (an NcclExchange made for the step), one launch.
void step_over_nccl(DecodeStep& step, const NcclRank& comm, cudaStream_t stream = nullptr);

#ifdef TW_HAVE_NCCL_DEVICE
// The exchange region of a step with the collectives in the launch (DecodeStepOptions::
// collectives_in_launch) as a symmetric NCCL window (ncclMemAlloc, ncclCommWindowRegister), the ranks'
// regions reached by load/store (NCCL's LSA pointers, over NVLink): every rank makes one, together
// (a collective call). InvalidArgument if some rank is not load/store-reachable (not one NVLink domain).
class NcclExchange {
 public:
  NcclExchange(DecodeStep& step, const NcclRank& comm);
  ~NcclExchange();
  NcclExchange(const NcclExchange&) = delete;
  NcclExchange& operator=(const NcclExchange&) = delete;

 private:
  ncclComm_t comm_ = nullptr;
  ncclWindow_t window_{};
  void* memory_ = nullptr;
};
#endif

}  // namespace tw
