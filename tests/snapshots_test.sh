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
sleep 1.5
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

# A restart continues the chain.
"$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd2.log" 2>&1 &
pid=$!
sleep 1
kill -TERM $pid; wait $pid
"$ctl" verify --pub "$dir/ferry.pub" "$dir/snaps" >"$dir/ok2.txt" || { cat "$dir/ok2.txt"; fail "the chain broke across a restart"; }
grep -q "continuing the chain" "$dir/ferryd2.log" || fail "restart did not continue the chain"
tail -1 "$dir/ok2.txt"

# A secret key others can read is refused.
chmod 640 "$dir/ferry.key"
if "$ferryd" --config "$dir/ferryd.yaml" >"$dir/ferryd3.log" 2>&1; then fail "ferryd used a group-readable key"; fi
grep -q "readable by its owner only" "$dir/ferryd3.log" || { cat "$dir/ferryd3.log"; fail "no clear error for the key mode"; }
echo PASS
