// Error checking for CUDA runtime and cuBLAS calls: every call's status is checked, and a failure
// throws with the call's text and location (exit code 0 proves nothing on a GPU).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tw {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void cuda_check(cudaError_t e, const char* expr, const char* file, int line) {
  if (e != cudaSuccess)
    throw CudaError(std::string(file) + ":" + std::to_string(line) + ": " + expr + " failed: " +
                    cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace tw

#define TW_CUDA_CHECK(expr) ::tw::cuda_check((expr), #expr, __FILE__, __LINE__)
// After a launch: catches bad configurations at once (asynchronous faults surface at the next sync).
#define TW_CUDA_CHECK_LAUNCH() ::tw::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
