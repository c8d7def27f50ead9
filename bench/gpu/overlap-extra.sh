#!/usr/bin/env bash
# Extra runs for a GPU session (session.sh runs it with OVERLAP_EXTRA, from the checkout): other
# cuts of the overlap workload's math, staged-copy settings, and ferryctl tune twice. Needs the
# runtime directory of a running ferryd as $1.
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -uo pipefail
rt=$1; sock=$rt/ferryd.sock
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build-dev}; OUT=${OUT:-$BUILD/gpu-results}
ctl="$BUILD/ferryctl --socket $sock"
row() { grep -E "^(compute|in-process|ferryd)" | grep -v "copy alone"; }
for cut in ${CUTS:-"6,0.45" "7,0.45" "6,0.4" "7,0.4"}; do
  blocks=${cut%,*}; ratio=${cut#*,}
  echo "== overlap, math cut in $blocks blocks, ratio $ratio"
  $ctl bench overlap --quick --blocks "$blocks" --ratio "$ratio" --policies policies/geometric.yaml,policies/chunked.yaml 2>/dev/null | row
done
for st in ${STAGED:-"0,0" "0,16" "1048576,8" "4194304,12"}; do
  chunk=${st%,*}; threads=${st#*,}
  echo "== staged, chunk $chunk threads $threads (0: the policy's)"
  args=(); [ "$chunk" != 0 ] && args+=(--staged-chunk "$chunk"); [ "$threads" != 0 ] && args+=(--staged-threads "$threads")
  $BUILD/ferry-bench transfer --socket "$sock" --only staged --quick --max-size $((1 << 30)) "${args[@]}" 2>/dev/null |
    grep -E "^  [0-9]+ [MG]iB|FAIL|PASS"
done
echo "== tune (first)"
$BUILD/ferryctl keygen --dir "$rt" --name tune >/dev/null; cp "$rt/tune.pub" "$OUT/"
$ctl tune --out "$OUT/tuned.yaml" --sign-key "$rt/tune.key" 2>"$OUT/tune1.err" | tee "$OUT/tune1.txt"; echo "tune rc=${PIPESTATUS[0]}"
echo "== tune (second, same --out)"
$ctl tune --out "$OUT/tuned.yaml" --sign-key "$rt/tune.key" 2>"$OUT/tune2.err" | tee "$OUT/tune2.txt"; echo "tune rc=${PIPESTATUS[0]}"
