#!/usr/bin/env bash
# Configures and builds ferry into ${FERRY_BUILD_DIR:-build}. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FERRY_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${FERRY_BUILD_TYPE:-Release} -DBUILD_TESTING=ON "$@" >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
grep -E "ferry:|HOST BACKEND" "$build.configure.log" | sed 's/^-- //' || true
cmake --build "$build" -j"$(nproc)"
