#!/usr/bin/env bash
# Where the time goes through ferryd, on a GPU machine, in three parts: the seed's in-step steps
# (ferryd --trace-engine with ferry-bench overlap --timeline, split by bench/gpu/instep_trace.py
# into the hand-off to ferryd's lane, the last copy and the hand-off back; then a plain ferryd
# with the client's stall probes on and off, ROUNDS times), the 4 KiB latency copies
# (bench/probes/trace_timeline.py: the client's call, ferryd reading and issuing, the engine,
# the done word) and the 1024 x 64 KiB copies (bench/probes/engine_busy.py: were the engines
# kept fed). POLICY (default policies/chunked.yaml) is the overlap's policy; OTHER_LIB, a folder
# holding another build's libferry.so.*, adds that client library to the plain rounds (an A/B of
# two client libraries against one ferryd). Results in $OUT.
set -uo pipefail
. "$(dirname "$0")/env.sh"
policy=${POLICY:-policies/chunked.yaml}
ov() {
  "$BUILD/ferry-bench" overlap --socket "$sock" --policies "$policy" --quick "$@" 2>/dev/null |
    grep -E "in-step|copy alone|pipelined|^note|FAIL"
}
echo "== in-step, ferryd --trace-engine ($policy)"
FERRYD_ARGS=--trace-engine start_ferryd >/dev/null
ov --timeline "$OUT/instep-trace.csv"
kill -TERM $pid; wait $pid
cp "$rt/ferryd.log" "$OUT/ferryd-instep-trace.log"
python3 bench/gpu/instep_trace.py "$OUT/ferryd-instep-trace.log" "$OUT/instep-trace.csv"

echo "== in-step, plain ferryd: the client's stall probes on, then off (FERRY_STALL_PROBES=0)"
start_ferryd >/dev/null
for round in $(seq "${ROUNDS:-2}"); do
  echo "-- round $round, probes on"; ov
  echo "-- round $round, probes off"; FERRY_STALL_PROBES=0 ov
  if [ -n "${OTHER_LIB:-}" ]; then
    echo "-- round $round, client library from $OTHER_LIB"; LD_LIBRARY_PATH=$OTHER_LIB:$LD_LIBRARY_PATH ov
  fi
done
kill -TERM $pid; wait $pid

echo "== 4 KiB latency, traced"
SECTIONS=latency PLAIN=0 bash bench/gpu/trace.sh
python3 bench/probes/trace_timeline.py "$OUT/ferryd-trace-latency.log" "$OUT/trace-latency.timeline"

echo "== 1024 x 64 KiB, traced"
SECTIONS=many PLAIN=0 bash bench/gpu/trace.sh
python3 bench/probes/engine_busy.py "$OUT/ferryd-trace-many.log" 200 16
