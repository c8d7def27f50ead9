#!/usr/bin/env bash
# ferryctl tune end to end on the host backend, on its small grid: a tuned policy that ferryd
# accepts, a signed report the stock minisign verifies, the running policy left alone, and on
# the next run, what changed in the environment since the last tune and in the settings.
# usage: tune_test.sh FERRYD FERRYCTL
set -uo pipefail
ferryd=$1 ctl=$2
. "$(dirname "$0")/host_ferryd.sh"
need minisign python3
start_host_ferryd tune "$ferryd"
"$ctl" keygen --dir "$dir" --name tune >/dev/null || fail "keygen"
before=$("$ctl" --socket "$sock" policy show | sha256sum)

"$ctl" --socket "$sock" tune --quick --max-pairs 4 --n 64 --out "$dir/tuned.yaml" --sign-key "$dir/tune.key" >"$dir/1.txt" 2>"$dir/1.err" ||
  { cat "$dir/1.txt" "$dir/1.err"; fail "first tune"; }
cat "$dir/1.txt"
grep -q "no earlier tune" "$dir/1.txt" || fail "the first tune should say there is nothing to compare with"
grep -q "^noise floor, the start against itself: " "$dir/1.txt" || fail "no noise floor printed"
grep -q "^tune time: " "$dir/1.txt" || fail "no tune time printed"
grep -q "^\[" "$dir/1.err" || fail "no progress shown"
[ "$before" = "$("$ctl" --socket "$sock" policy show | sha256sum)" ] || fail "tune changed the running policy"
"$ctl" --socket "$sock" policy apply --dry-run "$dir/tuned.yaml" | grep -q "is valid" || fail "ferryd refuses the tuned policy"
minisign -Vm "$dir/tuned.yaml.tune.json" -p "$dir/tune.pub" -q || fail "minisign rejects the tune report"
"$ctl" verify --pub "$dir/tune.pub" "$dir/tuned.yaml.tune.json" >/dev/null || fail "ferryctl verify rejects the tune report"
python3 - "$dir/tuned.yaml.tune.json" <<'PY' || fail "report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["format"] == "ferry-tune-report/2"
assert r["previous"] is None and r["environment_changes"] == []
assert len(r["candidates"]) >= 5, len(r["candidates"])
assert all(c["checks_passed"] for c in r["candidates"]), "a candidate failed its checks on the host"
for k in ("chip", "driver", "cuda_runtime", "cublas", "ferry"):
    assert k in r["environment"], k
# Every comparison: its pairs, the difference inside its interval, a verdict with its reason.
for c in [r["noise_floor"]] + r["candidates"]:
    ab = c["ab"]
    assert ab["pairs"] == len(ab["scores"]) >= 4 and ab["interval"][0] <= ab["difference"] <= ab["interval"][1], ab
    assert ab["verdict"] in ("better", "worse", "unchanged", "not worth changing") and ab["reason"].startswith(ab["verdict"]), ab
    assert c["verdict"] == ab["verdict"] or c["verdict"].startswith(("better: kept", "rejected")), c["verdict"]
# Only changes that passed are settings changes.
assert sorted(k["change"] for k in r["kept_changes"]) == sorted(c["change"] for c in r["candidates"] if c["kept"])
assert all(c["ab"]["verdict"] == "better" for c in r["candidates"] if c["kept"])
assert r["rule"]["min_effect"] == 0.05 and r["rule"]["looks"] == [4], r["rule"]
assert r["tune_seconds"] > 0 and r["overlap_runs"] >= 4 * (1 + len(r["candidates"]))
dims = {c["label"].split(":")[0] for c in r["candidates"]}
assert {"schedule", "streams", "batching", "priority"} <= dims, dims
PY

# Pretend the last tune ran on another driver and an older ferry, with other settings: the
# next run must name both kinds of change, old and new.
python3 - "$dir/tuned.yaml.tune.json" "$dir/old.yaml" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r["environment"]["driver"] = "570.86.15"
r["environment"]["ferry"] = "0.0.1"
r["policy_yaml"] = r["policy_yaml"].replace("threshold: ", "threshold: 2MiB #")
json.dump(r, open(sys.argv[1], "w"))
open(sys.argv[2], "w").write(r["policy_yaml"])
PY
"$ctl" --socket "$sock" tune --quick --max-pairs 4 --n 64 --out "$dir/tuned.yaml" --json >"$dir/2.json" 2>"$dir/2.err" ||
  { cat "$dir/2.err"; fail "second tune"; }
old_hash=$("$ctl" policy show "$dir/old.yaml" | sed -n 's/^# hash //p')
"$ctl" policy diff "$dir/old.yaml" "$dir/tuned.yaml" | grep -v "^name:" | grep -v "^no differences" >"$dir/diff.txt"
python3 - "$dir/2.json" "$old_hash" "$dir/diff.txt" <<'PY' || fail "second report"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["previous"] is not None
ch = r["environment_changes"]
assert "driver: 570.86.15 -> none" in ch and any(c.startswith("ferry: 0.0.1 -> ") for c in ch), ch
assert r["previous_tuned"]["policy_hash"] == sys.argv[2], "the last tune's policy was not measured again"
assert r["previous_tuned"]["checks_passed"]
want = [l.strip() for l in open(sys.argv[3]) if l.strip()]
assert sorted(r["setting_changes"]) == sorted(want), (r["setting_changes"], want)
print("second tune: environment", ch, "settings", r["setting_changes"])
PY
printf 'schedule: [oops\n' >"$dir/bad.yaml"
"$ctl" --socket "$sock" tune --quick --start "$dir/bad.yaml" --out "$dir/x.yaml" >/dev/null 2>"$dir/bad.err" && fail "a bad start policy was accepted"
grep -q "bad.yaml:" "$dir/bad.err" || { cat "$dir/bad.err"; fail "the error does not name the file"; }
kill -TERM $pid; wait $pid || fail "ferryd did not stop cleanly"
grep -q "\[error\]" "$dir/ferryd.log" && { cat "$dir/ferryd.log"; fail "ferryd logged an error"; }
echo PASS
