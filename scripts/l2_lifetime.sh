#!/usr/bin/env bash
# How long an evict-first line lives in L2 beside other lines (bench/l2_lifetime.cu), on a GPU machine
# with ncu: every case's re-read kernels profiled alone, the L2 not flushed between them, then the
# measured survival written beside the L2 model's, with the read floor the run measured.
#   scripts/l2_lifetime.sh   -> $TW_RESULTS_DIR (default bench/results)/<gpu>/l2_lifetime.json (BIN=... the probe)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build-gpu/bench/l2_lifetime}
[ -x "$bin" ] || { echo "l2_lifetime.sh: no $bin (build the bench target l2_lifetime first)"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ncu --profile-from-start off --cache-control none --clock-control none --csv --print-units base \
    --metrics dram__bytes_read.sum --log-file "$tmp/ncu.csv" "$bin" --run "$tmp/floor.json"
"$bin" --report "$tmp/ncu.csv" "$tmp/floor.json"
