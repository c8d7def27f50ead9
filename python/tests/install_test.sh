#!/usr/bin/env bash
# `cmake --install` puts a working ferry package beside libferry: install the build into a fresh
# prefix, then import ferry from there (its extension finds libferry by its run path) in a
# process that sees nothing of the build tree, and connect to nothing (ferry.Unavailable).
# Usage: install_test.sh BUILD_DIR PYTHON
set -euo pipefail
build=$1 py=$2
prefix=$(mktemp -d -t ferry-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >"$prefix.log" 2>&1 || { cat "$prefix.log"; exit 1; }
rm -f "$prefix.log"
site=$(find "$prefix" -type d -path '*/dist-packages/ferry' | head -1)
[ -n "$site" ] || { echo "no ferry package under $prefix"; exit 1; }
cd "$prefix"
env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONPATH="$(dirname "$site")" "$py" - "$site" <<'PY'
import sys, ferry
assert ferry.__file__.startswith(sys.argv[1]), ferry.__file__
try:
    ferry.Client("/nonexistent/ferryd.sock", timeout=1.0)
except ferry.Unavailable as e:
    print("installed ferry", ferry.__version__, "imports from", sys.argv[1], "and says:", e)
else:
    raise SystemExit("connected to a socket that does not exist")
PY
