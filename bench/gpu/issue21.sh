#!/usr/bin/env bash
# Issue 21's targets in one call on a GPU machine, within LIMIT seconds (default 560): probe-chain
# (what a lane puts around each copy) and probe-handoff (ways to hand a copy to another process
# and back); ROUNDS rounds (default 3), each of ab-fences.sh's VARIANTS in turn (default "words",
# the default fences; a fresh ferryd each: 4 KiB, 1024 x 64 KiB, the block lists, the in-step
# overlap); the GPU tests (TESTS=0 skips them), then again with each of TEST_ENVS (e.g.
# "FERRY_FENCES=events") in the environment of the ferryd they start; two list clients at
# once. Each part starts only if enough of LIMIT is left. Writes under $OUT/res and packs it into
# $OUT/results.tgz after each part, so a cut-off call still brings back what ran.
set -uo pipefail
. "$(dirname "$0")/env.sh"
root=$OUT
res=$root/res
mkdir -p "$res"
start=$(date +%s)
left() { echo $((${LIMIT:-560} - ($(date +%s) - start))); }
at() { echo "$(($(date +%s) - start)) s"; }
pack() { tar -C "$root" -czf "$root/results.tgz" res; }
nvidia-smi --query-gpu=name,uuid,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv |
  tee "$res/gpu.txt"
date -u | tee -a "$res/gpu.txt"

echo "== probe-chain"
timeout 90 "$BUILD/probe-chain" >"$res/probe-chain.txt" 2>&1
cat "$res/probe-chain.txt"
echo "== probe-handoff"
timeout 60 "$BUILD/probe-handoff" >"$res/probe-handoff.txt" 2>&1
cat "$res/probe-handoff.txt"
pack

run_round() {  # NAME VARIANT
  mkdir -p "$res/$1"
  echo "== $1 ($2) at $(at)"
  OUT=$res/$1 ROUNDS=1 VARIANTS=$2 timeout $(($(left) - 10)) bash "$ferry_root/bench/gpu/ab-fences.sh" 2>&1 |
    tee "$res/ab-$1.txt"
  pack
}
for r in $(seq "${ROUNDS:-3}"); do
  for v in ${VARIANTS:-words}; do
    [ "$(left)" -gt 90 ] || { echo "round $r $v skipped: $(left) s left"; continue; }
    run_round "r$r-$v" "$v"
  done
done

gpu_tests() {  # NAME [ENV=VALUE]: ctest -L gpu, ferryd started by the tests with ENV set
  [ "$(left)" -gt 60 ] || { echo "gpu tests $1 skipped: $(left) s left"; return; }
  echo "== ctest -L gpu ($1) at $(at)"
  local limit
  limit=$(left)
  [ "$limit" -gt 200 ] && limit=200
  (cd "$BUILD" && env ${2:-} timeout $((limit - 5)) ctest -L gpu --output-on-failure --timeout 120) \
    >"$res/ctest-gpu-$1.txt" 2>&1
  grep -E "tests passed|\*\*\*|Failed  " "$res/ctest-gpu-$1.txt" | tail -8
  pack
}
if [ "${TESTS:-1}" = 1 ]; then
  gpu_tests default
  for e in ${TEST_ENVS:-}; do gpu_tests "${e%%=*}" "$e"; done
fi

if [ "$(left)" -gt 60 ]; then
  echo "== block lists from two clients at $(at)"
  start_ferryd >/dev/null
  timeout $(($(left) - 10)) "$BUILD/ferry-bench" transfer --socket "$sock" --only blocks --clients 2 \
    >"$res/blocks-clients2.txt" 2>&1
  grep -v '^\[' "$res/blocks-clients2.txt" | tail -16
  kill -TERM "$pid"
  wait "$pid"
  pack
fi
echo "done at $(at)"
