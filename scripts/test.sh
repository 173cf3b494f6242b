#!/usr/bin/env bash
# All tests: set up, build everything (CUDA files too when nvcc exists), run the CPU suite (with the
# installed C++ package's consumer) and the GPU suite (which skips with a message where there is no
# GPU), the Python package's suite in a fresh venv, then the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# CUDA on explicitly: a build/ that scripts/run.sh configured first has it off.
TW_CMAKE_ARGS="-DTW_ENABLE_CUDA=ON ${TW_CMAKE_ARGS:-}" scripts/build.sh
ctest --test-dir build --output-on-failure -j "${TW_JOBS:-$(nproc)}"
if [ -x build/tests/tileweave_gpu_tests ]; then build/tests/tileweave_gpu_tests; fi
scripts/python_test.sh
if [ -d tests/web ] && ls tests/web/test_*.py >/dev/null 2>&1; then scripts/web_test.sh; fi
