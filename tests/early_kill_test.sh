#!/usr/bin/env bash
# Clients killed in their first milliseconds, while their hello, allocations and registration are
# on the wire: each is a disconnect, never an eviction (a reply that finds its client gone is no
# fault of the client's), and ferryd ends whole. usage: early_kill_test.sh FERRYD FERRYCTL TEST_CLIENT [KILLS]
set -uo pipefail
ferryd=$1 ctl=$2 client=$3 kills=${4:-400}
. "$(dirname "$0")/host_ferryd.sh"
pool_size=256MiB start_host_ferryd early-kill "$ferryd"
fail() { echo "FAIL: $*"; grep -E "evicted|error" "$dir/ferryd.log" | tail -20; exit 1; }
for _ in $(seq "$kills"); do
  "$client" mixed "$sock" 1048576 1000 >/dev/null 2>&1 &
  c=$!
  sleep "0.00$((RANDOM % 10))$((RANDOM % 10))"  # 0 to 10 ms into its start
  kill -9 $c 2>/dev/null
  wait $c 2>/dev/null
done
"$client" roundtrip "$sock" 4194304 20 >"$dir/final.log" 2>&1 || fail "a client after the kills failed: $(cat "$dir/final.log")"
wait_pool_whole "$ctl"
python3 - "$st" "$kills" <<'PY' || fail "see above"
import json, sys
s, kills = json.loads(sys.argv[1]), int(sys.argv[2])
print(f"{kills} clients killed within 10 ms of their start: evictions {s['evictions']}, "
      f"pool free {s['pool_free_bytes'] >> 20} of {s['pool_bytes'] >> 20} MiB")
assert s["evictions"] == 0, "a client killed mid-start was counted as evicted"
assert s["pool_free_bytes"] == s["pool_bytes"], "pool not whole again"
PY
kill -TERM $pid; wait $pid || fail "ferryd did not stop cleanly"
echo PASS
