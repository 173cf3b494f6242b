#!/usr/bin/env bash
# The main job: set up, build, and print the traffic report of every named order against the
# bounds for the Llama-3-8B FFN on the H200 preset. Extra arguments go to `tileweave`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
exec build/tools/tileweave "$@"
