#!/usr/bin/env bash
# Configures and builds ferry into ${FERRY_BUILD_DIR:-build}. Extra arguments go to cmake.
# usage: scripts/build.sh [CMAKE_ARGUMENTS...]   (FERRY_BUILD_TYPE: Release by default)
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FERRY_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${FERRY_BUILD_TYPE:-Release} -DBUILD_TESTING=ON "$@" >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
grep -E "ferry:|HOST BACKEND" "$build.configure.log" | sed 's/^-- //' || true
cmake --build "$build" -j"$(nproc)"
