#!/usr/bin/env bash
# The chain page in a real headless Chromium: a real ferryd (host backend) writes signed
# snapshots under load; `ferryctl report html --chain` of them verifies every record and the
# hash chain and draws the chart; with a middle snapshot removed, or an earlier one replayed in
# its place, the page names it.
# usage: report_page_chain_test.sh FERRYD FERRYCTL TEST_CLIENT ARTIFACTS   (exit 77: no chromium or node)
set -uo pipefail
ferryd=$1 ctl=$2 client=$3 artifacts=$4
here=$(cd "$(dirname "$0")" && pwd)
command -v node >/dev/null || { echo "SKIP: node is not installed (scripts/setup.sh installs nodejs)"; exit 77; }
command -v chromium >/dev/null || command -v chromium-browser >/dev/null ||
  { echo "SKIP: chromium is not installed (scripts/setup.sh installs it)"; exit 77; }
source "$here/host_ferryd.sh"
keys=$(mktemp -d /tmp/ferry-chain-keys-XXXXXX)
"$ctl" keygen --dir "$keys" >/dev/null || fail "keygen"
start_host_ferryd chain "$ferryd" "snapshots: {dir: $keys/snaps, key: $keys/ferry.key, interval_seconds: 0.2}"
trap 'kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$dir" "$keys"' EXIT
"$client" roundtrip "$sock" 1000000 20 || fail "load client"
for _ in $(seq 100); do [ "$(ls "$keys"/snaps/snapshot-*.json 2>/dev/null | wc -l)" -ge 5 ] && break; sleep 0.1; done
kill -TERM $pid; wait $pid || fail "ferryd did not stop cleanly"
n=$(ls "$keys"/snaps/snapshot-*.json | wc -l)
[ "$n" -ge 5 ] || fail "only $n snapshots"
"$ctl" verify --pub "$keys/ferry.pub" "$keys/snaps" >/dev/null || fail "ferryctl verify rejects the untouched chain"
mkdir -p "$artifacts"
node "$here/report_page/browser_chain_test.js" "$ctl" "$keys/snaps" "$keys/ferry.pub" "$artifacts"
