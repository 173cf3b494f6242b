#!/usr/bin/env bash
# GPU tests on a machine with an NVIDIA GPU and no registries (the lent H200):
#   scripts/gpu_test.sh                    (needs .devdeps/ from scripts/device_deps.sh)
# Builds for sm_90a only (TW_TARGETS: only those targets) and runs the GPU test suite
# (TW_GTEST_ARGS: e.g. a --gtest_filter; TW_SKIP_TESTS=1: build only). Logs under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build-gpu/out}; mkdir -p "$OUT"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTW_BUILD_TOOLS=OFF \
  -DTW_DEPS_DIR="$PWD/.devdeps" -DCMAKE_CUDA_ARCHITECTURES=90a ${TW_CMAKE_ARGS:-} >"$OUT/cmake.log" 2>&1 || { cat "$OUT/cmake.log"; exit 1; }
targets=(); for t in ${TW_TARGETS:-}; do targets+=(--target "$t"); done
if ! cmake --build build-gpu -j 16 "${targets[@]}" >"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" -A3 "$OUT/build.log" | head -40; echo "gpu_test.sh: build failed"; exit 1
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if [ -z "${TW_SKIP_TESTS:-}" ]; then
  build-gpu/tests/tileweave_gpu_tests ${TW_GTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log"
fi
