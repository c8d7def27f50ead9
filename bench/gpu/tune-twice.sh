#!/usr/bin/env bash
# Re-tuning as an operator would, on one GPU: two full `ferryctl tune` runs with the same --out,
# the second starting from the first's policy and comparing against its signed report. Prints
# each run's noise floor, every comparison's verdict with its difference and interval, the
# settings changed, and the tune time; keeps the texts, reports and signatures under $OUT
# (tune-twice-1.*, tune-twice-2.*, tune-twice.pub).
#
# Budget: a full tune from the default policy is the noise floor and 10 candidates (schedule 5,
# streams 2, batching 2, priority 1), each at most MAX_PAIRS (default 16) pairs, a pair one
# overlap run at n = 4096 holding both policies (3 warm-up and 12 timed steps a mode, one round);
# an obvious verdict stops at 4 pairs. A candidate the rule keeps adds 4 pairs of 64 MiB copies.
# At most 11 x 16 = 176 overlap runs a tune; each tune is stopped after TUNE_TIMEOUT (230) s, so
# the script ends within 8 minutes.
#   bash bench/gpu/tune-twice.sh                    (BUILD=build-dev, OUT=$BUILD/gpu-results)
#   MAX_PAIRS=8 bash bench/gpu/tune-twice.sh        (a shorter budget)
set -uo pipefail
. "$(dirname "$0")/env.sh"
start_ferryd
ctl="$BUILD/ferryctl --socket $sock"
"$BUILD/ferryctl" keygen --dir "$rt" --name tune >/dev/null && cp "$rt/tune.pub" "$OUT/tune-twice.pub"
out=$OUT/tune-twice.yaml
rm -f "$out" "$out.tune.json" "$out.tune.json.minisig"
for run in 1 2; do
  echo "== tune $run of 2 (--out $out)"
  t0=$(date +%s%N)
  timeout "${TUNE_TIMEOUT:-230}" $ctl tune --out "$out" --sign-key "$rt/tune.key" --max-pairs "${MAX_PAIRS:-16}" \
    >"$OUT/tune-twice-$run.txt" 2>"$OUT/tune-twice-$run.err"
  rc=$?
  cat "$OUT/tune-twice-$run.txt"
  echo "tune $run: rc=$rc, wall $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  [ $rc = 0 ] || { tail -5 "$OUT/tune-twice-$run.err"; break; }
  cp "$out.tune.json" "$OUT/tune-twice-$run.json" && cp "$out.tune.json.minisig" "$OUT/tune-twice-$run.json.minisig"
  "$BUILD/ferryctl" verify --pub "$OUT/tune-twice.pub" "$OUT/tune-twice-$run.json" | tail -1
done
echo "== verdicts"
python3 - "$OUT"/tune-twice-[12].json <<'PY'
import json, sys
for f in sys.argv[1:]:
    r = json.load(open(f))
    nf = r["noise_floor"]["ab"]
    print(f"{f}: tune {r['tune_seconds']:.0f} s, {r['overlap_runs']} overlap runs; environment changes {r['environment_changes']}")
    print(f"  noise floor {nf['difference']*100:+.1f}% [{nf['interval'][0]*100:+.1f}%, {nf['interval'][1]*100:+.1f}%]"
          f" over {nf['pairs']} pairs, pair sd {nf['pair_sd']*100:.1f}%")
    for c in r["candidates"]:
        ab = c["ab"]
        print(f"  {c['label']:<48} {ab['difference']*100:+6.1f}% [{ab['interval'][0]*100:+.1f}%, {ab['interval'][1]*100:+.1f}%]"
              f" {ab['pairs']:>2} pairs  {c['verdict']}")
    print("  settings changed:", [f"{k['change']}: {k['difference']*100:+.1f}% [{k['interval'][0]*100:+.1f}%, "
                                  f"{k['interval'][1]*100:+.1f}%]" for k in r["kept_changes"]] or "none")
PY
kill -TERM "$pid"; wait "$pid"
