// Attention -> o_proj executor kernels for head dim 128 (see attention_oproj_kernel.cuh).
#include "attention_oproj_kernel.cuh"

namespace tw::detail {
AttentionOprojKernel attention_oproj_kernel_d128(int g, bool paged, bool small_batch) {
  return pick_attention_oproj_kernel<128>(g, paged, small_batch);
}
}  // namespace tw::detail
