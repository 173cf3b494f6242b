#!/usr/bin/env bash
# The base tree of a decode-step A/B, on this machine (the GPU machine has no git history):
#   scripts/ab_prepare.sh REV            -> .ab/base: the sources of REV (git archive), for scripts/step_ab.sh
# Then run scripts/step_ab.sh on the GPU machine with .ab and .devdeps carried beside the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/ab_prepare.sh REV}
git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "ab_prepare.sh: no commit '$rev'"; exit 1; }
rm -rf .ab/base && mkdir -p .ab/base
git archive "$rev" -- CMakeLists.txt cmake include src bench/CMakeLists.txt "bench/*.cu" "bench/*.cuh" "bench/*.hpp" bench/configs tests tools scripts | tar x -C .ab/base
git rev-parse "$rev" > .ab/base/REV
echo "ab_prepare.sh: .ab/base = $(cat .ab/base/REV)"
