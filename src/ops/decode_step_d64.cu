// The decode step's kernels for head dim 64 (one translation unit per head dim: they build in parallel).
#include "decode_step_kernel.cuh"

namespace tw::step {
int prepare_kernel_d64(int act_rows) { return prepare_kernel_for<64>(act_rows); }
void launch_d64(const StepParams& p, int grid, bool overlap, cudaStream_t stream) { launch_for<64>(p, grid, overlap, stream); }
#ifdef TW_STAGE_TRACE
void dump_stage_trace_d64(const char* path) { dump_stage_trace(path); }
#endif
}  // namespace tw::step
