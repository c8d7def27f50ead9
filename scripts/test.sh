#!/usr/bin/env bash
# Builds ferry and runs every test, then builds it again with ASan+UBSan and with TSan and runs
# the unit, integration and fuzz tests under them (but the real browser's and the tuner's
# 20-run verdict test, labels "browser" and "serial": the plain run has them). GPU tests (ctest label "gpu") skip cleanly
# without a GPU. The package test (ctest label "package": the Debian packages made from the build,
# installed, served and purged; root only) runs after the others. FERRY_SANITIZERS=0 skips the
# sanitizer builds; extra arguments go to the first ctest, e.g. scripts/test.sh -L unit
# usage: scripts/test.sh [CTEST_ARGUMENTS...]
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FERRY_BUILD_DIR:-build}
jobs=$(nproc)
echo "== build and test ($build)"
bash scripts/build.sh
(cd "$build" && ctest --output-on-failure -j"$jobs" --timeout 300 -LE package "$@")
# The Debian packages of this build, installed on this machine and purged again (root only).
echo "== Debian packages ($build)"
(cd "$build" && ctest --output-on-failure --timeout 300 -L package)
if [ "${FERRY_SANITIZERS:-1}" = 0 ]; then
  echo "sanitizer builds skipped (FERRY_SANITIZERS=0)"
  exit 0
fi
tsan_supp=$PWD/tests/tsan.supp  # races inside uninstrumented libraries, each with its reason
for san in address thread; do
  dir=$build-$san
  echo "== $san sanitizer build and test ($dir)"
  FERRY_BUILD_DIR=$dir FERRY_BUILD_TYPE=Debug bash scripts/build.sh -DFERRY_SANITIZE=$san -DFERRY_CUDA=OFF \
    -DFERRY_FUZZ_SECONDS=5 >/dev/null
  labels="unit|integration"
  [ $san = address ] && labels="unit|integration|fuzz"
  (cd "$dir" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$tsan_supp \
     ctest --output-on-failure -j"$jobs" --timeout 600 -L "$labels" -LE "serial|browser")
done
echo "all builds passed: plain, address+undefined, thread"
