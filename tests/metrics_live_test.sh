#!/usr/bin/env bash
# Metrics against the real tools: a real ferryd (host backend) under load, scraped by a real
# Prometheus server on loopback. Checks: promtool check metrics on a live scrape is clean; every
# panel query of the shipped Grafana dashboard returns data through Prometheus's HTTP API; the
# shipped rules load; an applied and a refused policy show in the metrics.
# usage: metrics_live_test.sh FERRYD FERRYCTL TEST_CLIENT SOURCE_DIR
set -euo pipefail
ferryd=$1 ferryctl=$2 client=$3 src=$4
for tool in prometheus promtool curl python3; do
  command -v $tool >/dev/null || { echo "FAIL: $tool is not installed (scripts/setup.sh installs it)"; exit 1; }
done
dir=$(mktemp -d /tmp/ferry-metrics-XXXXXX)
cp "$src/policies/chunked.yaml" "$dir/policy.yaml"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$ferryd" --backend host --runtime-dir "$dir" --pool-size 128MiB --slab-size 1MiB --metrics-address 127.0.0.1:0 \
  --policy "$dir/policy.yaml" >"$dir/ferryd.log" 2>&1 &
pids+=($!)
ferryd_pid=$!
for _ in $(seq 200); do grep -q "metrics on" "$dir/ferryd.log" 2>/dev/null && [ -S "$dir/ferryd.sock" ] && break; sleep 0.05; done
url=$(grep -o 'http://[^ ]*/metrics' "$dir/ferryd.log" | head -1)
[ -n "$url" ] || { cat "$dir/ferryd.log"; echo "FAIL: ferryd did not serve metrics"; exit 1; }
target=${url#http://}; target=${target%/metrics}
echo "ferryd metrics at $url"

# Load: copies both ways from two clients, a policy switch and a refused policy file.
( for _ in $(seq 40); do "$client" roundtrip "$dir/ferryd.sock" 3000000 5 >/dev/null || exit 1; done ) &
pids+=($!)
( for _ in $(seq 40); do "$client" roundtrip "$dir/ferryd.sock" 65536 50 >/dev/null || exit 1; done ) &
pids+=($!)
"$ferryctl" --socket "$dir/ferryd.sock" policy apply "$src/policies/geometric.yaml" >/dev/null
# A refused reload (the daemon keeps geometric) and a refused allocation (larger than the pool).
printf 'schedule: {kind: bogus}\n' >"$dir/policy.yaml"
kill -HUP "$ferryd_pid"
if "$client" roundtrip "$dir/ferryd.sock" 1000000000 1 2>/dev/null; then echo "FAIL: 1 GB fit a 128 MiB pool"; exit 1; fi
# The reload runs on ferryd's loader thread and the clients copy meanwhile: scrape until the
# failed reload and the copies of both directions are counted (bounded), then check it all.
for _ in $(seq 200); do
  curl -sf "$url" >"$dir/scrape.txt" && grep -q 'ferry_policy_reloads_total{result="failed"} 1' "$dir/scrape.txt" &&
    grep -q '^ferry_copies_total{.*direction="d2h"' "$dir/scrape.txt" &&
    grep -q '^ferry_exposed_seconds_count{.*direction="h2d".*} [1-9]' "$dir/scrape.txt" && break
  sleep 0.05
done
if ! promtool check metrics <"$dir/scrape.txt" >"$dir/lint.txt" 2>&1; then
  cat "$dir/lint.txt"; echo "FAIL: promtool check metrics"; exit 1
fi
echo "promtool check metrics: clean ($(grep -c '^ferry_' "$dir/scrape.txt") samples)"
for m in ferry_build_info ferry_copies_total ferry_copied_bytes_total ferry_copy_duration_seconds_bucket \
         ferry_exposed_seconds_bucket ferry_copy_queue_seconds_bucket ferry_pool_bytes ferry_clients \
         ferry_in_flight_bytes ferry_queued_bytes ferry_copies_in_flight ferry_policy_info \
         ferry_policy_reloads_total ferry_achieved_bandwidth_bytes_per_second ferry_sleeps_total \
         ferry_buffers_allocated_total \
         ferry_poll_window_seconds; do
  grep -q "^$m" "$dir/scrape.txt" || { echo "FAIL: $m missing from the scrape"; exit 1; }
done
expect() { grep -q "$1" "$dir/scrape.txt" || { grep "${1%%\{*}" "$dir/scrape.txt"; echo "FAIL: no '$1' in the scrape"; exit 1; }; }
expect 'ferry_policy_info{hash="[0-9a-f]*",policy="geometric"} 1'
expect 'ferry_policy_reloads_total{result="ok"} 1'
expect 'ferry_policy_reloads_total{result="failed"} 1'
expect 'ferry_rejected_total{reason="exhausted"} [1-9]'
expect 'ferry_exposed_seconds_count{class="default",direction="h2d",policy="[a-z]*"} [1-9]'

promport=$(free_port)
cat >"$dir/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $src/config/prometheus/ferry-rules.yaml
scrape_configs:
  - job_name: ferry
    static_configs:
      - targets: ["$target"]
YML
promtool check config "$dir/prometheus.yml" >/dev/null
prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
  --web.listen-address="127.0.0.1:$promport" --log.level=warn >"$dir/prometheus.log" 2>&1 &
pids+=($!)
api="http://127.0.0.1:$promport/api/v1"
for _ in $(seq 100); do curl -sf "$api/query?query=up" >/dev/null 2>&1 && break; sleep 0.2; done
# Let it scrape under load for a while (rates need several samples).
sleep 8
python3 - "$api" "$src/config/grafana/ferry-dashboard.json" <<'PY'
import json, sys, urllib.parse, urllib.request
api, dash = sys.argv[1], sys.argv[2]
def query(expr):
    url = api + "/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)
up = query('up{job="ferry"}')["data"]["result"]
assert up and up[0]["value"][1] == "1", f"Prometheus does not scrape ferryd: {up}"
panels = json.load(open(dash))["panels"]
failed = []
for p in panels:
    for t in p["targets"]:
        expr = t["expr"].replace("$__rate_interval", "30s")
        res = query(expr)
        n = len(res["data"]["result"]) if res["status"] == "success" else 0
        print(f"  {'ok  ' if n else 'FAIL'} {n:3d} series  {p['title']}")
        if not n:
            failed.append(p["title"])
rules = json.load(urllib.request.urlopen(api + "/rules"))["data"]["groups"]
nrules = sum(len(g["rules"]) for g in rules)
print(f"  rules loaded by Prometheus: {nrules}")
assert nrules == 9, nrules
if failed:
    sys.exit("FAIL: panels without data: " + ", ".join(failed))
print(f"every one of {len(panels)} dashboard panels returns data")
PY
for p in "${pids[1]}" "${pids[2]}"; do wait "$p" || { echo "FAIL: a load client failed"; exit 1; }; done
echo PASS
