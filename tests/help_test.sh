#!/usr/bin/env bash
# Every command a user runs answers --help at once, with exit code 0 and without doing anything
# else: ferry's programs print their usage; the scripts (scripts/, the GPU-session scripts in
# bench/gpu/, packaging/build-debs.sh) print their header comment, whose first line says what
# the script does.
# usage: help_test.sh SOURCE_DIR PROGRAM...
set -uo pipefail
src=$1
shift
fail() { echo "FAIL: $*"; exit 1; }
checked=0
for program in "$@"; do
  for flag in --help -h; do
    out=$(timeout 10 "$program" $flag 2>&1) || fail "$program $flag exited $?: $out"
    grep -q "^usage: " <<<"$out" || fail "$program $flag prints no usage line: $out"
  done
  checked=$((checked + 1))
done
for script in "$src"/scripts/*.sh "$src"/bench/gpu/*.sh "$src"/packaging/build-debs.sh; do
  [ "$(basename "$script")" = env.sh ] && continue  # sourced by the others, not run
  first=$(sed -n '2s/^# \{0,1\}//p' "$script")
  [ -n "$first" ] || fail "$script has no header comment to answer --help with"
  # Not run without a handler (its own, or bench/gpu/env.sh's, which it sources first).
  grep -qE -- '-h \| --help\)|/env\.sh"' "$script" || fail "$script has no --help handler"
  for flag in --help -h; do
    # A script that ignored the flag would build, run a GPU session or install packages: the
    # time limit and the empty scratch directory catch that.
    scratch=$(mktemp -d /tmp/ferry-help-XXXXXX)
    out=$(cd "$scratch" && FERRY_BUILD_DIR="$scratch/build" OUT="$scratch/out" timeout 10 bash "$script" $flag 2>&1)
    rc=$?
    left=$(ls -A "$scratch")
    rm -rf "$scratch"
    [ $rc = 0 ] || fail "$script $flag exited $rc: $out"
    [ "$(head -n1 <<<"$out")" = "$first" ] || fail "$script $flag does not start with its header's first line: $out"
    [ -z "$left" ] || fail "$script $flag wrote $left"
  done
  checked=$((checked + 1))
done
# The Python tools beside the benchmarks print their docstring, before importing anything a GPU
# machine alone has (torch, the ferry package).
for script in "$src"/bench/*.py "$src"/bench/gpu/*.py "$src"/bench/probes/*.py; do
  first=$(python3 -c 'import ast,sys; print((ast.get_docstring(ast.parse(open(sys.argv[1]).read())) or "").splitlines()[0])' "$script" 2>/dev/null)
  [ -n "$first" ] || fail "$script has no docstring to answer --help with"
  for flag in --help -h; do
    scratch=$(mktemp -d /tmp/ferry-help-XXXXXX)
    out=$(cd "$scratch" && timeout 10 python3 "$script" $flag 2>&1)
    rc=$?
    left=$(ls -A "$scratch")
    rm -rf "$scratch"
    [ $rc = 0 ] || fail "$script $flag exited $rc: $out"
    grep -qF -- "$first" <<<"$out" || fail "$script $flag does not print its docstring: $out"
    [ -z "$left" ] || fail "$script $flag wrote $left"
  done
  checked=$((checked + 1))
done
echo "PASS: $checked commands answer --help"
