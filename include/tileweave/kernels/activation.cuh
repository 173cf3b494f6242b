// Activations of first-GEMM outputs, applied by every tile body's epilogue to the whole sum (after a
// split-K reduction, never to a partial: the activations are not linear): SiLU of the gated FFNs'
// gate, and the plain FFN chain's (FfnActivation, graph/tile_graph.hpp).
#pragma once

namespace tw::kernels {

// x * sigmoid(x). The fast division is exact enough for a bf16 output; where 1 + e^-x overflows
// (x < -88) it gives 0, the limit.
__device__ __forceinline__ float silu(float v) { return __fdividef(v, 1.f + __expf(-v)); }

__device__ __forceinline__ float ffn_activate(int act, float v) {
  if (act == 1) return fmaxf(v, 0.f);  // ReLU
  if (act == 2) {                      // GeLU, tanh approximation, as PyTorch's approximate="tanh"
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.f + tanhf(u));
  }
  return v;
}

}  // namespace tw::kernels
