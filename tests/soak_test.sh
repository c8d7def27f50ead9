#!/usr/bin/env bash
# A bounded soak: many client processes with mixed sizes and priorities against one ferryd, some
# killed at random and replaced, for SECONDS (default 60; longer by argument). At the end: every
# client that was not killed checked every byte, ferryd evicted no one, the pool is whole again,
# and ferryd's memory is flat. usage: soak_test.sh FERRYD FERRYCTL TEST_CLIENT [SECONDS]
set -uo pipefail
ferryd=$1 ctl=$2 client=$3 seconds=${4:-60}
. "$(dirname "$0")/host_ferryd.sh"
dir=$(mktemp -d /tmp/ferry-soak-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; tail -20 "$dir/ferryd.log"; exit 1; }
"$ferryd" --backend host --runtime-dir "$dir" --pool-size 256MiB --slab-size 1MiB --metrics-address "" \
  --policy "$(dirname "$0")/../policies/latency-bulk.yaml" >"$dir/ferryd.log" 2>&1 &
dpid=$!
for _ in $(seq 200); do [ -S "$dir/ferryd.sock" ] && break; sleep 0.05; done
sock=$dir/ferryd.sock
rss() { awk '/VmRSS/ {print $2}' /proc/$dpid/status; }
declare -A pids
start() { # slot
  local name
  case $(( RANDOM % 3 )) in 0) name=serve;; 1) name=batch;; *) name=other;; esac
  "$client" mixed "$sock" $(( (RANDOM % 8 + 1) * 1048576 )) 1000000 >"$dir/c$1.log" 2>&1 &
  pids[$1]=$!
}
for i in $(seq 0 7); do start $i; done
sleep 3
rss_start=$(rss)
end=$((SECONDS + seconds)); kills=0; checked=0
while [ $SECONDS -lt $end ]; do
  sleep 0.5
  i=$(( RANDOM % 8 ))
  if ! kill -0 "${pids[$i]}" 2>/dev/null; then
    wait "${pids[$i]}"; rc=$?
    [ $rc = 0 ] || { cat "$dir/c$i.log"; fail "client $i exited $rc"; }
  fi
  if [ $(( RANDOM % 3 )) = 0 ]; then kill -9 "${pids[$i]}" 2>/dev/null; wait "${pids[$i]}" 2>/dev/null; kills=$((kills + 1)); start $i; fi
done
# Stop the rest politely: SIGTERM is not handled by the test client, so give them a finite job instead.
for i in "${!pids[@]}"; do kill -9 "${pids[$i]}" 2>/dev/null; wait "${pids[$i]}" 2>/dev/null; done
for i in $(seq 0 3); do "$client" mixed "$sock" 4194304 50 >"$dir/final$i.log" 2>&1 & done
for j in $(jobs -p); do [ "$j" = "$dpid" ] && continue; wait "$j" || fail "a final client failed: $(cat "$dir"/final*.log)"; done
wait_pool_whole "$ctl"  # bounded: the check below says if it is not
echo "$st"
python3 - "$st" "$rss_start" "$(rss)" "$kills" <<'PY' || fail "$(grep -E 'evicted' "$dir/ferryd.log" | tail -5)"
import json, sys
s = json.loads(sys.argv[1]); rss0, rss1, kills = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"copies {s['copies_completed']}, {kills} clients killed, evictions {s['evictions']}, "
      f"pool free {s['pool_free_bytes'] >> 20} of {s['pool_bytes'] >> 20} MiB, ferryd RSS {rss0} -> {rss1} KiB")
assert s["evictions"] == 0, "a well-behaved client was evicted"
assert s["pool_free_bytes"] == s["pool_bytes"], "pool not whole again"
assert s["copies_completed"] > 1000, "too few copies"
assert rss1 - rss0 < 16 * 1024, "ferryd's memory grew by more than 16 MiB"
PY
kill -TERM $dpid; wait $dpid || fail "ferryd did not stop cleanly"
echo PASS
