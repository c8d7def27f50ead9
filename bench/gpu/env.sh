# Sourced by the GPU-session scripts beside it (session.sh, sweep.sh, trace.sh, overlap-cuts.sh):
# moves to the checkout they are in and sets up the build in $BUILD (default build-dev, relative
# to the checkout), its bundled libraries in $BUILD/devlibs if any, and the results folder $OUT
# (default $BUILD/gpu-results). A build configured in another checkout path runs here when
# FERRY_BUILT_AT names that path: it becomes a link to this checkout.
# A script that sources this answers --help (or -h as its first argument) with its header comment.
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
ferry_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ferry_root" || exit 1
BUILD=${BUILD:-build-dev}
OUT=${OUT:-$ferry_root/$BUILD/gpu-results}
mkdir -p "$OUT"
if [ -n "${FERRY_BUILT_AT:-}" ] && [ ! -e "$FERRY_BUILT_AT" ]; then
  mkdir -p "$(dirname "$FERRY_BUILT_AT")" && ln -s "$ferry_root" "$FERRY_BUILT_AT"
fi
export LD_LIBRARY_PATH=$ferry_root/$BUILD/devlibs:${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}

# Starts a ferryd on a fresh runtime directory with a ${POOL:-2GiB} pool and waits until it is ready;
# arguments are extra config lines. FERRYD (default $BUILD/ferryd) is the binary, FERRYD_ENV its
# environment assignments, FERRYD_BACKEND (default cuda) and FERRYD_ARGS its options. Sets rt, pid
# and sock, and prints what ferryd said about its backend and pool.
start_ferryd() {
  rt=$(mktemp -d -t ferry-XXXXXX)
  printf 'runtime_dir: %s\npool:\n  size: %s\n' "$rt" "${POOL:-2GiB}" >"$rt/ferryd.yaml"
  local line
  for line in "$@"; do echo "$line" >>"$rt/ferryd.yaml"; done
  env ${FERRYD_ENV:-} "${FERRYD:-$BUILD/ferryd}" --backend "${FERRYD_BACKEND:-cuda}" --config "$rt/ferryd.yaml" \
    ${FERRYD_ARGS:-} >"$rt/ferryd.log" 2>&1 &
  pid=$!
  # Its socket answers "starting" while the pool is built: its log says when it is ready.
  for _ in $(seq 1200); do grep -q '\[info\] ready' "$rt/ferryd.log" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  sock=$rt/ferryd.sock
  grep -E "backend|cuda:|host: |pool:|pool part|started in" "$rt/ferryd.log"
}
