#!/usr/bin/env bash
# The Python package on a GPU machine: builds ferry._ferry there against its own python3 (with
# its pybind11) and $BUILD's libferry, runs the Python GPU tests, then `python -m ferry.bench
# forum` and `overlap`. Writes under $OUT: python-build.log, python-gpu-tests.log, forum.txt,
# forum.csv, forum.svg, overlap.txt.
set -uo pipefail
. "$(dirname "$0")/env.sh"
py=${PYTHON:-python3}
pkg=$BUILD/python
mkdir -p "$pkg/ferry"
cp -r python/ferry/. "$pkg/ferry/"
suffix=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
# shellcheck disable=SC2046
g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden $($py -m pybind11 --includes) -I. -Iinclude -I"$BUILD/generated" \
  python/src/module.cc python/src/py_client.cc -L"$BUILD" -lferry -Wl,-rpath,"$ferry_root/$BUILD" -o "$pkg/ferry/_ferry$suffix" \
  >"$OUT/python-build.log" 2>&1 || { echo "python: extension build failed"; tail -20 "$OUT/python-build.log"; exit 1; }
export PYTHONPATH=$ferry_root/$pkg FERRY_TEST_FERRYD=$ferry_root/$BUILD/ferryd
$py -c 'import ferry, torch; print("ferry", ferry.__version__, "torch", torch.__version__, torch.cuda.get_device_name(0))'
echo "== Python GPU tests"
$py python/tests/run_gpu_tests.py python/tests >"$OUT/python-gpu-tests.log" 2>&1
echo "python GPU tests: exit $?"; tail -3 "$OUT/python-gpu-tests.log"
[ -n "${TESTS_ONLY:-}" ] && exit 0  # the extension and its tests alone
start_ferryd
echo "== python -m ferry.bench forum"
$py -m ferry.bench forum --socket "$sock" --csv "$OUT/forum.csv" --plot "$OUT/forum.svg" \
  ${FORUM_ARGS:-} >"$OUT/forum.txt" 2>"$OUT/forum.err"
echo "forum: exit $?"; cat "$OUT/forum.txt"
echo "== python -m ferry.bench overlap"
$py -m ferry.bench overlap --socket "$sock" ${OVERLAP_ARGS:-} >"$OUT/overlap.txt" 2>"$OUT/overlap.err"
echo "overlap: exit $?"; cat "$OUT/overlap.txt"
kill -TERM "$pid"; wait "$pid"
start_ferryd >/dev/null
echo "== python -m ferry.bench latency"
$py -m ferry.bench latency --socket "$sock" --quiet >"$OUT/latency.txt" 2>&1
echo "latency: exit $?"; cat "$OUT/latency.txt"
kill -TERM "$pid"; wait "$pid"
