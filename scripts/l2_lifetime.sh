#!/usr/bin/env bash
# How long an evict-first line lives in L2 beside other lines (bench/l2_lifetime.cu), on a GPU machine
# with ncu: every case's re-read kernels profiled alone, the L2 not flushed between them, then the
# measured survival written beside the L2 model's.
#   scripts/l2_lifetime.sh [OUT.json]   (default bench/results/<gpu>/l2_lifetime.json; BIN=... the probe)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${BIN:-build-gpu/bench/l2_lifetime}
[ -x "$bin" ] || { echo "l2_lifetime.sh: no $bin (build the bench target l2_lifetime first)"; exit 1; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE 'H200|H100|A100' | tr 'A-Z' 'a-z' || true)
out=${1:-bench/results/${gpu:-gpu}/l2_lifetime.json}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
ncu --profile-from-start off --cache-control none --clock-control none --csv --print-units base \
    --metrics dram__bytes_read.sum --log-file "$tmp/ncu.csv" "$bin"
cp "$tmp/ncu.csv" "${out%.json}_ncu.csv"
"$bin" --report "$tmp/ncu.csv" "$out"
