// Links the installed GPU ops library (tileweave::cuda) and calls a host function of it, so the
// package's CUDA half is checked to link where it was built. Runs without a GPU.
#include <cstdio>

#include "tileweave/ops/attention.hpp"

int main() {
  const std::vector<float> inv = tw::rope_inv_freq(128, 10000.f);
  std::printf("rope_inv_freq(128): %zu frequencies, first %g\n", inv.size(), inv.at(0));
  return inv.size() == 64 && inv[0] == 1.f ? 0 : 1;
}
