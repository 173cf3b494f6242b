#!/usr/bin/env bash
# Configures and builds into build/ (CUDA parts too when nvcc is on PATH, unless the cache says
# TW_ENABLE_CUDA=OFF). TW_CMAKE_ARGS: extra configure arguments; TW_BUILD_TARGET: build only that
# target (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${TW_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "${TW_JOBS:-$(nproc)}" ${TW_BUILD_TARGET:+--target "$TW_BUILD_TARGET"}
