#!/usr/bin/env bash
# Where a single pool copy's time goes between 12 and 392 MiB: ferry's pool copies from Python
# with and without stream-waitable events, beside libferry's own single copies from C++
# (ferry-bench transfer --only bandwidth) against in-process cudaMemcpyAsync, on one ferryd.
# Writes under $OUT: pool-gap-*.txt.
set -uo pipefail
. "$(dirname "$0")/env.sh"
py=${PYTHON:-python3}
export PYTHONPATH=$ferry_root/$BUILD/python
start_ferryd
seqs=${SEQS:-32,64,128,256,1046}
for round in 1 2; do
  for sw in "" --stream-waitable; do
    echo "== round $round: forum pool copies ${sw:-(not stream-waitable)}"
    $py -m ferry.bench forum --socket "$sock" --seqs "$seqs" --no-latency --quiet $sw >"$OUT/pool-gap-forum$sw-$round.txt" 2>&1
    grep -E "pre-pinned|ferry pool" "$OUT/pool-gap-forum$sw-$round.txt"
  done
done
echo "== ferry-bench transfer --only bandwidth (C++)"
"$BUILD/ferry-bench" transfer --socket "$sock" --only bandwidth --max-size $((256 << 20)) >"$OUT/pool-gap-cpp.txt" 2>/dev/null
grep -vE "^\s*$" "$OUT/pool-gap-cpp.txt" | head -40
kill -TERM "$pid"; wait "$pid"
start_ferryd >/dev/null
echo "== pool_gap.py: Python, C++ and torch in turns on the same tensors"
$py bench/gpu/pool_gap.py "$sock" 2>&1 | tee "$OUT/pool-gap-turns.txt"
kill -TERM "$pid"; wait "$pid"
