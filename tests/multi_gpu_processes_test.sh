#!/usr/bin/env bash
# One ferryd serving two simulated GPUs on two simulated NUMA nodes (host backend), real client
# processes copying to both at once, every byte checked by the clients; then ferryctl status
# --json and the metrics count each GPU's bytes apart, exactly.
# usage: multi_gpu_processes_test.sh FERRYD FERRYCTL TEST_CLIENT
set -euo pipefail
ferryd=$1 ferryctl=$2 client=$3
dir=$(mktemp -d /tmp/ferry-multigpu-XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
# GPU 0 runs its own schedule (an override): its 1 MB copies go in 256 KiB chunks.
cat >"$dir/policy.yaml" <<'YAML'
name: node
schedule: {kind: chunked, chunk_size: 64MiB}
gpus:
  - match: [0]
    schedule: {kind: chunked, chunk_size: 256KiB}
YAML
cat >"$dir/ferryd.yaml" <<YAML
runtime_dir: $dir
policy: $dir/policy.yaml
backend: host
host: {gpus: 2, numa_nodes: 2}
devices: all
pool: {size: 128MiB, slab: 1MiB}
metrics: {address: "127.0.0.1:0"}
YAML
"$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q "ready" "$dir/ferryd.log" 2>/dev/null && break; sleep 0.05; done
grep -q "ready" "$dir/ferryd.log" || { cat "$dir/ferryd.log"; echo "FAIL: ferryd did not start"; exit 1; }
grep -q "devices: all (2 GPUs)" "$dir/ferryd.log" || { cat "$dir/ferryd.log"; echo "FAIL: ferryd does not say it serves 2 GPUs"; exit 1; }
grep -q "policy node: host-gpu-0 (0) run its override for GPU 0: schedule.chunk_size: 64MiB -> 256KiB" "$dir/ferryd.log" ||
  { cat "$dir/ferryd.log"; echo "FAIL: ferryd does not say GPU 0 runs its override"; exit 1; }
url=$(grep -o 'http://[^ ]*/metrics' "$dir/ferryd.log" | head -1)

# Three clients on each GPU at once: GPU 0 gets 3 x 20 round trips of 1 MB, GPU 1 3 x 30 of 300 kB.
cpids=()
for _ in 1 2 3; do
  "$client" roundtrip "$dir/ferryd.sock" 1000000 20 --device 0 & cpids+=($!)
  "$client" roundtrip "$dir/ferryd.sock" 300000 30 --device 1 & cpids+=($!)
done
for p in "${cpids[@]}"; do wait "$p" || { cat "$dir/ferryd.log"; echo "FAIL: a client failed (bytes differ or an error)"; exit 1; }; done
want0=$((3 * 20 * 1000000)) want1=$((3 * 30 * 300000))

# A client naming a GPU this ferryd does not have is refused at connect, saying so.
if "$client" roundtrip "$dir/ferryd.sock" 4096 1 --device 2 2>"$dir/refused"; then echo "FAIL: GPU 2 accepted"; exit 1; fi
grep -q "host-gpu-2 is not one this ferryd serves" "$dir/refused" || { cat "$dir/refused"; echo "FAIL: unclear refusal"; exit 1; }

"$ferryctl" --socket "$dir/ferryd.sock" status --json >"$dir/status.json"
"$ferryctl" --socket "$dir/ferryd.sock" status >"$dir/status.txt"
python3 - "$dir/status.json" "$want0" "$want1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
want = [int(sys.argv[2]), int(sys.argv[3])]
gpus = s["gpus"]
assert len(gpus) == 2, gpus
for i, g in enumerate(gpus):
    assert g["uuid"] == f"host-gpu-{i}", g
    assert g["numa_node"] == i, g
    assert g["bytes_h2d"] == want[i] and g["bytes_d2h"] == want[i], (i, g, want[i])
    assert g["pool_bytes"] == 64 << 20, g  # its NUMA node's half of the pool
assert s["bytes_h2d"] == sum(want), s
print("status:", [(g["uuid"], g["bytes_h2d"], g["copies_completed"]) for g in gpus])
PY
grep -q "\[1\] host-gpu-1" "$dir/status.txt" || { cat "$dir/status.txt"; echo "FAIL: status text lacks GPU 1"; exit 1; }

curl -sf "$url" >"$dir/metrics"
for i in 0 1; do
  want=$([ $i = 0 ] && echo $want0 || echo $want1)
  got=$(awk -v g="host-gpu-$i" '$1 == "ferry_gpu_copied_bytes_total{gpu_uuid=\"" g "\",direction=\"h2d\"}" {printf "%.0f", $2}' "$dir/metrics")
  [ "$got" = "$want" ] || { grep ferry_gpu_ "$dir/metrics"; echo "FAIL: GPU $i h2d bytes in metrics: $got, want $want"; exit 1; }
  grep -q "ferry_gpu_info{gpu_uuid=\"host-gpu-$i\".*numa_node=\"$i\"" "$dir/metrics" || { grep ferry_gpu_info "$dir/metrics"; echo "FAIL: ferry_gpu_info"; exit 1; }
done
for i in 0 1; do
  grep -q "ferry_pool_part_bytes{part=\"$i\",numa_node=\"$i\",state=\"size\"} 67108864" "$dir/metrics" ||
    { grep ferry_pool_part "$dir/metrics"; echo "FAIL: pool part $i in metrics"; exit 1; }
  grep -q "pool part $i (NUMA node $i; host-gpu-$i): 64 MiB" "$dir/ferryd.log" || { cat "$dir/ferryd.log"; echo "FAIL: log of part $i"; exit 1; }
done
if command -v promtool >/dev/null; then promtool check metrics <"$dir/metrics"; fi
# A policy whose override names no GPU here is applied, and ferryd says its override is idle.
printf 'name: elsewhere\ngpus: [{match: 7, limits: {in_flight_bytes: 32MiB}}]\n' >"$dir/elsewhere.yaml"
"$ferryctl" --socket "$dir/ferryd.sock" policy apply "$dir/elsewhere.yaml" >/dev/null
"$ferryctl" --socket "$dir/ferryd.sock" policy show | grep -q "gpus.000.match: 7" || { echo "FAIL: policy show lacks the override"; exit 1; }
for _ in $(seq 100); do grep -q "override for GPU 7 names no GPU" "$dir/ferryd.log" && break; sleep 0.05; done
grep -q "policy elsewhere: the override for GPU 7 names no GPU this ferryd serves" "$dir/ferryd.log" ||
  { cat "$dir/ferryd.log"; echo "FAIL: an override for no GPU here went unsaid"; exit 1; }
echo "PASS: two simulated GPUs served at once, $want0 and $want1 bytes each way, counted apart"
