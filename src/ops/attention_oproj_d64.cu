// Attention -> o_proj executor kernels for head dim 64 (see attention_oproj_kernel.cuh).
#include "attention_oproj_kernel.cuh"

namespace tw::detail {
AttentionOprojKernel attention_oproj_kernel_d64(int g, bool paged, bool small_batch) {
  return pick_attention_oproj_kernel<64>(g, paged, small_batch);
}
}  // namespace tw::detail
