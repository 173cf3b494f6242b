// Decode-attention kernels for head dim 256 (see attention_kernel.cuh).
#include "attention_kernel.cuh"

namespace tw::detail {
DecodeKernel decode_kernel_d256(int g, bool paged, bool bulk, int warps) { return pick_kernel<256>(g, paged, bulk, warps); }
DecodeShortKernel decode_short_kernel_d256(int g, bool paged) { return pick_short_kernel<256>(g, paged); }
}  // namespace tw::detail
