#!/usr/bin/env bash
# A restart soak: client processes copying random data of mixed sizes and priorities against a
# ferryd that is restarted (SIGTERM or SIGKILL, in turn) every RESTART seconds, while clients are
# also killed at random. Each client checks every byte it copies and reconnects when ferryd is
# back. Runs SECONDS (default 60; the long run is 600), RESTART default 20. At the end: no client ever saw a wrong
# byte, every ferryd stopped cleanly when asked, the last one is whole again (pool free, no
# session left), and each ferryd's RSS and open fds are recorded at its start and end: RSS
# grew by less than 16 MiB within any ferryd, and the last one's fds are back to what an idle
# ferryd holds.
#   usage: soak_restart_test.sh FERRYD FERRYCTL TEST_CLIENT [SECONDS] [RESTART]
set -uo pipefail
ferryd=$1 ctl=$2 client=$3 seconds=${4:-60} restart=${5:-20}
dir=$(mktemp -d /tmp/ferry-soak-restart-XXXXXX)
cleanup() { kill $(jobs -p) 2>/dev/null; pkill -9 -f "$dir/ferryd.sock" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; tail -20 "$dir"/ferryd-*.log 2>/dev/null | tail -40; exit 1; }
sock=$dir/ferryd.sock
dpid=0 instance=0
rss() { awk '/VmRSS/ {print $2}' "/proc/$dpid/status"; }
fds() { ls "/proc/$dpid/fd" | wc -l; }
start_ferryd() {
  instance=$((instance + 1))
  "$ferryd" --backend host --runtime-dir "$dir" --pool-size 128MiB --slab-size 1MiB --metrics-address "" \
    --policy "$(dirname "$0")/../policies/latency-bulk.yaml" >"$dir/ferryd-$instance.log" 2>&1 &
  dpid=$!
  # After a SIGKILL the old socket file is still there: wait for this ferryd to say it is ready.
  for _ in $(seq 1200); do grep -qs "\] ready$" "$dir/ferryd-$instance.log" && return 0; kill -0 $dpid 2>/dev/null || break; sleep 0.025; done
  fail "ferryd $instance did not start"
}
# One slot: runs clients one after another until told to stop. Exit 1 (a wrong byte) is recorded;
# exit 2 (a ferry call failed: ferryd went away, or was not back yet) is expected around restarts.
slot() { # index
  local i=$1 k=0
  while [ ! -e "$dir/stop" ]; do
    k=$((k + 1))
    "$client" mixed "$sock" $(( (RANDOM % 4 + 1) * 1048576 )) $(( RANDOM % 40 + 10 )) >"$dir/s$i.log" 2>&1 &
    local c=$!
    echo $c >"$dir/s$i.pid"
    wait $c; local rc=$?
    echo "$rc" >>"$dir/s$i.rc"
    [ $rc = 1 ] && cp "$dir/s$i.log" "$dir/wrong-byte-$i-$k.log"
    [ $rc = 0 ] || sleep 0.05
  done
}
start_ferryd
idle_fds=$(fds)
printf '%-9s %-8s %-10s %-10s %-8s %-8s %s\n' ferryd stop "RSS start" "RSS end" "fds st" "fds end" copies >"$dir/table"
for i in $(seq 0 5); do slot $i 2>/dev/null & done
end=$((SECONDS + seconds)); kills=0 restarts=0 how=term
while [ $SECONDS -lt $end ]; do
  sleep 2
  rss0=$(rss) fds0=$(fds)
  t_end=$((SECONDS + restart - 2)); [ $t_end -gt $end ] && t_end=$end
  while [ $SECONDS -lt $t_end ]; do
    sleep 0.5
    if [ $(( RANDOM % 4 )) = 0 ]; then
      i=$(( RANDOM % 6 )); kill -9 "$(cat "$dir/s$i.pid" 2>/dev/null)" 2>/dev/null && kills=$((kills + 1))
    fi
  done
  [ $SECONDS -ge $end ] && break
  copies=$("$ctl" --socket "$sock" status --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["copies_completed"])' || echo "?")
  rss1=$(rss) fds1=$(fds)
  if [ $how = term ]; then
    kill -TERM $dpid; wait $dpid || fail "ferryd $instance did not stop cleanly on SIGTERM (exit $?)"
    how=kill
  else
    kill -9 $dpid; wait $dpid 2>/dev/null
    how=term
  fi
  printf '%-9s %-8s %-10s %-10s %-8s %-8s %s\n' "#$instance" "$([ $how = kill ] && echo TERM || echo KILL)" \
    "$rss0" "$rss1" "$fds0" "$fds1" "$copies" >>"$dir/table"
  [ $((rss1 - rss0)) -lt 16384 ] || fail "ferryd $instance's RSS grew from $rss0 to $rss1 KiB"
  restarts=$((restarts + 1))
  start_ferryd
done
touch "$dir/stop"
for i in $(seq 0 5); do kill -9 "$(cat "$dir/s$i.pid" 2>/dev/null)" 2>/dev/null; done
wait_slots() { for j in $(jobs -p); do [ "$j" = "$dpid" ] && continue; wait "$j"; done; }
wait_slots
# The last ferryd serves a final round to completion, then is whole again.
for i in 0 1 2 3; do "$client" mixed "$sock" 4194304 50 >"$dir/final$i.log" 2>&1 & done
for j in $(jobs -p); do [ "$j" = "$dpid" ] && continue; wait "$j" || fail "a final client failed: $(cat "$dir"/final*.log)"; done
whole=0
for _ in $(seq 100); do
  st=$("$ctl" --socket "$sock" status --json) || fail "ferryctl status"
  python3 -c 'import json,sys; s=json.loads(sys.argv[1]); sys.exit(0 if s["pool_free_bytes"]==s["pool_bytes"] and s["sessions"]<=1 else 1)' "$st" && { whole=1; break; }
  sleep 0.1
done
# The last status's session may still be open (ferryd reaps it a turn later): fds, bounded wait.
for _ in $(seq 40); do [ "$(fds)" -le "$idle_fds" ] && break; sleep 0.05; done
rss1=$(rss) fds1=$(fds)
printf '%-9s %-8s %-10s %-10s %-8s %-8s %s\n' "#$instance" "end" "-" "$rss1" "$idle_fds" "$fds1" \
  "$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["copies_completed"])' "$st")" >>"$dir/table"
cat "$dir/table"
ok=$(cat "$dir"/s*.rc | grep -c '^0$'); gone=$(cat "$dir"/s*.rc | grep -c '^2$'); killed=$(cat "$dir"/s*.rc | grep -c '^137$')
wrong=$(cat "$dir"/s*.rc | grep -c '^1$'); other=$(cat "$dir"/s*.rc | grep -vc '^\(0\|1\|2\|137\)$')
echo "$seconds s: $restarts ferryd restarts, $kills clients killed; client runs: $ok every byte right," \
  "$gone could not reach ferryd or were cut off (it was restarting), $killed killed, $wrong with a wrong byte, $other other"
[ "$wrong" = 0 ] || { cat "$dir"/wrong-byte-*.log; fail "a client saw a wrong byte"; }
[ "$other" = 0 ] || fail "a client exited with an unexpected status: $(sort "$dir"/s*.rc | uniq -c | tr '\n' ' ')"
[ "$ok" -ge 10 ] || fail "only $ok client runs finished"
[ "$restarts" -ge 1 ] || fail "ferryd was never restarted (SECONDS $seconds < RESTART $restart?)"
[ $whole = 1 ] || fail "the last ferryd is not whole again: $st"
[ "$fds1" -le "$idle_fds" ] || fail "the last ferryd holds $fds1 fds, an idle one $idle_fds"
kill -TERM $dpid; wait $dpid || fail "ferryd did not stop cleanly"
echo PASS
