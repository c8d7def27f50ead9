#!/usr/bin/env bash
# Other cuts of the overlap workload's math on a GPU: ferryctl bench overlap --cut W,... for each
# cut in $CUTS, in-process and through ferryd (chunked, side-stream), printed.
set -u
. "$(dirname "$0")/env.sh"
rt=$(mktemp -d); printf 'runtime_dir: %s\npool:\n  size: 1GiB\nmetrics:\n  address: ""\n' $rt > $rt/y
$BUILD/ferryd --backend cuda --config $rt/y > $rt/log 2>&1 & pid=$!
for _ in $(seq 400); do [ -S $rt/ferryd.sock ] && break; sleep 0.05; done
for cut in ${CUTS:-2048,1024,640,256,128}; do
  echo "== cut $cut"
  $BUILD/ferryctl --socket $rt/ferryd.sock bench overlap --steps 20 --warmup 3 --rounds 2 --cut $cut --policies policies/chunked.yaml,policies/side-stream.yaml 2>/dev/null | grep -E "blocks|^compute \(" | grep -v "^note"
done
kill $pid; wait $pid
