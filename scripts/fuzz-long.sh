#!/usr/bin/env bash
# The long fuzz run (not part of every CI run): builds the fuzz targets with Clang's libFuzzer
# (coverage-guided, with ASan and UBSan) and runs each for RUNS executions (default 1,000,000),
# each input limited to 10 s (30 s for the targets that start a live ferryd in their first input;
# an alias bomb took 29 s before it was refused, so a hang still fails the run), starting
# from the shipped YAML files and the seed corpora under tests/fuzz/seeds/.
#   usage: scripts/fuzz-long.sh [RUNS] [TARGET...]
#   (targets: yaml control ring session block_list numa_maps signed; default all)
# Prints one line per target with the executions libFuzzer reports; exits 1 on any crash or hang.
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1000000}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(yaml control ring session block_list numa_maps signed)
build=${FERRY_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ FERRY_BUILD_DIR=$build FERRY_BUILD_TYPE=RelWithDebInfo bash scripts/build.sh \
  -DFERRY_CUDA=OFF -DFERRY_FUZZ_LIBFUZZER=ON >/dev/null
summary=()
status=0
for t in "${targets[@]}"; do
  work=$(mktemp -d "/tmp/ferry-fuzz-$t-XXXXXX")
  seeds=() limit=10
  case $t in
    yaml) seeds=(policies config);;
    ring|session) limit=30;;
  esac
  [ -d "tests/fuzz/seeds/$t" ] && seeds+=("tests/fuzz/seeds/$t")
  mkdir -p "$work/corpus"
  echo "== fuzz_$t: $runs executions (log $work/log)"
  start=$SECONDS
  if "$build/tests/fuzz_$t" -runs="$runs" -timeout=$limit -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$work/" "$work/corpus" "${seeds[@]}" >"$work/log" 2>&1; then
    execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$work/log")
    summary+=("fuzz_$t: $execs executions in $((SECONDS - start)) s, no crash, no hang")
  else
    status=1
    tail -30 "$work/log"
    summary+=("fuzz_$t: FAILED after $((SECONDS - start)) s (artifacts in $work)")
  fi
done
printf '%s\n' "${summary[@]}"
exit $status
