#!/usr/bin/env bash
# A decode-step A/B on the GPU machine: this tree ("new") against .ab/base (scripts/ab_prepare.sh REV),
# both built from clean copies on the same machine, then bench_decode_step run over the same cases in
# interleaved rounds (base, new, base, new, ...), so that both see the same GPU and clocks.
#   CASES=llama-3-8b:1:1024,... [ROUNDS=3] [BENCH_ARGS="--config-json bench/configs/x.json ..."] \
#   [TARGETS="bench_decode_step tileweave_gpu_tests"] scripts/step_ab.sh
# Results under $OUT/res/{base,new}/rN; the comparison printed last (scripts/ab_summary.py; with
# AB_NAME and AB_METHOD set it also writes $OUT/AB_NAME.json, a result file for bench/results/<gpu>/).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT=${OUT:-build-gpu/out}; mkdir -p "$OUT/logs"
[ -f .ab/base/CMakeLists.txt ] || { echo "step_ab.sh: no .ab/base (run scripts/ab_prepare.sh REV here first, then carry .ab)"; exit 1; }
: "${CASES:?step_ab.sh: set CASES=model:batch:kv,...}"
t0=$(date +%s)
( cd .ab/base && cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTW_BUILD_TOOLS=OFF -DTW_DEPS_DIR="$root/.devdeps" \
    -DCMAKE_CUDA_ARCHITECTURES=90a >"$OUT/logs/base_cmake.log" 2>&1 &&
  cmake --build build-gpu -j 8 --target bench_decode_step >"$OUT/logs/base_build.log" 2>&1 ) &
TW_TARGETS=${TARGETS:-bench_decode_step} TW_SKIP_TESTS=1 OUT="$OUT/logs" scripts/gpu_test.sh || exit 1
wait
[ -x .ab/base/build-gpu/bench/bench_decode_step ] || { grep -E "error|FAILED" -A3 "$OUT/logs/base_build.log" | head -30; exit 1; }
echo "step_ab.sh: built in $(( $(date +%s) - t0 )) s"
for r in $(seq 1 "${ROUNDS:-3}"); do
  for v in base new; do
    bin=build-gpu/bench/bench_decode_step; [ $v = base ] && bin=.ab/base/build-gpu/bench/bench_decode_step
    TW_RESULTS_DIR="$OUT/res/$v/r$r" stdbuf -oL "$bin" --no-model ${BENCH_ARGS:-} --cases "$CASES" >"$OUT/logs/bench_${v}_r$r.log" 2>&1 ||
      { tail -5 "$OUT/logs/bench_${v}_r$r.log"; exit 1; }
    head -1 "$OUT/logs/bench_${v}_r$r.log"
  done
done
args=("$OUT/res")
[ -n "${AB_NAME:-}" ] && args+=(--name "$AB_NAME" --method "${AB_METHOD:-}" --out "$OUT/$AB_NAME.json")
python3 scripts/ab_summary.py "${args[@]}"
echo "step_ab.sh: done in $(( $(date +%s) - t0 )) s"
