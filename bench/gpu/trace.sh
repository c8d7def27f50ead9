#!/usr/bin/env bash
# Where the time of copies through ferryd goes, on a GPU machine: ferry-bench's sections
# (SECTIONS, default both) against a ferryd run with --trace-engine, whose log then holds each
# copy's issue, engine start and end, and seen-done times, with ferry-bench's --timeline beside
# it; then (unless PLAIN=0) the same against a ferryd without the trace, whose events cost a
# little. BENCH_ARGS adds ferry-bench options. Writes, under $OUT, for each run NAME (trace,
# plain): NAME-SECTIONS.csv and NAME-SECTIONS.timeline, and ferryd-trace-SECTIONS.log.
set -uo pipefail
. "$(dirname "$0")/env.sh"
sections=${SECTIONS:-both}
modes="trace"; [ "${PLAIN:-1}" != 0 ] && modes="trace plain"
for mode in $modes; do
  args=(); [ -n "${FERRYD_CONFIG:-}" ] && args=("$FERRYD_CONFIG")
  if [ $mode = trace ]; then FERRYD_ARGS=--trace-engine start_ferryd "${args[@]}"; else FERRYD_ARGS= start_ferryd "${args[@]}"; fi
  suffix=${sections//,/-}${LABEL:+-$LABEL}
  tag=$mode-$suffix
  echo "== ferryd $mode ${FERRYD_CONFIG:-}, ferry-bench --only $sections ${BENCH_ARGS:-}"
  "$BUILD/ferry-bench" transfer --socket "$sock" --only "$sections" --csv "$OUT/$tag.csv" --timeline \
    ${BENCH_ARGS:-} 2>"$OUT/$tag.timeline" | grep -E "both|^  (h2d|d2h) |1024 x|MiB .*(h2d|d2h)|PASS|FAIL|LIMIT"
  kill -TERM $pid; wait $pid
  if [ $mode = trace ]; then
    cp "$rt/ferryd.log" "$OUT/ferryd-trace-$suffix.log"
    echo "$(grep -c "engine trace:" "$OUT/ferryd-trace-$suffix.log") engine trace lines"
  fi
done
