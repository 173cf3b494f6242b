#!/usr/bin/env bash
# ctest `consumer`: installs the build tree $1 into a temporary prefix, then configures, builds and
# runs tests/consumer against it with nothing of the source tree on its paths.
set -euo pipefail
build=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
ls "$tmp"/prefix/lib*/cmake/tileweave/tileweaveConfig.cmake >/dev/null
cmake -S "$here" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/app"
if [ -f "$build/libtileweave_cuda.a" ]; then "$tmp/build/app_cuda"; fi
