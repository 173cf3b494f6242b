#!/usr/bin/env bash
# Configures and builds into build/ (CUDA parts too when nvcc is on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${TW_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "${TW_JOBS:-$(nproc)}"
