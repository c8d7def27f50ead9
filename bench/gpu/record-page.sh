#!/usr/bin/env bash
# The buyer's record on a GPU machine: a ferryd on the GPU writing signed snapshots while the
# overlap benchmark runs through it and signs its report; then each record's environment block
# (NVIDIA driver, CUDA driver and runtime as "13.0", cuBLAS, GPU name and UUID, host id) checked
# against nvidia-smi and against each other, both verified (ferryctl verify, minisign), and the
# pages a buyer opens written with ferryctl report html. Results go to $OUT. Expects a CUDA
# build in $BUILD (default build-dev; see env.sh).
set -uo pipefail
. "$(dirname "$0")/env.sh"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv,noheader | tee "$OUT/record-gpu.txt"
keys=$OUT/record-keys
rm -rf "$keys" "$OUT/record-snaps"; mkdir -p "$keys"
"$BUILD/ferryctl" keygen --dir "$keys" --name node >/dev/null
start_ferryd "snapshots: {dir: $OUT/record-snaps, key: $keys/node.key, interval_seconds: 5}"
"$BUILD/ferryctl" --socket "$sock" bench overlap --quick --report "$OUT/record-overlap.json" --sign-key "$keys/node.key" \
  >"$OUT/record-overlap.txt" 2>&1; echo "bench overlap rc=$?"
sleep 6
kill -TERM $pid; wait $pid
"$BUILD/ferryctl" verify --pub "$keys/node.pub" "$OUT/record-overlap.json" "$OUT/record-snaps"; echo "ferryctl verify rc=$?"
minisign -Vm "$OUT/record-overlap.json" -p "$keys/node.pub" -q && echo "minisign: the report verifies"
for f in "$OUT"/record-snaps/snapshot-*.json; do minisign -Vm "$f" -p "$keys/node.pub" -q || echo "minisign rejects $f"; done
python3 - "$OUT/record-overlap.json" "$OUT/record-gpu.txt" "$OUT"/record-snaps/snapshot-*.json <<'PY'
import json, sys
report, gpu, snaps = sys.argv[1], sys.argv[2], sys.argv[3:]
name, uuid, driver = [x.strip() for x in open(gpu).readline().split(",")]
blocks = {"overlap report": json.load(open(report))["environment"]}
blocks.update({s.rsplit("/", 1)[1]: json.load(open(s))["environment"] for s in snaps})
ok = True
for where, env in blocks.items():
    want = {"chip": name, "gpu_uuid": uuid, "driver": driver}
    for k, v in want.items():
        if env.get(k) != v:
            print(f"MISMATCH {where}: {k} is {env.get(k)!r}, nvidia-smi says {v!r}"); ok = False
    for k in ("driver_cuda", "cuda_runtime"):
        if not (env.get(k, "").count(".") == 1 and env[k].replace(".", "").isdigit()):
            print(f"MISMATCH {where}: {k} is {env.get(k)!r}, not like 13.0"); ok = False
    for k, v in env.items():
        if v in ("unknown", "none") and not env.get(k + "_reason"):
            print(f"MISMATCH {where}: {k} is {v!r} with no {k}_reason"); ok = False
shared = ("chip", "gpu_uuid", "driver", "driver_cuda", "cuda_runtime", "cublas", "host_id")
first = blocks["overlap report"]
for where, env in blocks.items():
    for k in shared:
        if env.get(k) != first.get(k):
            print(f"MISMATCH {where}: {k} {env.get(k)!r} vs the overlap report's {first.get(k)!r}"); ok = False
print("environment blocks:", json.dumps(first))
print("OK: every record names the same environment, as nvidia-smi does" if ok else "FAILED")
PY
"$BUILD/ferryctl" report html "$OUT/record-overlap.json" --pub "$keys/node.pub" -o "$OUT/record-overlap.html"
"$BUILD/ferryctl" report html --chain "$OUT/record-snaps" --pub "$keys/node.pub" -o "$OUT/record-chain.html"
rm -f "$keys/node.key"
echo "pages: $OUT/record-overlap.html $OUT/record-chain.html (open them in a browser)"
