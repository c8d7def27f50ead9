#!/usr/bin/env bash
# How long ferryd takes from its start to "ready" (its socket listening, the pool made and
# registered) at pool sizes SIZES (default "2GiB 48GiB"), with shmem transparent huge pages off
# and on ("never" and "advise", where this user may switch them; restored after), beside
# probe-pool's measure of the machine's own limit for the same bytes. Writes $OUT/pool-start.txt.
set -uo pipefail
. "$(dirname "$0")/env.sh"
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp" 2>/dev/null)
settings=${THP_SETTINGS:-never advise}
{
  echo "host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); shmem THP was: ${was:-unknown}"
  for setting in $settings; do
    if ! echo "$setting" >"$thp" 2>/dev/null; then echo "== shmem THP: cannot set '$setting' here (kept ${was})"; continue; fi
    echo "== shmem THP: $(cat "$thp")"
    for size in ${SIZES:-2GiB 48GiB}; do
      for round in 1 2; do
        rt=$(mktemp -d -t ferry-XXXXXX)
        t0=$(date +%s%N)
        "$BUILD/ferryd" --backend cuda --runtime-dir "$rt" --pool-size "$size" --metrics-address "" >"$rt/log" 2>&1 &
        p=$!
        until grep -q "ferryd\[info\] ready" "$rt/log" 2>/dev/null || ! kill -0 $p 2>/dev/null; do sleep 0.002; done
        t1=$(date +%s%N)
        echo "ferryd --pool-size $size (round $round): start to ready $(( (t1 - t0) / 1000000 )) ms; $(grep -o 'pool: .*' "$rt/log")"
        echo "    $(grep -o 'started in .*' "$rt/log")"
        kill -TERM $p; wait $p; rm -rf "$rt"
      done
    done
    gib=$(for s in ${SIZES:-2GiB 48GiB}; do echo "${s%GiB}"; done)
    # shellcheck disable=SC2086
    "$BUILD/probe-pool" $gib
  done
  [ -n "$was" ] && echo "$was" >"$thp" 2>/dev/null
} 2>&1 | tee "$OUT/pool-start.txt"
