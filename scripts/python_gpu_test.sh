#!/usr/bin/env bash
# The Python package with its GPU ops on a machine with an NVIDIA GPU and no registries (the lent
# GPU machine: its python3 has torch, nanobind, scikit-build-core and pytest). Run
# scripts/device_deps.sh on a development machine first (it collects the JSON headers into
# .devdeps/, which the call carries). Builds the CUDA extension for sm_90a into build-py/, installs
# it into python3's environment, and runs tests/python (the GPU op tests and the CPU ones).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build-py/out}; mkdir -p "$OUT"
[ -d .devdeps/include/nlohmann ] || { echo "python_gpu_test: .devdeps/ missing: run scripts/device_deps.sh and carry .devdeps"; exit 1; }
echo "python_gpu_test: building the CUDA extension (log: $OUT/pip.log)"
if ! TILEWEAVE_CUDA=1 TILEWEAVE_CUDA_ARCHS="${TILEWEAVE_CUDA_ARCHS:-90a}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python3 -m pip install --no-build-isolation --no-deps --no-index -v . \
    -C cmake.define.TW_DEPS_DIR="$PWD/.devdeps" >"$OUT/pip.log" 2>&1; then
  grep -E "error|Error" -A3 "$OUT/pip.log" | head -40; echo "python_gpu_test: build failed"; exit 1
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
cd tests/python
set -o pipefail
python3 -m pytest -v -p no:cacheprovider -rs . "$@" 2>&1 | tee "$OUT/pytest.log"
