#!/usr/bin/env bash
# ferry-bench transfer's blocks section without a GPU: against a ferryd on the host backend it
# runs ferry's list copies alone (every shuffled list and the 1024 x 64 KiB one in order, both
# ways), checks every byte of each in a poisoned destination, and says that it ran without the
# in-process columns. Any other section still refuses clearly.
# usage: bench_blocks_test.sh FERRYD FERRY_BENCH
set -uo pipefail
ferryd=$1 bench=$2
. "$(dirname "$0")/host_ferryd.sh"
# The largest list's regions are 128 MiB: a pool buffer of that and the slabs of its neighbours.
pool_size=192MiB start_host_ferryd bench-blocks "$ferryd"

"$bench" transfer --socket "$sock" --only blocks --quick >"$dir/out.txt" 2>"$dir/err.txt" ||
  { cat "$dir/out.txt" "$dir/err.txt" "$dir/ferryd.log"; fail "ferry-bench transfer --only blocks failed"; }
cat "$dir/out.txt"
grep -q "host backend (no GPU" "$dir/out.txt" || fail "the output does not say it ran on the host backend"
for list in "4096 x 16 KiB" "2048 x 64 KiB" "512 x 256 KiB" "1024 x 64 KiB in order"; do
  for d in h2d d2h; do
    grep -Eq "^  $list +$d  ferry +[0-9.]+ \[ *[0-9.]+, *[0-9.]+\]  every byte checked$" "$dir/out.txt" ||
      fail "no checked row for $list $d"
  done
done
[ "$(grep -c "every byte checked$" "$dir/out.txt")" = 8 ] || fail "not exactly 8 checked rows"
grep -q "^every list arrived intact$" "$dir/out.txt" || fail "no verdict"

# Every other section needs a GPU: a clear error, not a hang.
"$bench" transfer --socket "$sock" --only blocks,many --quick >"$dir/many.txt" 2>&1 && fail "--only blocks,many ran without a GPU"
grep -Eq "GPU|CUDA" "$dir/many.txt" || { cat "$dir/many.txt"; fail "the error does not say it needs a GPU"; }

kill -TERM $pid; wait $pid || fail "ferryd did not stop cleanly"
echo PASS
