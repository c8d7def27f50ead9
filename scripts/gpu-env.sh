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
