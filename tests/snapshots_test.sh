#!/usr/bin/env bash
# Signed snapshots end to end: ferryctl keygen, a real ferryd writing snapshots under load, the
# stock minisign binary and ferryctl verify accepting them, and each tampering rejected.
# usage: snapshots_test.sh FERRYD FERRYCTL TEST_CLIENT
set -uo pipefail
ferryd=$1 ctl=$2 client=$3
command -v minisign >/dev/null || { echo "FAIL: minisign is not installed (scripts/setup.sh installs it)"; exit 1; }
dir=$(mktemp -d /tmp/ferry-snap-XXXXXX)
trap 'kill $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$ctl" keygen --dir "$dir" >"$dir/keygen.txt" || fail "keygen"
[ "$(stat -c %a "$dir/ferry.key")" = 600 ] || fail "secret key mode is $(stat -c %a "$dir/ferry.key"), not 600"
keyid=$(sed -n 's/^key id //p' "$dir/keygen.txt")
grep -q "$keyid" "$dir/ferry.pub" || fail "public key does not carry key id $keyid"
! grep -q "$(sed -n 2p "$dir/ferry.key")" "$dir/keygen.txt" || fail "keygen printed the secret key"
"$ctl" keygen --dir "$dir" >/dev/null 2>&1 && fail "keygen overwrote an existing key"

cat >"$dir/ferryd.yaml" <<YML
runtime_dir: $dir/rt
backend: host
pool: {size: 64MiB, slab: 1MiB}
metrics: {address: ""}
snapshots: {dir: $dir/snaps, key: $dir/ferry.key, interval_seconds: 0.4}
YML
"$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -S "$dir/rt/ferryd.sock" ] && break; sleep 0.05; done
"$client" roundtrip "$dir/rt/ferryd.sock" 2000000 40 || fail "load client"
# Three timed snapshots (then the one written at exit): waited for, since each write's fsyncs take
# longer on a busy disk.
for _ in $(seq 300); do [ "$(ls "$dir"/snaps/snapshot-*.json 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.05; done
kill -TERM $pid; wait $pid || fail "ferryd did not stop cleanly"
grep -q "$(sed -n 2p "$dir/ferry.key")" "$dir/ferryd.log" && fail "ferryd logged its secret key"
n=$(ls "$dir"/snaps/snapshot-*.json | wc -l)
[ "$n" -ge 4 ] || fail "only $n snapshots"
echo "ferryd wrote $n snapshots"

# The stock minisign verifies every record with ferry's public key, no ferry code involved.
for f in "$dir"/snaps/snapshot-*.json; do
  minisign -Vm "$f" -p "$dir/ferry.pub" -q || fail "minisign rejects $f"
done
echo "minisign -V: all $n verified"
"$ctl" verify --pub "$dir/ferry.pub" "$dir/snaps" >"$dir/ok.txt" || { cat "$dir/ok.txt"; fail "ferryctl verify rejects the untouched chain"; }
tail -1 "$dir/ok.txt"
grep -q '"copies": [1-9]' "$dir"/snaps/snapshot-*.json || fail "no snapshot counted the copies"
# Each names its environment as the reports do (common/environment): no GPU values on the host
# backend, each with its reason, and a stable host id that is a hash, not /etc/machine-id.
python3 - "$dir"/snaps/snapshot-*.json <<'PY' || fail "the snapshots' environment block"
import json, sys
ids = set()
for f in sys.argv[1:]:
    r = json.load(open(f))
    assert r["format"] == "ferry-snapshot/3", r["format"]
    env = r["environment"]
    for k in ("driver", "driver_cuda", "cuda_runtime", "cublas"):
        assert env[k] == "none" and "host backend" in env[k + "_reason"], (f, k, env)
    assert env["chip"] == "host" and env["gpu_uuid"] == "host-gpu-0", env
    try:
        machine_id = open("/etc/machine-id").read().strip()
    except OSError:
        machine_id = ""
    if machine_id:
        assert len(env["host_id"]) == 32 and env["host_id"] not in machine_id, env
    else:
        assert env["host_id"] == "unknown" and env["host_id_reason"], env
    ids.add(env["host_id"])
assert len(ids) == 1, ids
PY

# Each tampering must fail, with the reason, in ferryctl verify (and in minisign where it applies).
expect_fail() {  # what, expected-reason, ferryctl-args...
  local what=$1 reason=$2; shift 2
  local out
  if out=$("$ctl" verify --pub "$@" 2>&1); then fail "$what: ferryctl verify accepted it"; fi
  echo "$out" | grep -q "$reason" || fail "$what: expected '$reason', got: $out"
  echo "$out" | grep -q "^verified" && fail "$what: printed records as verified"
  echo "rejected ($what): $(echo "$out" | head -1)"
}
t="$dir/t"
reset() { rm -rf "$t"; cp -r "$dir/snaps" "$t"; }

reset; sed -i 's/"copies": /"copies": 1/' "$t/snapshot-000002.json"
expect_fail "a changed byte in a record" "signature does not match" "$dir/ferry.pub" "$t"
minisign -Vm "$t/snapshot-000002.json" -p "$dir/ferry.pub" -q 2>/dev/null && fail "minisign accepted a changed record"

reset; sed -i '3s/seq 3/seq 9/' "$t/snapshot-000003.json.minisig"
expect_fail "a changed trusted comment" "trusted comment was changed" "$dir/ferry.pub" "$t"
minisign -Vm "$t/snapshot-000003.json" -p "$dir/ferry.pub" -q 2>/dev/null && fail "minisign accepted a changed trusted comment"

mkdir -p "$dir/other"; "$ctl" keygen --dir "$dir/other" >/dev/null
reset; expect_fail "the wrong public key" "not with the given key" "$dir/other/ferry.pub" "$t"
minisign -Vm "$t/snapshot-000001.json" -p "$dir/other/ferry.pub" -q 2>/dev/null && fail "minisign accepted the wrong key"

reset; rm "$t/snapshot-000002.json" "$t/snapshot-000002.json.minisig"
expect_fail "a missing record" "missing" "$dir/ferry.pub" "$t"

reset; expect_fail "records out of order" "out of order" "$dir/ferry.pub" "$t/snapshot-000001.json" "$t/snapshot-000003.json" "$t/snapshot-000002.json"

reset; expect_fail "a replayed record" "replayed" "$dir/ferry.pub" "$t/snapshot-000001.json" "$t/snapshot-000002.json" "$t/snapshot-000002.json"

reset; rm "$t/snapshot-000003.json.minisig"
expect_fail "a record without its signature" "no signature" "$dir/ferry.pub" "$t"

# What a directory holds beside ferryd's records: a copy under a name ferryd never gives fails
# (it was a replay before names were checked); a record that is a link (it could point at any
# file) or a FIFO (an open would wait for a writer) is refused, not read.
reset; cp "$t/snapshot-000003.json" "$t/snapshot-3.json"
expect_fail "a record under another name" "snapshot-3.json is not a name ferryd gives a snapshot" "$dir/ferry.pub" "$t"
reset; mv "$t/snapshot-000003.json" "$t/real3"; ln -s real3 "$t/snapshot-000003.json"
expect_fail "a record that is a symlink" "snapshot-000003.json is a symbolic link" "$dir/ferry.pub" "$t"
reset; rm "$t/snapshot-000003.json"; mkfifo "$t/snapshot-000003.json"
out=$(timeout 10 "$ctl" verify --pub "$dir/ferry.pub" "$t" 2>&1); rc=$?
[ $rc != 0 ] && [ $rc != 124 ] || fail "a FIFO in place of a record: verify rc=$rc (124: it waited on the FIFO): $out"
echo "$out" | grep -q "snapshot-000003.json is a FIFO, not a regular file" || fail "a FIFO in place of a record: $out"
echo "rejected (a FIFO in place of a record): $out"

# Deletions at either end: the first record is missing unless told where the chain starts; the
# last is noticed against the newest record ferryd announced.
last=$(ls "$dir"/snaps/snapshot-*.json | sed 's/.*snapshot-0*\([0-9]*\)\.json/\1/' | sort -n | tail -1)
last_id=$(sed -n 's/^trusted comment: ferry snapshot \(FRY-[^ ]*\) seq .*/\1/p' "$(printf '%s/snaps/snapshot-%06d.json.minisig' "$dir" "$last")")
[ -n "$last_id" ] || fail "no record id for the last record $last"
"$ctl" verify --pub "$dir/ferry.pub" --expect-latest "$last:$last_id" "$dir/snaps" >/dev/null || fail "--expect-latest rejects the untouched chain"
reset; rm "$(printf '%s/snapshot-%06d.json' "$t" "$last")"
expect_fail "the last record deleted" "expected latest record" "$dir/ferry.pub" --expect-latest "$last:$last_id" "$t"
expect_fail "the last record deleted (same sequence, other id)" "not the expected" "$dir/ferry.pub" --expect-latest "$((last - 1)):FRY-00000-00000-00000-00000" "$t"
reset; rm "$t/snapshot-000001.json" "$t/snapshot-000001.json.minisig"
expect_fail "the first record deleted" "not the head of its chain" "$dir/ferry.pub" "$t"
"$ctl" verify --pub "$dir/ferry.pub" --from-seq 2 "$t" >/dev/null || fail "--from-seq 2 rejects a chain whose first record was removed on purpose"
expect_fail "--from-seq that does not match" "as --from-seq says" "$dir/ferry.pub" --from-seq 1 "$t"

# While ferryd runs: it announces its newest record, and a secret key made readable by others
# stops the signing (an error that says what to do, a metric) but not the copies.
sed -i 's/^metrics: .*/metrics: {address: "127.0.0.1:0"}/' "$dir/ferryd.yaml"
"$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd4.log" 2>&1 &
pid=$!
for _ in $(seq 200); do grep -q "metrics on http" "$dir/ferryd4.log" && break; sleep 0.05; done
url=$(sed -n 's/.*metrics on \(http[^ ]*\).*/\1/p' "$dir/ferryd4.log")
[ -n "$url" ] || { cat "$dir/ferryd4.log"; fail "no metrics address in the log"; }
scrape() { python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$url"; }
for _ in $(seq 100); do scrape 2>/dev/null | grep -q '^ferry_snapshot_latest_info{' && break; sleep 0.1; done
m=$(scrape)
seq_now=$(echo "$m" | sed -n 's/^ferry_snapshot_latest_sequence \([0-9]*\).*/\1/p')
id_now=$(echo "$m" | sed -n 's/^ferry_snapshot_latest_info{.*record_id="\(FRY-[^"]*\)".*/\1/p')
[ -n "$seq_now" ] && [ -n "$id_now" ] || { echo "$m" | grep snapshot; fail "no latest snapshot metrics"; }
"$ctl" verify --pub "$dir/ferry.pub" --expect-latest "$seq_now:$id_now" "$dir/snaps" >/dev/null ||
  fail "verify --expect-latest rejects the record ferryd announced ($seq_now:$id_now)"
echo "ferryd announced record $seq_now $id_now; verify --expect-latest accepts it"
chmod 644 "$dir/ferry.key"
for _ in $(seq 100); do grep -q "others can read the secret key" "$dir/ferryd4.log" && break; sleep 0.1; done
grep -q "others can read the secret key.*chmod 600" "$dir/ferryd4.log" || { cat "$dir/ferryd4.log"; fail "no error for the key made readable"; }
counted=0
for _ in $(seq 100); do
  scrape 2>/dev/null | grep -Eq '^ferry_snapshot_failures_total\{reason="key_permissions"\} [1-9]' && { counted=1; break; }
  sleep 0.1
done
[ $counted = 1 ] || { scrape | grep snapshot_failures; fail "key refusals not counted"; }
"$client" roundtrip "$dir/rt/ferryd.sock" 1000000 5 || fail "copies stopped with the key refused"
n_before=$(ls "$dir"/snaps/snapshot-*.json | wc -l)
sleep 1
[ "$(ls "$dir"/snaps/snapshot-*.json | wc -l)" = "$n_before" ] || fail "ferryd signed with a key others can read"
chmod 600 "$dir/ferry.key"
kill -TERM $pid; wait $pid
echo "key readable by others: signing refused and counted, copies served"

# A restart continues the chain.
"$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd2.log" 2>&1 &
pid=$!
# Ready, not a fixed second: a SIGTERM while the pool is built ends the start before any record.
for _ in $(seq 400); do grep -q '\[info\] ready' "$dir/ferryd2.log" && break; sleep 0.05; done
kill -TERM $pid; wait $pid
"$ctl" verify --pub "$dir/ferry.pub" "$dir/snaps" >"$dir/ok2.txt" || { cat "$dir/ok2.txt"; fail "the chain broke across a restart"; }
grep -q "continuing the chain" "$dir/ferryd2.log" || fail "restart did not continue the chain"
tail -1 "$dir/ok2.txt"

# A planted high-numbered file is not the chain's tail: ferryd says so and starts a new chain.
echo '{"seq": 999999}' >"$dir/snaps/snapshot-999999.json"
"$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd5.log" 2>&1 &
pid=$!
# Ready, not a fixed second: a SIGTERM while the pool is built ends the start before any record.
for _ in $(seq 400); do grep -q '\[info\] ready' "$dir/ferryd5.log" && break; sleep 0.05; done
kill -TERM $pid; wait $pid
grep -q "not continuing the chain.*snapshot-999999.json does not verify" "$dir/ferryd5.log" || { cat "$dir/ferryd5.log"; fail "no warning about the planted file"; }
grep -q '"previous_chain_broken": "snapshot-999999.json' "$dir/snaps/snapshot-1000000.json" || fail "the new chain does not say why"
grep -q "\"prev_sha256\": \"$(printf '0%.0s' $(seq 64))\"" "$dir/snaps/snapshot-1000000.json" || fail "the new chain continues the planted file"
expect_fail "a planted record" "snapshot-999999.json" "$dir/ferry.pub" "$dir/snaps"
rm "$dir/snaps/snapshot-999999.json"
"$ctl" verify --pub "$dir/ferry.pub" "$dir/snaps" >"$dir/ok3.txt" 2>&1 || { cat "$dir/ok3.txt"; fail "the old and the new chain do not verify"; }
grep -q "a new chain" "$dir/ok3.txt" || fail "verify does not say a new chain started"
echo "planted file: new chain at 1000000, the old one intact"

# A secret key others can read is refused.
chmod 640 "$dir/ferry.key"
if "$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd3.log" 2>&1; then fail "ferryd used a group-readable key"; fi
grep -q "readable by its owner only" "$dir/ferryd3.log" || { cat "$dir/ferryd3.log"; fail "no clear error for the key mode"; }
echo PASS
