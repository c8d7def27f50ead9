#!/usr/bin/env bash
# ferry-bench transfer's blocks section without a GPU: against a ferryd on the host backend it
# runs ferry's list copies alone (every shuffled list and the 1024 x 64 KiB one in order, both
# ways), checks every byte of each in a poisoned destination, and says that it ran without the
# in-process columns. With --clients 2 (and --max-size 128MiB, which keeps the lists of 64 MiB
# regions: a sanitizer's build copies 128 MiB slowly) it then runs the 4096 x 16 KiB list from
# two client processes at once, each checking every byte of its own, and a list that arrives
# wrong, a client that ends and clients without pool room are clear errors. Any other section
# still refuses clearly. Under ThreadSanitizer (FERRY_SANITIZED=thread), where every byte copied
# costs many times as much, the first run keeps the 64 MiB lists too, and the ended client and
# the clients without room (the bench's own error paths, run by the other builds) are left out.
# usage: bench_blocks_test.sh FERRYD FERRY_BENCH
set -uo pipefail
ferryd=$1 bench=$2
. "$(dirname "$0")/host_ferryd.sh"
# The largest list's regions are 128 MiB: a pool buffer of that, or of 64 MiB for the bench and
# each of two list clients, with room for an ended run's slabs while ferryd renews them.
pool_size=512MiB start_host_ferryd bench-blocks "$ferryd"

lists=("4096 x 16 KiB" "2048 x 64 KiB" "512 x 256 KiB" "1024 x 64 KiB in order") first=()
tsan=; [ "${FERRY_SANITIZED:-}" = thread ] && tsan=1
[ -n "$tsan" ] && lists=("4096 x 16 KiB" "1024 x 64 KiB in order") first=(--max-size 128MiB)
"$bench" transfer --socket "$sock" --only blocks --quick "${first[@]}" >"$dir/out.txt" 2>"$dir/err.txt" ||
  { cat "$dir/out.txt" "$dir/err.txt" "$dir/ferryd.log"; fail "ferry-bench transfer --only blocks failed"; }
cat "$dir/out.txt"
grep -q "host backend (no GPU" "$dir/out.txt" || fail "the output does not say it ran on the host backend"
for list in "${lists[@]}"; do
  for d in h2d d2h; do
    grep -Eq "^  $list +$d  ferry +[0-9.]+ \[ *[0-9.]+, *[0-9.]+\]  every byte checked$" "$dir/out.txt" ||
      fail "no checked row for $list $d"
  done
done
[ "$(grep -c "every byte checked$" "$dir/out.txt")" = $((2 * ${#lists[@]})) ] || fail "not exactly $((2 * ${#lists[@]})) checked rows"
grep -q "^every list arrived intact$" "$dir/out.txt" || fail "no verdict"

# Two list clients: ferryd saw them as sessions of their own, and the list has a row a direction
# of client 1 alone, both clients' rates, their rate together and how long both were copying.
small=(--only blocks --quick --max-size 128MiB)
"$bench" transfer --socket "$sock" "${small[@]}" --clients 2 >"$dir/out.txt" 2>"$dir/err.txt" ||
  { cat "$dir/out.txt" "$dir/err.txt" "$dir/ferryd.log"; fail "ferry-bench transfer --clients 2 failed"; }
cat "$dir/out.txt"
[ "$(grep -c "every byte checked$" "$dir/out.txt")" = 4 ] || fail "--max-size 128MiB: not the 4 rows of the 64 MiB lists"
grep -q "^block lists from 2 client processes at once" "$dir/out.txt" || fail "no table of the two clients"
[ "$(grep -c "% of the span$" "$dir/out.txt")" = 2 ] || fail "not one row of the two clients a direction"
for list in "4096 x 16 KiB"; do
  for d in h2d d2h; do
    grep -Eq "^  $list +$d +[0-9.]+ \[[0-9.]+, [0-9.]+\] +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x +[0-9]+% of the span$" \
      "$dir/out.txt" || fail "no row of the two clients for $list $d"
  done
done
grep -q "^every client's every list arrived intact$" "$dir/out.txt" || fail "no verdict for the two clients"
# Started together, the two were both copying for some of the span of at least one direction
# (told to go one after the other, they never would be).
grep -Eq " [1-9][0-9]*% of the span$" "$dir/out.txt" || fail "the two clients never copied at the same time"
clients_of_this_test() { pgrep -f "list-client --index [0-9]+ --lists [0-9]+ --socket $sock" || true; }
for c in 1 2; do
  for _ in $(seq 100); do
    grep -q "session [0-9]* 'ferry-bench list client $c' (pid [0-9]*) ended: client disconnected" "$dir/ferryd.log" &&
      break
    sleep 0.05
  done
  grep -q "session [0-9]* 'ferry-bench list client $c' (pid [0-9]*) ended: client disconnected" "$dir/ferryd.log" ||
    fail "list client $c was not a session of its own that ended"
done
[ -z "$(clients_of_this_test)" ] || fail "a list client is still running"

# A list that arrives wrong, a client that ends mid-run, and clients that find no pool room (the
# bench's 64 MiB and 8 clients' in this pool): each a clear error naming the client and what
# went wrong, no client left running.
expect_client_error() {  # NAME PATTERN, then the command
  local name=$1 pattern=$2
  shift 2
  "$@" >"$dir/$name.txt" 2>&1 && { cat "$dir/$name.txt"; fail "$name: the bench passed"; }
  grep -Eq "$pattern" "$dir/$name.txt" || { cat "$dir/$name.txt"; fail "$name: no error matching '$pattern'"; }
  [ -z "$(clients_of_this_test)" ] || fail "$name: a list client is still running after the error"
}
FERRY_LIST_CLIENT_FAULT=2:spoil expect_client_error spoiled \
  "list client 2: list position 0 of its list arrived wrong" \
  "$bench" transfer --socket "$sock" "${small[@]}" --clients 2
if [ -z "$tsan" ]; then
  FERRY_LIST_CLIENT_FAULT=1:exit expect_client_error ended "list client 1: it ended without answering" \
    "$bench" transfer --socket "$sock" "${small[@]}" --clients 2
  expect_client_error no-room "list client [0-9]+: .*AllocateHost: .*pool has no" \
    "$bench" transfer --socket "$sock" "${small[@]}" --clients 8
fi

# Every other section needs a GPU: a clear error, not a hang.
"$bench" transfer --socket "$sock" --only blocks,many --quick >"$dir/many.txt" 2>&1 && fail "--only blocks,many ran without a GPU"
grep -Eq "GPU|CUDA" "$dir/many.txt" || { cat "$dir/many.txt"; fail "the error does not say it needs a GPU"; }

# The host run prints its table only: --json is refused, not ignored.
"$bench" transfer --socket "$sock" --only blocks --quick --json >"$dir/json.txt" 2>&1 && fail "--json ran without a GPU"
grep -q -- "--json" "$dir/json.txt" || { cat "$dir/json.txt"; fail "the refusal does not name --json"; }

kill -TERM $pid; wait $pid || fail "ferryd did not stop cleanly"
echo PASS
