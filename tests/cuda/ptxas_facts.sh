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
# chain's in its GEMM epilogue (a 128 x 256 tile's accumulators beside the norm and RoPE): only the
# serialization is checked there.
set -euo pipefail
nvcc=$1
src=$2
NO_SPILL=(src/ops/prefill_attention.cu src/ops/ffn_sm90.cu src/ops/gemm.cu src/ops/decode_gemm.cu)
ANY_SPILL=(src/ops/decode_step_d64.cu src/ops/decode_step_d128.cu src/ops/dit_chain.cu)
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
}
for tu in "${NO_SPILL[@]}"; do check "$tu" no; done
for tu in "${ANY_SPILL[@]}"; do check "$tu" yes; done
exit $fail
