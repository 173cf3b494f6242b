#!/usr/bin/env bash
# The main job: set up, build, and print the traffic report of every named order against the
# bounds for the Llama-3-8B FFN on the H200 preset. Extra arguments go to `tileweave`.
# It builds only what it runs -- the CLI and the host model -- so a first run takes about a
# minute and a half on 2 cores; scripts/test.sh builds everything (CUDA kernels included).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A first configure leaves CUDA off (it costs seconds even when nothing CUDA is built); a build/
# that scripts/test.sh configured keeps CUDA on (only the CLI target is built here either way).
[ -f build/CMakeCache.txt ] || export TW_CMAKE_ARGS="-DTW_ENABLE_CUDA=OFF ${TW_CMAKE_ARGS:-}"
TW_BUILD_TARGET=tileweave scripts/build.sh
if [ $# -gt 0 ]; then exec build/tools/tileweave "$@"; fi
build/tools/tileweave
cat <<'NEXT'

Next to try:
  scripts/run.sh gui                     the explorer in a browser: orders drawn tile by tile (docs/explorer.md)
  scripts/run.sh search --gemm 64x256x256 --tile 32x32x64 --p 1 --cache 64KiB
                                         the best order of a small GEMM, searched exactly (docs/cli.md)
  pip install . && python3 -c "import tileweave; print(tileweave.simulate(tileweave.ffn_graph(m=16)).dram_total)"
                                         the model from Python (docs/python.md)
  scripts/gpu_test.sh, build-gpu/bench/bench_ffn
                                         on a machine with an NVIDIA GPU: the GPU tests and the fused FFN
                                         against cuBLASLt (README: GPU tests and benchmarks)
NEXT
