#!/usr/bin/env bash
# Quick A/B sweeps on a GPU machine, against one ferryd:
#   transfers: both ways, 1024 x 64 KiB and 4 KiB latency under policy variants (bulk streams);
#   staged:    pageable copies with streaming stores vs plain memcpy, thread counts and chunk sizes;
#   overlap:   the seed workload's in-step blocks on 1..3 compute streams, for several cuts.
# Expects a CUDA build in $BUILD (default build-dev; see env.sh).
# Each part can be skipped: SKIP_TESTS, SKIP_TRANSFER, SKIP_STAGED, SKIP_OVERLAP. FERRYD_B names a
# second ferryd binary: the transfer variants run against both, the other parts against it.
set -uo pipefail
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "== gpu tests"
  (cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) >"$OUT/gpu-tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "tests passed|Failed|\*\*\*" "$OUT/gpu-tests.log"
fi

# start_ferryd (env.sh) with ferryd binary $1, and the commands aimed at it: ctl, bench.
start() {
  FERRYD=$1 start_ferryd
  ctl="$BUILD/ferryctl --socket $sock"
  bench="$BUILD/ferry-bench transfer --socket $sock"
}
stop_ferryd() { kill -TERM $pid; wait $pid; echo "ferryd $1 rc=$?"; tail -n 2 "$rt/ferryd.log"; }

# A variant of the default policy: NAME STREAMS CHUNK IN_FLIGHT; prints the file's path.
variant() {
  sed -e "s/^name: chunked/name: $1/" -e "s/per_direction: 2 /per_direction: $2 /" \
    -e "s/chunk_size: 64MiB /chunk_size: $3 /" -e "s/in_flight_bytes: 128MiB /in_flight_bytes: $4 /" \
    -e "s/client_in_flight_bytes: 128MiB/client_in_flight_bytes: $4/" policies/chunked.yaml >"$rt/$1.yaml"
  echo "$rt/$1.yaml"
}

# Transfers under policy variants: LABEL FERRYD VARIANT...
transfer_sweep() {
  local label=$1 bin=$2; shift 2
  start "$bin"
  for v in "$@"; do
    IFS=, read -r name streams chunk window <<<"$v"
    $ctl policy apply "$(variant "$name" "$streams" "$chunk" "$window")" >/dev/null || echo "apply $name failed"
    echo "== transfer ($label), policy $name: $streams bulk streams, $chunk chunks, $window in flight"
    $bench --only both,many,latency ${TRANSFER_ARGS---quick} --max-size $((512 << 20)) 2>/dev/null |
      grep -E "both|1024 x|^  (h2d|d2h) |PASS|FAIL|LIMIT"
  done
  stop_ferryd "$label"
}
if [ -z "${SKIP_TRANSFER:-}" ]; then
  transfer_sweep A "$BUILD/ferryd" ${TRANSFER_VARIANTS:-"default,2,64MiB,128MiB" "s1,1,64MiB,128MiB" "s4,4,64MiB,128MiB" "s8,8,64MiB,128MiB" "s2w192,2,64MiB,192MiB"}
  # FERRYD_B: another ferryd binary (say, a scheduler change) under the same variants.
  [ -n "${FERRYD_B:-}" ] && transfer_sweep B "$FERRYD_B" ${TRANSFER_VARIANTS_B:-"default,2,64MiB,128MiB" "s4,4,64MiB,128MiB"}
fi
start "${FERRYD_B:-$BUILD/ferryd}"


if [ -z "${SKIP_STAGED:-}" ]; then
  # HOW,THREADS[,CHUNK]: memcpy or stream(ing stores); 0 or no chunk: the policy's.
  for v in ${STAGED_VARIANTS:-"memcpy,0" "stream,0" "memcpy,12" "memcpy,0,1048576" "memcpy,0,4194304"}; do
    IFS=, read -r how threads chunk <<<"$v"
    args=(); [ "$threads" != 0 ] && args+=(--staged-threads "$threads")
    [ "${chunk:-0}" != 0 ] && args+=(--staged-chunk "$chunk")
    envs=(); [ "$how" = stream ] && envs+=(FERRY_STAGED_COPY=streaming)
    echo "== staged, $how, threads $threads, chunk ${chunk:-0} (0: the policy's)"
    env "${envs[@]}" $bench --only staged --quick --max-size $((256 << 20)) "${args[@]}" 2>/dev/null |
      grep -E "^  [0-9]+ [MG]iB|FAIL|PASS|LIMIT"
  done
fi

if [ -z "${SKIP_OVERLAP:-}" ]; then
  row() { grep -E "^(compute|in-process (serial|in-step)|ferryd)" | grep -v "copy alone"; }
  for lanes in ${LANES:-1 2 3}; do
    for cut in ${CUTS:-"blocks:6" "cut:2048,1024,640,256,128" "blocks:7" "blocks:8"}; do
      kind=${cut%%:*}; arg=${cut#*:}
      echo "== overlap, $lanes compute streams, $kind $arg"
      $ctl bench overlap --steps 20 --warmup 3 --rounds 2 --compute-streams "$lanes" --"$kind" "$arg" \
        --policies policies/geometric.yaml 2>/dev/null | row
    done
  done
fi

stop_ferryd staged-overlap
