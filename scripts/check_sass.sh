#!/usr/bin/env bash
# Checks the SASS facts of the sm90 mainloop kernels in a build (docs/sm90_mainloop.md):
#   scripts/check_sass.sh [object-or-binary ...]   (default: build-sm90 then build-gpu libtileweave_cuda.a)
# For every kernel whose name matches $TW_SASS_KERNELS (default: the decode GEMM's): HGMMA present,
# no local memory (no LDL/STL, LOCAL:0, STACK:0); prints registers per thread and the HGMMA shapes.
# Needs cuobjdump (and nvdisasm) on PATH or $CUOBJDUMP; exits 1 on a violated fact.
set -euo pipefail
cd "$(dirname "$0")/.."
CUOBJDUMP=${CUOBJDUMP:-cuobjdump}
PATTERN=${TW_SASS_KERNELS:-gemm_sm90_kernel}
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  for f in build-sm90/libtileweave_cuda.a build-gpu/libtileweave_cuda.a; do [ -f "$f" ] && files=("$f") && break; done
fi
[ ${#files[@]} -gt 0 ] || { echo "check_sass: no build found (give an object, library or binary)"; exit 1; }
command -v "$CUOBJDUMP" >/dev/null || { echo "check_sass: cuobjdump not found (set CUOBJDUMP)"; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0; n=0
for f in "${files[@]}"; do
  "$CUOBJDUMP" --dump-sass "$f" >"$tmp/sass" 2>/dev/null
  "$CUOBJDUMP" --dump-resource-usage "$f" >"$tmp/res" 2>/dev/null
  # One block per function: name, then its instructions.
  awk -v pat="$PATTERN" '
    /Function :/ { fn = $3; keep = (fn ~ pat) }
    keep && /HGMMA/ { h[fn]++; match($0, /HGMMA\.[0-9x]+/); shape[fn] = substr($0, RSTART, RLENGTH) }
    keep && /(LDL|STL)[. ]/ { l[fn]++ }
    keep { seen[fn] = 1 }
    END { for (f in seen) printf "%s %d %d %s\n", f, h[f] + 0, l[f] + 0, (f in shape ? shape[f] : "-") }
  ' "$tmp/sass" | sort >"$tmp/facts"
  while read -r fn hg ll shp; do
    n=$((n + 1))
    res=$(grep -A1 "Function ${fn}:" "$tmp/res" | tail -1)
    reg=$(sed -n 's/.*REG:\([0-9]*\).*/\1/p' <<<"$res"); stack=$(sed -n 's/.*STACK:\([0-9]*\).*/\1/p' <<<"$res")
    local_b=$(sed -n 's/.*LOCAL:\([0-9]*\).*/\1/p' <<<"$res")
    short=$(sed -n 's/.*MainloopConfigILi\([0-9]*\)ELi\([0-9]*\)ELi\([0-9]*\)ELi[0-9]*.*/MPad=\1 k_atoms=\2 mblocks=\3/p' <<<"$fn")
    short=${short:-$fn}
    ok=ok
    if [ "$hg" -eq 0 ] || [ "$ll" -ne 0 ] || [ "${local_b:-0}" -ne 0 ] || [ "${stack:-0}" -ne 0 ]; then ok=FAIL; fail=1; fi
    printf "%-4s %-32s HGMMA x%-3s %-14s LDL/STL %-3s regs %-4s stack %-3s local %s\n" "$ok" "$short" "$hg" "$shp" "$ll" \
      "${reg:-?}" "${stack:-?}" "${local_b:-?}"
  done <"$tmp/facts"
done
[ "$n" -gt 0 ] || { echo "check_sass: no kernel matching '$PATTERN' found"; exit 1; }
echo "check_sass: $n kernels checked, $([ $fail -eq 0 ] && echo all facts hold || echo FAILED)"
exit $fail
