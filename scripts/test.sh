#!/usr/bin/env bash
# All tests: set up, build everything (CUDA files too when nvcc exists), run the CPU suite and the
# GPU suite (which skips with a message where there is no GPU), then the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure -j "${TW_JOBS:-$(nproc)}"
if [ -x build/tests/tileweave_gpu_tests ]; then build/tests/tileweave_gpu_tests; fi
if [ -d tests/web ] && ls tests/web/test_*.py >/dev/null 2>&1; then scripts/web_test.sh; fi
