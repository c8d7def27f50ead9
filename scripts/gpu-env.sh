# Sourced by the scripts that run on a lent GPU machine (gpu-session.sh, gpu-sweep.sh): the build
# made elsewhere in $BUILD (default build-dev) with its libraries bundled in $BUILD/devlibs, the
# results folder $OUT, and a link at $FERRY_BUILT_AT (default /work/main) for the absolute paths
# baked into the build.
BUILD=${BUILD:-build-dev}
OUT=${OUT:-/tmp/ferry-out}
mkdir -p "$OUT"
built_at=${FERRY_BUILT_AT:-/work/main}
if [ ! -e "$built_at" ]; then mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; fi
export LD_LIBRARY_PATH=$PWD/$BUILD/devlibs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

# Starts a ferryd on a fresh runtime directory with a ${POOL:-2GiB} pool and waits for its socket;
# arguments are extra config lines. FERRYD (default $BUILD/ferryd) is the binary, FERRYD_ENV its
# environment assignments, FERRYD_BACKEND (default cuda) and FERRYD_ARGS its options. Sets rt, pid
# and sock, and prints what ferryd said about its backend and pool.
start_ferryd() {
  rt=$(mktemp -d /tmp/ferry-XXXXXX)
  printf 'runtime_dir: %s\npool:\n  size: %s\n' "$rt" "${POOL:-2GiB}" >"$rt/ferryd.yaml"
  local line
  for line in "$@"; do echo "$line" >>"$rt/ferryd.yaml"; done
  env ${FERRYD_ENV:-} "${FERRYD:-$BUILD/ferryd}" --backend "${FERRYD_BACKEND:-cuda}" --config "$rt/ferryd.yaml" \
    ${FERRYD_ARGS:-} >"$rt/ferryd.log" 2>&1 &
  pid=$!
  for _ in $(seq 400); do [ -S "$rt/ferryd.sock" ] && break; sleep 0.05; done
  sock=$rt/ferryd.sock
  grep -E "backend|cuda:|host \(|pool:" "$rt/ferryd.log"
}
