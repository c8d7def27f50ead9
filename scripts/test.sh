#!/usr/bin/env bash
# Builds ferry and runs every test. GPU tests (ctest label "gpu") skip cleanly without a GPU.
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build=${FERRY_BUILD_DIR:-build}
cd "$build"
ctest --output-on-failure -j"$(nproc)" --timeout 300 "$@"
