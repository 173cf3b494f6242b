#!/usr/bin/env bash
# ptxas facts of the Hopper kernels, on any machine with nvcc (no GPU needed):
#   tests/cuda/ptxas_facts.sh NVCC SOURCE_DIR
# Compiles each translation unit holding wgmma kernels for sm_90a with -warn-spills and fails when
#  - ptxas serializes a kernel's wgmma instructions (info C7511, "insufficient register resources for
#    the wgmma pipeline", or C7512, "... for the function"): every wgmma then waits for the one before,
#    and the kernel loses the overlap it was written for (a softmax change in the FP8 prefill attention
#    did this, silently; so did a stage-dependent scale-d operand in the DiT chain);
#  - a kernel spills where the design says it must not (the TUs in NO_SPILL).
# The decode step's kernels spill by design at their largest tiles (docs/decode_step.md), the DiT
# chain's in its GEMM epilogue (a 128 x 256 tile's accumulators beside the norm and RoPE): there the
# serialization is checked, and the step kernel's spill stores per (head dim, activation rows) against
# STEP_SPILL_BUDGET: ptxas's allocation jumps with small changes (session 25: 188 -> 812 B at D = 64,
# R = 128 and the step 21% slower), and such a jump should be seen before it is measured.
set -euo pipefail
nvcc=$1
src=$2
NO_SPILL=(src/ops/prefill_attention.cu src/ops/ffn_sm90.cu src/ops/gemm.cu src/ops/decode_gemm.cu)
ANY_SPILL=(src/ops/decode_step_d64.cu src/ops/decode_step_d128.cu src/ops/dit_chain.cu)
# Bytes of spill stores a thread the step kernel may have, per "D:R": about 1.5x those measured with
# this script's flags on 2026-11-28, session 31 (D = 64: 44 at R = 8 and 16, 64 at 32 and 64, 108 at
# 128, 776 at 256; D = 128: 44 / 44 / 96 at R = 8 / 16 / 32, 120 at 64, 448 at 128, 2112 at 256), so
# that small moves pass and a jump does not.
declare -A STEP_SPILL_BUDGET=(
  [64:8]=66 [64:16]=66 [64:32]=96 [64:64]=96 [64:128]=160 [64:256]=1100
  [128:8]=66 [128:16]=66 [128:32]=144 [128:64]=180 [128:128]=672 [128:256]=3100)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # tu spills_allowed
  local log="$tmp/log"
  if ! "$nvcc" -std=c++20 -O3 -arch=sm_90a -cubin --expt-relaxed-constexpr -I"$src/include" -I"$src/src" \
      -Xptxas -warn-spills -o "$tmp/out.cubin" "$src/$1" >"$log" 2>&1; then
    echo "FAIL $1: does not compile"; cat "$log"; fail=1; return
  fi
  local serial spills
  serial=$(grep -cE "C7511|C7512" "$log" || true)
  spills=$(grep -c "spilled to local memory" "$log" || true)
  if [ "$serial" -ne 0 ]; then
    echo "FAIL $1: ptxas serialized the wgmma of $serial kernel(s):"; grep -E "C7511|C7512" "$log" | sed 's/^/  /'; fail=1
  elif [ "$2" = no ] && [ "$spills" -ne 0 ]; then
    echo "FAIL $1: $spills kernel(s) spill:"; grep "spilled" "$log" | sed 's/^/  /'; fail=1
  else
    echo "ok   $1 (wgmma not serialized; spilling kernels: $spills)"
  fi
  step_budget "$1" "$log"
}
step_budget() {  # tu log: the step kernel's spill stores per activation rows against STEP_SPILL_BUDGET
  local d
  case "$1" in *decode_step_d64.cu) d=64 ;; *decode_step_d128.cu) d=128 ;; *) return ;; esac
  local line r bytes key
  while read -r line; do
    r=$(sed -E 's/.*decode_step_kernelINS_4sm9014MainloopConfigILi([0-9]+)E.*/\1/' <<<"$line")
    bytes=$(sed -E "s/.*', ([0-9]+) bytes spill stores.*/\1/" <<<"$line")
    key="$d:$r"
    if [ -z "${STEP_SPILL_BUDGET[$key]:-}" ]; then
      echo "FAIL $1: no spill budget for D = $d, R = $r ($bytes B)"; fail=1
    elif [ "$bytes" -gt "${STEP_SPILL_BUDGET[$key]}" ]; then
      echo "FAIL $1: the step kernel at D = $d, R = $r spills $bytes B a thread, over its budget of ${STEP_SPILL_BUDGET[$key]} B"; fail=1
    else
      echo "ok   $1: step kernel D = $d, R = $r spills $bytes B (budget ${STEP_SPILL_BUDGET[$key]})"
    fi
  done < <(grep "spilled to local memory in function '_ZN2tw4step18decode_step_kernel" "$2" || true)
}
for tu in "${NO_SPILL[@]}"; do check "$tu" no; done
for tu in "${ANY_SPILL[@]}"; do check "$tu" yes; done
exit $fail
