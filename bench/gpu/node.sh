#!/usr/bin/env bash
# A node's figures, one ferryd serving every GPU (devices: all): one `ferry-bench transfer` per
# GPU at once, each against its in-process baseline, and their sum per direction; with more than
# one NUMA node, the in-process baseline again with its pinned memory on the GPU's node and on
# the other one (NUMA cross-traffic). Writes $OUT/node.txt. POOL: the pool (default 8GiB; each
# GPU's part must hold --max-size, 1 GiB).
set -uo pipefail
. "$(dirname "$0")/env.sh"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 1 ] || { echo "node.sh: no GPU"; exit 1; }
POOL=${POOL:-8GiB}
{
  echo "GPUs: $gpus; NUMA: $(lscpu | sed -n 's/^NUMA node(s): *//p') nodes"
  nvidia-smi topo -m 2>/dev/null | head -$((gpus + 1))
  start_ferryd "devices: all"
  benches=()
  for g in $(seq 0 $((gpus - 1))); do
    "$BUILD/ferry-bench" transfer --socket "$sock" --device "$g" --only bandwidth --max-size 1GiB --quick --json \
      >"$OUT/node-gpu$g.json" 2>"$OUT/node-gpu$g.err" &
    benches+=($!)
  done
  wait "${benches[@]}"  # not ferryd, which runs in the background too
  "$BUILD/ferryctl" --socket "$sock" status
  kill -TERM "$pid"; wait "$pid"
  python3 - "$OUT" "$gpus" <<'PY'
import json, sys
out, gpus = sys.argv[1], int(sys.argv[2])
total = {}
for g in range(gpus):
    r = json.load(open(f"{out}/node-gpu{g}.json"))
    for row in r.get("bandwidth", []):
        if row.get("bytes") != 1 << 30:
            continue
        for path in ("in_process_gbps", "ferry_gbps"):
            key = (row["direction"], path[:-5])
            total[key] = total.get(key, 0.0) + row[path]["median"]
        print(f"GPU {g} {row['direction']} 1 GiB: ferry {row['ferry_gbps']['median']:.1f} GB/s "
              f"[{row['ferry_gbps']['min']:.1f}, {row['ferry_gbps']['max']:.1f}], in-process "
              f"{row['in_process_gbps']['median']:.1f} GB/s (median [min, max], all GPUs at once)")
for (d, path), v in sorted(total.items()):
    print(f"all {gpus} GPUs at once, {d}, {path}: {v:.1f} GB/s (sum of medians)")
PY
  if command -v numactl >/dev/null && [ "$(lscpu | sed -n 's/^NUMA node(s): *//p')" -gt 1 ]; then
    for node in $(seq 0 $(($(lscpu | sed -n 's/^NUMA node(s): *//p') - 1))); do
      echo "== GPU 0's in-process baseline, pinned memory on NUMA node $node"
      start_ferryd "devices: [0]"
      numactl --membind="$node" --cpunodebind="$node" "$BUILD/ferry-bench" transfer --socket "$sock" --device 0 \
        --only bandwidth --max-size 1GiB 2>/dev/null | grep -E "^1 GiB"
      kill -TERM "$pid"; wait "$pid"
    done
  fi
} 2>&1 | tee "$OUT/node.txt"
