// DecodeStep over NCCL: the bootstrap of one process per rank and the step's launches with their
// collectives in between (ops/decode_step_nccl.hpp). Compiled when NCCL is found (TW_HAVE_NCCL).
#include "tileweave/ops/decode_step_nccl.hpp"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tileweave/util/cuda_check.hpp"
#ifdef TW_HAVE_NCCL_DEVICE
#include <nccl_device.h>
#endif

namespace tw {

namespace {

[[noreturn]] void bad(const std::string& what) { throw InvalidArgument("NCCL rank: " + what); }

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) bad(std::string(what) + " failed: " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (fallback >= 0) return fallback;
    bad(std::string("environment variable ") + name + " is not set (start the ranks with scripts/tp_launch.sh)");
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > 1 << 20) bad(std::string(name) + "='" + v + "' is not a non-negative integer");
  return int(x);
}

}  // namespace

NcclRank::NcclRank(int rank, int size, const ncclUniqueId& id) : rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size)
    bad("rank " + std::to_string(rank) + " is outside [0, " + std::to_string(size) + ")");
  check(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
}

NcclRank::NcclRank(NcclRank&& o) noexcept : comm_(o.comm_), rank_(o.rank_), size_(o.size_) { o.comm_ = nullptr; }

NcclRank::~NcclRank() {
  if (comm_) ncclCommDestroy(comm_);
}

NcclRank NcclRank::from_env(double timeout_s) {
  const int rank = env_int("TW_RANK", -1), size = env_int("TW_WORLD_SIZE", -1);
  if (rank >= size) bad("TW_RANK " + std::to_string(rank) + " is outside [0, TW_WORLD_SIZE = " + std::to_string(size) + ")");
  const char* file = std::getenv("TW_NCCL_ID_FILE");
  if (!file || !*file) bad("environment variable TW_NCCL_ID_FILE is not set (start the ranks with scripts/tp_launch.sh)");
  int devices = 0;
  TW_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int local = env_int("TW_LOCAL_RANK", rank);
  if (local >= devices) bad("TW_LOCAL_RANK " + std::to_string(local) + ": this machine has " + std::to_string(devices) + " GPUs");
  TW_CUDA_CHECK(cudaSetDevice(local));
  ncclUniqueId id{};
  namespace fs = std::filesystem;
  if (rank == 0) {  // write then rename: the others never read a partial id
    check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string tmp = std::string(file) + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof id.internal);
    std::error_code ec;
    fs::rename(tmp, file, ec);
    if (ec) bad("cannot write the NCCL id to '" + std::string(file) + "' (" + ec.message() + ")");
  } else {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      std::error_code ec;
      if (fs::file_size(file, ec) == sizeof id.internal && !ec) break;
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s)
        bad("rank " + std::to_string(rank) + " waited " + std::to_string(int(timeout_s)) + " s for rank 0's NCCL id in '" +
            file + "'");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream(file, std::ios::binary).read(id.internal, sizeof id.internal);
  }
  return NcclRank(rank, size, id);
}

namespace {
void check_rank(const DecodeStep& step, const NcclRank& comm) {
  const DecodeStepOptions& o = step.options();
  if (o.tp != comm.size() || o.rank != comm.rank())
    bad("the step is rank " + std::to_string(o.rank) + " of " + std::to_string(o.tp) + ", the communicator's rank " +
        std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
}
}  // namespace

#ifdef TW_HAVE_NCCL_DEVICE
namespace {
__global__ void lsa_pointers_kernel(ncclWindow_t w, int n, void** out) {
  for (int i = 0; i < n; ++i) out[i] = ncclGetPeerPointer(w, 0, i);  // world rank i (every rank is in the LSA team)
}
}  // namespace

NcclExchange::NcclExchange(DecodeStep& step, const NcclRank& comm) : comm_(comm.comm()) {
  check_rank(step, comm);
  if (!step.exchange_region())
    bad("the step has no collectives in the launch (DecodeStepOptions::tp > 1 and collectives_in_launch)");
  const ncclTeam_t lsa = ncclTeamLsa(comm.comm());
  if (lsa.nRanks != comm.size())
    bad("the collectives in the launch need every rank reachable by load/store (one NVLink domain); " +
        std::to_string(lsa.nRanks) + " of " + std::to_string(comm.size()) + " are");
  const size_t bytes = size_t(step.exchange_bytes());
  check(ncclMemAlloc(&memory_, bytes), "ncclMemAlloc");
  check(ncclCommWindowRegister(comm_, memory_, bytes, &window_, NCCL_WIN_COLL_SYMMETRIC), "ncclCommWindowRegister");
  void** dev = nullptr;
  TW_CUDA_CHECK(cudaMalloc(&dev, sizeof(void*) * comm.size()));
  lsa_pointers_kernel<<<1, 1>>>(window_, comm.size(), dev);
  TW_CUDA_CHECK_LAUNCH();
  std::vector<void*> regions(comm.size());
  TW_CUDA_CHECK(cudaMemcpy(regions.data(), dev, sizeof(void*) * regions.size(), cudaMemcpyDeviceToHost));
  TW_CUDA_CHECK(cudaFree(dev));
  step.set_exchange(regions, memory_);
}

NcclExchange::~NcclExchange() {
  if (window_) ncclCommWindowDeregister(comm_, window_);
  if (memory_) ncclMemFree(memory_);
}
#endif

void step_over_nccl(DecodeStep& step, const NcclRank& comm, cudaStream_t stream) {
  check_rank(step, comm);
  if (step.segments() == 1) return step.step(stream);  // one launch (tp 1, or the collectives in it)
  const int n = step.segments();
  for (int i = 0; i < n; ++i) {
    step.run_segment(i, stream);
    if (i + 1 == n) break;
    const StepCollective c = step.collective(i);
    if (c.kind == StepCollective::SumF32)
      check(ncclAllReduce(c.data, c.data, size_t(c.count), ncclFloat32, ncclSum, comm.comm(), stream), "ncclAllReduce (sum)");
    else
      check(ncclAllReduce(c.data, c.data, size_t(c.count), ncclUint64, ncclMax, comm.comm(), stream), "ncclAllReduce (max)");
  }
}

}  // namespace tw
