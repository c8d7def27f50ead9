#!/usr/bin/env bash
# How long ferryd takes from its start to "ready" (its socket listening, the pool made and
# registered) at pool sizes SIZES (default "2GiB 48GiB"), with shmem transparent huge pages off
# and on (THP_SETTINGS, default "never advise", where this user may switch them; restored after),
# beside the machine's own limit for the same bytes: `probe-pool --once`, a process that makes
# its CUDA context, faults the bytes in with every CPU and registers them, timed the same way
# from its start to "registered". ROUNDS (default 3) of each, ferryd and probe in turn; then a
# summary: medians [min, max] and each size's target (48 GiB <= 3 s, 2 GiB <= 0.15 s, or within
# 1.2x of the probe where the probe itself cannot reach it). Then (HUGETLB=1, the default, where
# this user may reserve them) ferryd from the kernel's reserved huge pages (--pool-huge-pages
# hugetlb), the reservation given back after. Writes $OUT/pool-start.txt.
set -uo pipefail
. "$(dirname "$0")/env.sh"
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp" 2>/dev/null)
settings=${THP_SETTINGS:-never advise}
sizes=${SIZES:-2GiB 48GiB}
rounds=${ROUNDS:-3}
declare -A took  # "setting size who" -> the rounds' milliseconds
ran=""           # the THP settings measured

# Starts a command with its output to $2 and sets ms to the milliseconds from its start until
# that file holds a line matching $1 (polled every 2 ms, the same for ferryd and the probe), or
# to "failed" if it ended first. Leaves it running: $p.
time_until() {
  local pattern=$1 log=$2
  shift 2
  local t0 t1
  t0=$(date +%s%N)
  "$@" >"$log" 2>&1 &
  p=$!
  until grep -q "$pattern" "$log" 2>/dev/null || ! kill -0 $p 2>/dev/null; do sleep 0.002; done
  t1=$(date +%s%N)
  if grep -q "$pattern" "$log"; then ms=$(( (t1 - t0) / 1000000 )); else ms=failed; fi
}

# One ferryd started and timed to "ready"; extra arguments go to ferryd. Prints its line and
# sets ms.
ferryd_round() {
  local size=$1 round=$2
  shift 2
  rt=$(mktemp -d -t ferry-XXXXXX)
  time_until "ferryd\[info\] ready" "$rt/log" "$BUILD/ferryd" --backend cuda --runtime-dir "$rt" \
    --pool-size "$size" --metrics-address "" "$@"
  echo "ferryd --pool-size $size${*:+ $*} (round $round): start to ready $ms ms; $(grep -o 'pool: .*' "$rt/log" | head -1)"
  echo "    $(grep -o 'started in .*' "$rt/log")"
  [ "$ms" = failed ] && { echo "    ferryd did not start:"; sed 's/^/    /' "$rt/log" | tail -5; }
  sleep 0.3  # the huge page count is read after ready
  echo "    $(grep -o 'pool: [0-9]* of .* on huge pages.*' "$rt/log")"
  kill -TERM $p; wait $p; rm -rf "$rt"
}

probe_round() {
  local size=$1 round=$2 log
  log=$(mktemp -t probe-pool-XXXXXX)
  time_until "^registered" "$log" "$BUILD/probe-pool" --once "${size%GiB}"
  echo "probe-pool --once ${size%GiB} (round $round): start to registered $ms ms; $(grep -o 'registered: .*' "$log")"
  wait $p; rm -f "$log"
}

# "MEDIAN MIN MAX" of the numbers given (milliseconds).
summary_ms() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print (NR % 2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2), v[1], v[NR]}'; }
# "median [min, max]" in seconds, from summary_ms's three numbers.
seconds() { awk -v m="$1" -v lo="$2" -v hi="$3" 'BEGIN {printf "%.3f [%.3f, %.3f]", m/1000, lo/1000, hi/1000}'; }

{
  echo "host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); shmem THP was: ${was:-unknown}; $rounds rounds"
  for setting in $settings; do
    if ! echo "$setting" >"$thp" 2>/dev/null; then echo "== shmem THP: cannot set '$setting' here (kept ${was})"; setting=${was:-unknown}; fi
    case " $ran " in *" $setting "*) continue ;; esac  # that setting's figures are in already
    ran+=" $setting"
    echo "== shmem THP: $(cat "$thp" 2>/dev/null)"
    for size in $sizes; do
      for round in $(seq "$rounds"); do
        ferryd_round "$size" "$round"
        [ "$ms" != failed ] && took["$setting $size ferryd"]+="$ms "
        probe_round "$size" "$round"
        [ "$ms" != failed ] && took["$setting $size probe"]+="$ms "
      done
    done
  done
  [ -n "$was" ] && echo "$was" >"$thp" 2>/dev/null
  echo "== summary: seconds from the process's start to ready (ferryd) or registered (probe-pool --once), median [min, max] of $rounds"
  for setting in $ran; do
    for size in $sizes; do
      read -ra f <<<"${took["$setting $size ferryd"]:-}"
      read -ra q <<<"${took["$setting $size probe"]:-}"
      [ ${#f[@]} = 0 ] || [ ${#q[@]} = 0 ] && { echo "THP $setting $size: no figures"; continue; }
      read -r fm flo fhi <<<"$(summary_ms "${f[@]}")"
      read -r qm qlo qhi <<<"$(summary_ms "${q[@]}")"
      case $size in 48GiB) target=3000 ;; 2GiB) target=150 ;; *) target= ;; esac
      line="THP $setting $size: ferryd $(seconds "$fm" "$flo" "$fhi"), probe $(seconds "$qm" "$qlo" "$qhi"); ferryd/probe $(awk -v a="$fm" -v b="$qm" 'BEGIN {printf "%.2f", a/b}')x"
      if [ -z "$target" ]; then
        echo "$line"
      elif [ "${fm%.*}" -le "$target" ]; then
        echo "$line; target <= ${target}ms: MET"
      elif [ "${qm%.*}" -gt "$target" ]; then
        verdict=$(awk -v a="$fm" -v b="$qm" 'BEGIN {print (a <= 1.2 * b) ? "MET" : "NOT MET"}')
        echo "$line; target <= ${target}ms is below the machine's own limit (the probe's median), so within 1.2x of the probe: $verdict"
      else
        echo "$line; target <= ${target}ms: NOT MET (the probe reaches it)"
      fi
    done
  done
  if [ "${HUGETLB:-1}" = 1 ]; then
    nr=/proc/sys/vm/nr_hugepages
    before=$(cat $nr)
    page_kb=$(awk '/Hugepagesize/ {print $2}' /proc/meminfo)
    for size in $sizes; do
      need=$(( ${size%GiB} * 1048576 / page_kb ))
      t0=$(date +%s%N)
      if ! echo $((before + need)) >$nr 2>/dev/null; then echo "== hugetlb: cannot reserve pages here"; break; fi
      free=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
      echo "== hugetlb: $free of $need pages of $page_kb kB free (reserved in $(( ($(date +%s%N) - t0) / 1000000 )) ms)"
      for round in 1 2; do ferryd_round "$size" "$round" --pool-huge-pages hugetlb; done
      echo "$before" >$nr
    done
  fi
} 2>&1 | tee "$OUT/pool-start.txt"
