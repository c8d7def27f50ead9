#!/usr/bin/env bash
# The main job on a fresh machine: build, start ferryd on a private runtime directory, push data
# through it with ferry-demo (every byte checked), print bandwidth and latency, stop ferryd.
# Uses the GPU when there is one and CUDA was found; otherwise the host backend, and says so.
# usage: scripts/demo.sh [FERRY_DEMO_OPTIONS...]   (`build/ferry-demo --help` lists them;
#        FERRY_POOL: ferryd's pool, 512MiB by default)
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
build=${FERRY_BUILD_DIR:-build}
rt=$(mktemp -d /tmp/ferry-demo-XXXXXX)
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$rt"' EXIT
"$build/ferryd" --runtime-dir "$rt" --pool-size "${FERRY_POOL:-512MiB}" --metrics-address 127.0.0.1:0 >"$rt/ferryd.log" 2>&1 &
pid=$!
# The pool is made and touched before ferryd listens: allow a minute on a slow machine.
for _ in $(seq 1200); do [ -S "$rt/ferryd.sock" ] && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
[ -S "$rt/ferryd.sock" ] || { cat "$rt/ferryd.log"; exit 1; }
grep -m1 "backend:" "$rt/ferryd.log" | sed 's/^/ferryd: /'
grep -m1 "metrics on" "$rt/ferryd.log" | sed 's/^/ferryd: /'
"$build/ferry-demo" --socket "$rt/ferryd.sock" "$@"
kill -TERM $pid; wait $pid
tail -n1 "$rt/ferryd.log" | sed 's/^/ferryd: /'
