#!/usr/bin/env bash
# ferryctl is the operator's CLI: it links the policy model, signing, common and the operator's
# control-socket client, never ferryd's code, libferry, the CUDA runtime or cuBLAS (not even
# through another library: an operator host may have no CUDA runtime). `ferryctl bench ...` and `ferryctl tune` run
# ferry-bench (beside ferryctl, else on PATH) with the arguments and exit code passed through,
# and say clearly when it is missing.
# usage: ferryctl_links_test.sh FERRYCTL FERRY_BENCH
set -uo pipefail
ctl=$1 bench=$2
fail() { echo "FAIL: $*"; exit 1; }
scratch=$(mktemp -d /tmp/ferry-ctl-links-XXXXXX)
trap 'rm -rf "$scratch"' EXIT
command -v readelf >/dev/null && command -v nm >/dev/null || fail "readelf and nm (binutils) are needed"

needed=$(readelf -d "$ctl" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "ferryctl needs: $(echo $needed)"
[ -n "$needed" ] || fail "no NEEDED entries read from $ctl"
grep -Eiq "cudart|cublas|libcuda|ferry_daemon|libferry" <<<"$needed" && fail "ferryctl needs a GPU, daemon or client library: $needed"
# Nor through a library it loads (libferry would bring the CUDA runtime on a CUDA build).
loaded=$(ldd "$ctl") || fail "ldd $ctl"
grep -Eiq "cudart|cublas|libcuda|libferry" <<<"$loaded" && fail "ferryctl loads a GPU or client library: $loaded"
symbols=$(nm -C "$ctl") || fail "nm $ctl"
[ -n "$symbols" ] || fail "no symbols in $ctl (stripped? the check needs them)"
grep -q "ferry::policy::ParsePolicy" <<<"$symbols" || fail "the check is blind: ferry::policy::ParsePolicy not found in ferryctl"
daemon=$(grep -E "ferry::daemon::|cublas|cudaMalloc|cudaStream" <<<"$symbols" | head -5)
[ -z "$daemon" ] || fail "ferryctl holds daemon or CUDA code: $daemon"

# Forwarding: help, an argument error's exit code, a --socket before the command.
# (Output captured first: grep -q exiting early would end the writer with SIGPIPE under pipefail.)
help=$("$ctl" --help) || fail "ferryctl --help"
grep -q "bench overlap" <<<"$help" || fail "ferryctl --help does not list bench overlap"
grep -q "tune \[" <<<"$help" || fail "ferryctl --help does not list tune"
help=$("$ctl" tune --help) || fail "ferryctl tune --help"
grep -q "usage: ferry-bench tune" <<<"$help" || fail "ferryctl tune --help is not ferry-bench tune's"
help=$("$ctl" bench overlap --help) || fail "ferryctl bench overlap --help"
grep -q -- "--compute-streams" <<<"$help" || fail "ferryctl bench overlap --help is not the bench's"
"$ctl" --socket /nonexistent/ferryd.sock tune --no-such-option 2>"$scratch/err"
rc=$?
[ $rc = 1 ] || fail "ferryctl tune with a bad option exited $rc, not ferry-bench's 1"
grep -q "unknown option '--no-such-option'" "$scratch/err" || { cat "$scratch/err"; fail "ferry-bench's error did not come through"; }

# ferry-bench missing: a clear error naming it, not a crash.
cp "$ctl" "$scratch/ferryctl"
out=$(env PATH="$scratch" LD_LIBRARY_PATH="$(dirname "$(readlink -f "$ctl")")" "$scratch/ferryctl" bench overlap --quick 2>&1)
rc=$?
[ $rc = 127 ] || fail "ferryctl bench without ferry-bench exited $rc, not 127: $out"
grep -q "ferry-bench" <<<"$out" || fail "the error does not name ferry-bench: $out"
# ... and found on PATH when not beside ferryctl.
ln -s "$(readlink -f "$bench")" "$scratch/ferry-bench"
help=$(env PATH="$scratch:/usr/bin:/bin" "$scratch/ferryctl" tune --help)
grep -q "usage: ferry-bench tune" <<<"$help" || fail "ferryctl did not find ferry-bench on PATH"
echo PASS
