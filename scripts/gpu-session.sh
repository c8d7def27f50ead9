#!/usr/bin/env bash
# One batched session on a lent GPU machine (see ../shared/device/README.md): GPU tests, the
# demo, and ferry-bench transfer against the in-process baseline. Results go to $OUT.
# Expects a build made elsewhere in $BUILD (default build-dev) with its libraries bundled in
# $BUILD/devlibs. Absolute paths baked into the build point at $FERRY_BUILT_AT.
set -uo pipefail
BUILD=${BUILD:-build-dev}
OUT=${OUT:-/tmp/ferry-out}
mkdir -p "$OUT"
built_at=${FERRY_BUILT_AT:-/work/main}
if [ ! -e "$built_at" ]; then mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; fi
export LD_LIBRARY_PATH=$PWD/$BUILD/devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
lscpu | grep -E "^(NUMA|Model name|CPU\(s\))" ; nvidia-smi topo -m 2>/dev/null | head -3
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$OUT/gpu.txt"

echo "== gpu tests"
if [ -z "${SKIP_TESTS:-}" ]; then
  (cd "$BUILD" && ctest -L gpu --output-on-failure --timeout 300) >"$OUT/gpu-tests.log" 2>&1
  echo "gpu tests rc=$?"; grep -E "tests passed|Failed|Passed" "$OUT/gpu-tests.log"
fi

# Each variant: NAME:POLICY_FILE (empty: the built-in default). The first also runs the demo.
variants=${VARIANTS:-"default:"}
first=1
for v in $variants; do
  name=${v%%:*}; body=${v#*:}; tag=${name//[@,]/-}
  envs=""; case $body in *:*) envs=${body#*:}; body=${body%%:*};; esac
  rt=$(mktemp -d /tmp/ferry-bench-XXXXXX)
  printf 'runtime_dir: %s\npool:\n  size: %s\n' "$rt" "${POOL:-2GiB}" >"$rt/ferryd.yaml"
  [ -n "${RING:-}" ] && echo "ring_entries: $RING" >>"$rt/ferryd.yaml"
  # NAME may end in @CPU,CPU: ferryd's loop pinned to the first, the bench to the second.
  pin_daemon=""; pin_bench=""
  case $name in *@*) cpus=${name#*@}; pin_daemon=${cpus%,*}; pin_bench=${cpus#*,}; echo "cpu: $pin_daemon" >>"$rt/ferryd.yaml";; esac
  [ -n "$body" ] && echo "policy: $PWD/$body" >>"$rt/ferryd.yaml"
  echo "== variant $name: $body $envs"
  env $envs "$BUILD/ferryd" --backend cuda --config "$rt/ferryd.yaml" ${FERRYD_ARGS:-} >"$rt/ferryd.log" 2>&1 &
  pid=$!
  for _ in $(seq 400); do [ -S "$rt/ferryd.sock" ] && break; sleep 0.05; done
  head -n 3 "$rt/ferryd.log"
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
  "$BUILD/ferry-bench" transfer --socket "$rt/ferryd.sock" --daemon-pid $pid "${csv[@]}" ${BENCH_ARGS:-} \
    >"$OUT/transfer-$tag.txt" 2>/dev/null
  echo "bench rc=$?"
  cat "$OUT/transfer-$tag.txt"
  kill -TERM $pid; wait $pid; echo "ferryd rc=$?"
  tail -n 1 "$rt/ferryd.log"; [ $first = 1 ] && cp "$rt/ferryd.log" "$OUT/ferryd.log"
  first=0
done
