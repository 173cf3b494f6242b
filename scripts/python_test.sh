#!/usr/bin/env bash
# The Python package on the CPU: `pip install .` (the host model; nanobind and scikit-build-core
# come from PyPI in pip's isolated build) into a fresh venv .venv-py/, then the pytest suite
# tests/python/ (the GPU op tests in tests/python/gpu/ skip with a reason where there is no GPU or
# torch). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# python3-venv, and the headers the extension compiles against (Debian's python3 needs python3-dev).
missing=()
python3 -c "import ensurepip" 2>/dev/null || missing+=(python3-venv)
python3 -c "import os, sysconfig; raise SystemExit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" ||
  missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
  echo "python_test: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
rm -rf .venv-py
python3 -m venv .venv-py
echo "python_test: pip install . (CPU build) into .venv-py/"
CMAKE_BUILD_PARALLEL_LEVEL="${TW_JOBS:-$(nproc)}" .venv-py/bin/pip install -q . pytest
# From outside the checkout, so `import tileweave` is the installed package.
cd tests/python
../../.venv-py/bin/python -c "import tileweave as tw; print('python_test: tileweave', tw.__version__, 'llama3-8b FFN M=16 on h200:', tw.simulate(tw.ffn_graph(m=16)).dram_total, 'B DRAM')"
../../.venv-py/bin/python -m pytest -q -rs -p no:cacheprovider . "$@"
