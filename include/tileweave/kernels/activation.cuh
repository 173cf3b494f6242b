// The plain FFN chain's activation on a first-GEMM output (FfnActivation, graph/tile_graph.hpp),
// applied by every tile body's epilogue to the whole sum (after a split-K reduction, never to a
// partial: the activations are not linear).
#pragma once

namespace tw::kernels {

__device__ __forceinline__ float ffn_activate(int act, float v) {
  if (act == 1) return fmaxf(v, 0.f);  // ReLU
  if (act == 2) {                      // GeLU, tanh approximation, as PyTorch's approximate="tanh"
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.f + tanhf(u));
  }
  return v;
}

}  // namespace tw::kernels
