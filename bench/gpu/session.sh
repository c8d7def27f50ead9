#!/usr/bin/env bash
# One batched session on a GPU machine: GPU tests, the demo, and ferry-bench transfer against the
# in-process baseline (every section, the block lists included). Results go to $OUT. Expects a CUDA build in $BUILD (default build-dev; see
# env.sh for a build made in another checkout path).
set -uo pipefail
. "$(dirname "$0")/env.sh"
lscpu | grep -E "^(NUMA|Model name|CPU\(s\))" ; nvidia-smi topo -m 2>/dev/null | head -3
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$OUT/gpu.txt"

echo "== gpu tests"
if [ -z "${SKIP_TESTS:-}" ]; then
  (cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) >"$OUT/gpu-tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "tests passed|Failed|Passed" "$OUT/gpu-tests.log"
fi

# Huge pages for the pool: THP_AB=1 first measures both directions at once with the kernel's
# shmem_enabled at never and at advise; SHMEM_HUGE=advise|never sets it for the variants below.
# The machine's own setting is put back at the end.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
thp_was=$(sed 's/.*\[\(.*\)\].*/\1/' $thp 2>/dev/null)
echo "shmem_enabled: $thp_was"
if [ -n "${THP_AB:-}" ]; then
  for setting in never advise; do
    echo $setting >$thp || echo "cannot set $thp"
    echo "== shmem_enabled $setting"
    start_ferryd
    "$BUILD/ferry-bench" transfer --socket "$sock" --only both,many --max-size $((512 << 20)) 2>/dev/null |
      grep -E "both|1024 x|PASS|FAIL"
    kill -TERM $pid; wait $pid
  done
fi
[ -n "${SHMEM_HUGE:-}" ] && { echo "$SHMEM_HUGE" >$thp || echo "cannot set $thp"; }

# REGISTER_AB=1: how the pool is pinned (pool.register), whole against slab by slab, on the
# bandwidth and both-ways sections, twice in turn.
if [ -n "${REGISTER_AB:-}" ]; then
  for round in 1 2; do
    for mode in whole per_slab; do
      echo "== pool.register $mode, round $round"
      FERRYD_ARGS="--pool-register $mode" start_ferryd
      "$BUILD/ferry-bench" transfer --socket "$sock" --only bandwidth,both 2>/dev/null |
        grep -E "^(64 MiB|256 MiB|1 GiB) |both|FAIL|PASS" | tee "$OUT/register-$mode-$round.txt"
      kill -TERM $pid; wait $pid
    done
  done
fi

# Each variant: NAME:POLICY_FILE (empty: the built-in default). The first also runs the demo.
variants=${VARIANTS:-"default:"}
first=1
for v in $variants; do
  name=${v%%:*}; body=${v#*:}; tag=${name//[@,]/-}
  envs=""; case $body in *:*) envs=${body#*:}; body=${body%%:*};; esac
  config=()
  [ -n "${RING:-}" ] && config+=("ring_entries: $RING")
  # NAME may end in @CPU,CPU: ferryd's loop pinned to the first, the bench to the second.
  pin_daemon=""; pin_bench=""
  case $name in *@*) cpus=${name#*@}; pin_daemon=${cpus%,*}; pin_bench=${cpus#*,}; config+=("cpu: $pin_daemon");; esac
  [ -n "$body" ] && config+=("policy: $PWD/$body")
  echo "== variant $name: $body $envs"
  FERRYD_ENV=$envs start_ferryd "${config[@]}"
  if [ $first = 1 ]; then
    echo "== demo"
    "$BUILD/ferry-demo" --socket "$rt/ferryd.sock" 2>&1 | tee "$OUT/demo.txt"
  fi
  if [ $first = 1 ] && [ -n "${OVERLAP:-}" ]; then
    # The seed workload under every shipped policy, its report signed with a throwaway key
    # (the .pub comes back to be checked with minisign; the secret key stays here).
    echo "== overlap"
    "$BUILD/ferryctl" keygen --dir "$rt" --name bench >/dev/null && cp "$rt/bench.pub" "$OUT/"
    "$BUILD/ferryctl" --socket "$rt/ferryd.sock" bench overlap --policies policies --report "$OUT/overlap.json" \
      --sign-key "$rt/bench.key" --svg "$OUT/overlap.svg" ${OVERLAP_ARGS:-} >"$OUT/overlap.txt" 2>"$OUT/overlap.err"
    echo "overlap rc=$?"; cat "$OUT/overlap.txt"; tail -n 3 "$OUT/overlap.err"
    [ -n "${OVERLAP_EXTRA:-}" ] && eval "$OVERLAP_EXTRA"
  fi
  csv=()
  [ $first = 1 ] && csv=(--csv "$OUT/transfer.csv")
  [ -n "$pin_bench" ] && csv+=(--cpu "$pin_bench")
  [ -n "${SKIP_TRANSFER:-}" ] && { kill -TERM $pid; wait $pid; first=0; continue; }
  # Every section (the block lists included) unless BENCH_ARGS has an --only.
  "$BUILD/ferry-bench" transfer --socket "$rt/ferryd.sock" --daemon-pid $pid "${csv[@]}" ${BENCH_ARGS:-} \
    >"$OUT/transfer-$tag.txt" 2>/dev/null
  echo "bench rc=$?"
  cat "$OUT/transfer-$tag.txt"
  # BLOCK_RUNS=N: N more runs of the many-copies and block-list sections alone (their targets
  # hold in each of three runs).
  for run in $(seq "${BLOCK_RUNS:-0}"); do
    echo "== block lists, run $run"
    "$BUILD/ferry-bench" transfer --socket "$rt/ferryd.sock" --only many,blocks >"$OUT/blocks-$tag-$run.txt" 2>/dev/null
    echo "bench rc=$?"
    cat "$OUT/blocks-$tag-$run.txt"
  done
  kill -TERM $pid; wait $pid; echo "ferryd rc=$?"
  tail -n 1 "$rt/ferryd.log"; [ $first = 1 ] && cp "$rt/ferryd.log" "$OUT/ferryd.log"
  first=0
done
[ -n "$thp_was" ] && echo "$thp_was" >$thp 2>/dev/null
echo "shmem_enabled put back: $(cat $thp 2>/dev/null)"
