#!/usr/bin/env bash
# A against B on one GPU machine, in turns: ferryd and ferry-bench transfer of build A, then of
# build B, ROUNDS times, so a figure that moves with the machine moves for both. A and B are build
# folders (each with ferryd, ferry-bench and libferry); ONLY picks the bench's sections.
#   A=build-dev B=build-before ROUNDS=2 ONLY=latency,many,staged bash bench/gpu/ab.sh
set -uo pipefail
. "$(dirname "$0")/env.sh"
base_ld=$LD_LIBRARY_PATH
for round in $(seq "${ROUNDS:-2}"); do
  for build in "${A:-build-dev}" "${B:-build-before}"; do
    echo "== $build, round $round"
    export LD_LIBRARY_PATH=$ferry_root/$build:$base_ld  # each build's own libferry first
    FERRYD=$build/ferryd start_ferryd
    "$build/ferry-bench" transfer --socket "$sock" --only "${ONLY:-latency,many,staged}" 2>/dev/null |
      grep -E "^  (h2d|d2h) |1024 x|^  (64|256) MiB|^  1 GiB|PASS|FAIL|LIMIT" | tee "$OUT/ab-$build-$round.txt"
    kill -TERM "$pid"; wait "$pid"
  done
done
