#!/usr/bin/env bash
# The overlap benchmark end to end on the host backend (CI has no GPU): a real ferryd, the
# bench switching through every shipped policy and putting the running one back, the nine
# checks passing, the JSON report signed and verified by the stock minisign, the plot written.
# usage: overlap_test.sh FERRYD FERRYCTL POLICY_DIR
set -uo pipefail
ferryd=$1 ctl=$2 policies=$3
. "$(dirname "$0")/host_ferryd.sh"
need minisign python3
metrics_address=127.0.0.1:0 start_host_ferryd overlap "$ferryd" "policy: $policies/latency-bulk.yaml"
[ -n "$metrics" ] || { cat "$dir/ferryd.log"; fail "no metrics address in ferryd's log"; }
before=$("$ctl" --socket "$sock" policy show | sha256sum)
"$ctl" keygen --dir "$dir" --name bench >/dev/null || fail "keygen"

FERRY_HOST_ID=overlap-test-host "$ctl" --socket "$sock" bench overlap --quick --n 128 --policies "$policies" --report "$dir/report.json" \
  --sign-key "$dir/bench.key" --svg "$dir/plot.svg" --metrics "$metrics" >"$dir/out.txt" 2>"$dir/err.txt" ||
  { cat "$dir/out.txt" "$dir/err.txt"; fail "bench overlap failed"; }
cat "$dir/out.txt"
after=$("$ctl" --socket "$sock" policy show | sha256sum)
[ "$before" = "$after" ] || fail "the policy running before the bench was not put back"

python3 - "$dir/report.json" "$policies" <<'PY' || fail "report"
import json, sys, glob, os
r = json.load(open(sys.argv[1]))
assert r["format"] == "ferry-overlap-report/1", r["format"]
assert r["checks_passed"] is True
# The environment block shared with snapshots and tune reports: on the host engine no GPU
# values, each "none" with its reason, and a host id from the machine id or FERRY_HOST_ID.
env = r["environment"]
assert env["chip"] == "host CPU (no GPU)", env
for k in ("gpu_uuid", "driver", "driver_cuda", "cuda_runtime", "cublas"):
    assert env[k] == "none" and "no GPU" in env[k + "_reason"], (k, env)
assert env["host_id"] == "overlap-test-host" and env["host_id_source"] == "configured", env
assert len(r["checks"]) == 9 and all(c["pass"] for c in r["checks"]), r["checks"]
names = sorted(os.path.basename(p)[:-5] for p in glob.glob(sys.argv[2] + "/*.yaml"))
ferry = [m for m in r["modes"] if m["path"] == "ferryd"]
assert sorted({m["policy"] for m in ferry}) == names, ({m["policy"] for m in ferry}, names)
for m in ferry:
    assert len(m["policy_hash"]) == 16 and m["step_seconds"]["n"] > 0, m
    if m["strategy"] != "copy":
        assert "exposed_seconds" in m and m["step_seconds"]["median"] > 0, m
    # The bench's own exposed time (host clock around its waits) and ferryd's metric of the
    # clients' reports agree: |a - b| <= max(10% of the larger, 0.05 ms) per step.
    e = m["exposed_per_step"]
    a, b = e["bench_seconds"], e["ferryd_metric_seconds"]
    assert e["ferryd_metric_reports"] > 0, m
    if os.environ.get("FERRY_SANITIZED"):
        # A sanitizer stretches every wake-up: the two clocks are read further apart than in a
        # build users run. The figures are printed; the agreement is checked in the plain build.
        if not e["agree"]:
            print("sanitizer build, not checked:", m["name"], a, b)
        continue
    assert abs(a - b) <= max(0.10 * max(a, b), 0.05e-3) and e["agree"], m
assert r["compute_seconds"]["median"] > 0 and r["copy_seconds"] > 0
for k in ("ferry_version", "engine", "daemon_backend", "environment", "workload"):
    assert k in r, k
print("report ok:", len(r["modes"]), "modes,", len(ferry), "through ferryd")
PY
grep -q "<svg" "$dir/plot.svg" || fail "no plot"
[ "$(grep -c '<rect' "$dir/plot.svg")" -ge 10 ] || fail "the plot has too few bars"

minisign -Vm "$dir/report.json" -p "$dir/bench.pub" -q || fail "minisign rejects the signed report"
"$ctl" verify --pub "$dir/bench.pub" "$dir/report.json" || fail "ferryctl verify rejects the signed report"
sed -i 's/"checks_passed": true/"checks_passed": false/' "$dir/report.json"
minisign -Vm "$dir/report.json" -p "$dir/bench.pub" -q 2>/dev/null && fail "minisign accepted a tampered report"
"$ctl" verify --pub "$dir/bench.pub" "$dir/report.json" >/dev/null 2>&1 && fail "ferryctl verify accepted a tampered report"

# In-step blocks on two compute streams: the same checks hold, and the report says so.
"$ctl" --socket "$sock" bench overlap --quick --n 128 --compute-streams 2 --policies "$policies/geometric.yaml" \
  --report "$dir/lanes.json" >"$dir/lanes.txt" 2>&1 || { cat "$dir/lanes.txt"; fail "bench overlap --compute-streams 2 failed"; }
grep -q "on 2 compute streams in turn" "$dir/lanes.txt" || { cat "$dir/lanes.txt"; fail "the text does not name the compute streams"; }
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["checks_passed"] and r["workload"]["compute_streams"] == 2, r["workload"]' \
  "$dir/lanes.json" || fail "the report does not carry the compute streams, or a check failed"
"$ctl" --socket "$sock" bench overlap --quick --n 64 --policies "$policies" --compute-streams 9 >/dev/null 2>"$dir/cs.txt" &&
  fail "--compute-streams 9 was accepted"
grep -q -- "--compute-streams takes 1..8" "$dir/cs.txt" || { cat "$dir/cs.txt"; fail "the --compute-streams error does not say why"; }

# --timeline needs the GPU's clock: on the host engine, a clear error before any step runs.
"$ctl" --socket "$sock" bench overlap --quick --n 64 --policies "$policies" --timeline "$dir/tl.csv" >/dev/null 2>"$dir/tl.txt" &&
  fail "--timeline ran on the host engine"
grep -q "needs the GPU engine" "$dir/tl.txt" || { cat "$dir/tl.txt"; fail "the --timeline error does not say why"; }
[ ! -e "$dir/tl.csv" ] || fail "a failed --timeline run left a file"

# A policy file that does not parse fails the command up front and changes nothing.
printf 'schedule: {kind: nonsense}\n' >"$dir/bad.yaml"
"$ctl" --socket "$sock" bench overlap --quick --n 64 --policies "$dir/bad.yaml" >/dev/null 2>"$dir/bad.txt" &&
  fail "a bad policy file was accepted"
grep -q "bad.yaml:1" "$dir/bad.txt" || { cat "$dir/bad.txt"; fail "the error does not name the file and line"; }
[ "$before" = "$("$ctl" --socket "$sock" policy show | sha256sum)" ] || fail "a failed bench changed the policy"

# bench transfer needs a GPU (and ferry-bench, built with CUDA): without, a clear error, not a hang.
"$ctl" --socket "$sock" bench transfer --quick >"$dir/xfer.txt" 2>&1 && fail "bench transfer ran without a GPU"
grep -Eq "GPU|CUDA" "$dir/xfer.txt" || { cat "$dir/xfer.txt"; fail "bench transfer's error does not say it needs a GPU"; }

kill -TERM $pid; wait $pid || fail "ferryd did not stop cleanly"
grep -q "\[error\]" "$dir/ferryd.log" && { cat "$dir/ferryd.log"; fail "ferryd logged an error"; }
echo "PASS"
