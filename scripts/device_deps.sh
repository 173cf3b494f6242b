#!/usr/bin/env bash
# Collects header-only dependencies and GoogleTest's source (from this machine's Debian packages)
# into .devdeps/, which the `device` calls carry: the GPU machine reaches no registry.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
rm -rf .devdeps && mkdir -p .devdeps/include
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/fmt .devdeps/include/
cp -r /usr/src/googletest .devdeps/googletest
du -sh .devdeps
