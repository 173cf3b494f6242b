#!/usr/bin/env bash
# Browser tests of the explorer (tests/web/): Debian's chromium + chromium-driver, Selenium and
# pytest from PyPI in .venv-web/, all installed only when missing. The tests start the real
# `tileweave gui` (TILEWEAVE_BIN, default build/tools/tileweave) on a free loopback port and save
# screenshots and downloads under artifacts/web/.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for p in chromium chromium-driver python3-venv; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "web_test: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! .venv-web/bin/python -c "import selenium, pytest" 2>/dev/null; then
  echo "web_test: installing selenium and pytest into .venv-web/"
  python3 -m venv .venv-web
  .venv-web/bin/pip install -q selenium pytest
fi

export TILEWEAVE_BIN="${TILEWEAVE_BIN:-$PWD/build/tools/tileweave}"
mkdir -p artifacts/web
.venv-web/bin/python -m pytest tests/web -q -p no:cacheprovider "$@"
echo "web_test: screenshots in artifacts/web/"
