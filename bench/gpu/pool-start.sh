#!/usr/bin/env bash
# How long ferryd takes from its start to "ready" (its socket listening, the pool made and
# registered) at pool sizes SIZES (default "2GiB 48GiB"), with shmem transparent huge pages off
# and on ("never" and "advise", where this user may switch them; restored after), beside
# probe-pool's measure of the machine's own limit for the same bytes; then (HUGETLB=1, the
# default, where this user may reserve them) from the kernel's reserved huge pages
# (--pool-huge-pages hugetlb), the reservation given back after. Writes $OUT/pool-start.txt.
set -uo pipefail
. "$(dirname "$0")/env.sh"
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp" 2>/dev/null)
settings=${THP_SETTINGS:-never advise}
# One ferryd started and timed to "ready"; extra arguments go to ferryd.
start_and_time() {
  local size=$1 round=$2
  shift 2
  rt=$(mktemp -d -t ferry-XXXXXX)
  t0=$(date +%s%N)
  "$BUILD/ferryd" --backend cuda --runtime-dir "$rt" --pool-size "$size" --metrics-address "" "$@" >"$rt/log" 2>&1 &
  p=$!
  until grep -q "ferryd\[info\] ready" "$rt/log" 2>/dev/null || ! kill -0 $p 2>/dev/null; do sleep 0.002; done
  t1=$(date +%s%N)
  echo "ferryd --pool-size $size${*:+ $*} (round $round): start to ready $(( (t1 - t0) / 1000000 )) ms; $(grep -o 'pool: .*' "$rt/log" | head -1)"
  echo "    $(grep -o 'started in .*' "$rt/log")"
  grep -q "ferryd\[info\] ready" "$rt/log" || { echo "    ferryd did not start:"; sed 's/^/    /' "$rt/log" | tail -5; }
  sleep 0.3  # the huge page count is read after ready
  echo "    $(grep -o 'pool: [0-9]* of .* on huge pages.*' "$rt/log")"
  kill -TERM $p; wait $p; rm -rf "$rt"
}
{
  echo "host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); shmem THP was: ${was:-unknown}"
  for setting in $settings; do
    if ! echo "$setting" >"$thp" 2>/dev/null; then echo "== shmem THP: cannot set '$setting' here (kept ${was})"; continue; fi
    echo "== shmem THP: $(cat "$thp")"
    for size in ${SIZES:-2GiB 48GiB}; do
      for round in 1 2; do
        start_and_time "$size" "$round"
      done
    done
    gib=$(for s in ${SIZES:-2GiB 48GiB}; do echo "${s%GiB}"; done)
    # shellcheck disable=SC2086
    "$BUILD/probe-pool" $gib
  done
  [ -n "$was" ] && echo "$was" >"$thp" 2>/dev/null
  if [ "${HUGETLB:-1}" = 1 ]; then
    nr=/proc/sys/vm/nr_hugepages
    before=$(cat $nr)
    page_kb=$(awk '/Hugepagesize/ {print $2}' /proc/meminfo)
    for size in ${SIZES:-2GiB 48GiB}; do
      need=$(( ${size%GiB} * 1048576 / page_kb ))
      t0=$(date +%s%N)
      if ! echo $((before + need)) >$nr 2>/dev/null; then echo "== hugetlb: cannot reserve pages here"; break; fi
      free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
      echo "== hugetlb: $free of $need pages of $page_kb kB free (reserved in $(( ($(date +%s%N) - t0) / 1000000 )) ms)"
      for round in 1 2; do start_and_time "$size" "$round" --pool-huge-pages hugetlb; done
      echo "$before" >$nr
    done
  fi
} 2>&1 | tee "$OUT/pool-start.txt"
