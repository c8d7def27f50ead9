#!/usr/bin/env bash
# Every thread of a running ferryd (its loop, pool zeroer, civetweb's metrics workers, the
# signal watcher...) has SIGHUP, SIGINT and SIGTERM blocked: only the signal watcher takes them
# (from a signalfd), so no handler runs on an arbitrary thread. And they still work: SIGHUP is
# heard, SIGTERM stops ferryd cleanly.
# usage: signals_blocked_test.sh FERRYD
set -uo pipefail
ferryd=$1
. "$(dirname "$0")/host_ferryd.sh"
metrics_address=127.0.0.1:0 start_host_ferryd signals "$ferryd"
[ -n "$metrics" ] || fail "ferryd's metrics did not start"
threads=0
for status in /proc/$pid/task/*/status; do
  blocked=$(sed -n 's/^SigBlk:[[:space:]]*//p' "$status")
  name=$(sed -n 's/^Name:[[:space:]]*//p' "$status")
  [ -n "$blocked" ] || continue  # the thread ended meanwhile
  # SIGHUP (1), SIGINT (2) and SIGTERM (15): bits 0, 1 and 14 of the mask.
  (((0x$blocked & 0x4003) == 0x4003)) || fail "thread '$name' does not block SIGHUP, SIGINT and SIGTERM (SigBlk $blocked)"
  threads=$((threads + 1))
done
[ $threads -ge 10 ] || fail "only $threads threads seen (the metrics server alone has 9)"
echo "all $threads threads block SIGHUP, SIGINT and SIGTERM"

# No policy file is configured here: a SIGHUP is heard, and said to have nothing to re-read.
kill -HUP $pid
for _ in $(seq 200); do grep -q "reload asked" "$dir/ferryd.log" && break; sleep 0.05; done
grep -q "reload asked" "$dir/ferryd.log" || { cat "$dir/ferryd.log"; fail "SIGHUP was not heard"; }
kill -TERM $pid
rc=0
for _ in $(seq 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
kill -0 $pid 2>/dev/null && { cat "$dir/ferryd.log"; fail "ferryd still runs 10 s after SIGTERM"; }
wait $pid || rc=$?
[ $rc = 0 ] || { cat "$dir/ferryd.log"; fail "ferryd exited $rc after SIGTERM"; }
grep -q "stopped cleanly" "$dir/ferryd.log" || { cat "$dir/ferryd.log"; fail "no clean stop logged"; }
echo PASS
