#!/usr/bin/env bash
# ferryctl report html as a command, no browser: the page it writes holds the record, signature
# and key byte for byte with a policy that fetches nothing; a record that does not verify
# against --pub, a missing signature, a file that is not a key and wrong arguments are refused
# with the reason and write nothing.
# usage: report_html_cli_test.sh FERRYCTL SOURCE_DIR
set -uo pipefail
ctl=$1 src=$2
m=$src/docs/measurements
dir=$(mktemp -d /tmp/ferry-report-html-XXXXXX)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
refused() {  # what, expected text, args...
  local what=$1 want=$2 out; shift 2
  if out=$("$ctl" report html "$@" -o "$dir/refused.html" 2>&1); then fail "$what: accepted"; fi
  echo "$out" | grep -qF -- "$want" || fail "$what: expected '$want', got: $out"
  [ ! -e "$dir/refused.html" ] || fail "$what: wrote a page"
  echo "refused ($what): $out"
}

"$ctl" report html --help | grep -q "^usage: ferryctl report html" || fail "--help"
out=$("$ctl" report html "$m/h200-overlap-2026-12-03.json" --pub "$m/h200-overlap-2026-12-03.pub" -o "$dir/p.html") ||
  fail "the genuine report"
echo "$out" | grep -q "verified by key C5EECC22AF91BEFE" || fail "said: $out"
python3 - "$dir/p.html" "$m/h200-overlap-2026-12-03" <<'PY' || fail "the page"
import base64, json, re, sys
html = open(sys.argv[1]).read()
base = sys.argv[2]
data = json.loads(re.search(r'<script type="application/json" id="ferry-data">(.*?)</script>', html, re.S).group(1))
rec = data["records"][0]
assert base64.b64decode(rec["data_b64"]) == open(base + ".json", "rb").read()
assert base64.b64decode(rec["sig_b64"]) == open(base + ".json.minisig", "rb").read()
assert base64.b64decode(data["pub_b64"]) == open(base + ".pub", "rb").read()
csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', html).group(1)
assert "default-src 'none'" in csp and "connect-src 'none'" in csp and "unsafe" not in csp, csp
assert html.count("<script") == 2 and not re.search(r'\s(src|href)\s*=', html, re.I), "an external resource"
PY
refused "another key" "signed with key C5EECC22AF91BEFE, not with the given key 075CBEA50F44E75E" \
  "$m/h200-overlap-2026-12-03.json" --pub "$m/h200-tune-2026-12-02.pub"
cp "$m/h200-overlap-2026-12-03.json" "$dir/r.json"
cp "$m/h200-overlap-2026-12-03.json.minisig" "$dir/r.json.minisig"
sed -i 's/"steps": 30/"steps": 31/' "$dir/r.json"
refused "a changed byte" "signature does not match the content" "$dir/r.json" --pub "$m/h200-overlap-2026-12-03.pub"
out=$("$ctl" report html "$dir/r.json" --pub "$m/h200-overlap-2026-12-03.pub" --allow-unverified -o "$dir/u.html" 2>&1) ||
  fail "--allow-unverified: $out"
echo "$out" | grep -q "NOT verified by key" || fail "--allow-unverified said: $out"
rm "$dir/r.json.minisig"
refused "no signature" "no signature beside the record" "$dir/r.json"
refused "not a key" "not a public key file" "$m/h200-overlap-2026-12-03.json" --pub "$m/h200-overlap-2026-12-03.json"
refused "no record" "give a record FILE.json or --chain DIR"
refused "a record and a chain" "give a record FILE.json or --chain DIR" "$m/h200-overlap-2026-12-03.json" --chain "$dir"
refused "an empty chain" "no snapshot records (snapshot-NNNNNN.json)" --chain "$dir"
# A chain's page is published: a record in DIR that is a link (to a secret key, say) is never
# read into it, and a name like a snapshot's that ferryd never gives is refused.
mkdir "$dir/chain"
printf 'secret\n' >"$dir/secret.key"
ln -s "$dir/secret.key" "$dir/chain/snapshot-000001.json"
cp "$m/h200-overlap-2026-12-03.json.minisig" "$dir/chain/snapshot-000001.json.minisig"
refused "a record that is a link" "snapshot-000001.json is a symbolic link" --chain "$dir/chain"
rm "$dir/chain/snapshot-000001.json"*
touch "$dir/chain/snapshot-1.json"
refused "a name ferryd never gives" "snapshot-1.json is not a name ferryd gives a snapshot" --chain "$dir/chain"
refused "two records" "one record at a time" "$m/h200-overlap-2026-12-03.json" "$m/h200-tune-2026-12-02.json"
echo "OK"
