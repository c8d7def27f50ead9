#!/usr/bin/env bash
# A/B of the small-copy and hand-off paths, on a GPU machine, each pair in turn on one ferryd
# build: 4 KiB round trips with the done words the engines write (the default) and without
# (FERRY_DONE_WORDS=0: the completion ring alone); the seed's in-step overlap with the
# GPU-side hand-off (handoff: gpu) and the host one (handoff: host). ROUNDS (default 2) turns
# each. Writes under $OUT: latency-*.txt, overlap-*.txt.
set -uo pipefail
. "$(dirname "$0")/env.sh"
policy=${POLICY:-policies/chunked.yaml}
for round in $(seq "${ROUNDS:-2}"); do
  start_ferryd
  for words in 1 0; do
    echo "== round $round: 4 KiB latency, done words $words"
    FERRY_DONE_WORDS=$words "$BUILD/ferry-bench" transfer --socket "$sock" --only latency \
      >"$OUT/latency-words$words-$round.txt" 2>/dev/null
    grep -E "^  (h2d|d2h)  |PASS|FAIL|LIMIT" "$OUT/latency-words$words-$round.txt"
  done
  kill -TERM $pid; wait $pid
  for where in gpu host; do
    echo "== round $round: in-step overlap, handoff $where"
    FERRYD_ARGS="--handoff $where" start_ferryd >/dev/null
    grep -h "copies ordered after" "$rt/ferryd.log"
    "$BUILD/ferryctl" --socket "$sock" bench overlap --policies "$policy" --metrics 127.0.0.1:9477 \
      >"$OUT/overlap-$where-$round.txt" 2>/dev/null
    grep -E "in-process in-step|in-step blocks|copy alone|compute \(math" "$OUT/overlap-$where-$round.txt"
    kill -TERM $pid; wait $pid
  done
done
