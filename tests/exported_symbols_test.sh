#!/usr/bin/env bash
# libferry exports the C ABI and the public C++ API only: every dynamic symbol it defines must be a
# function declared in include/ferry/ferry.h, or a member of a class or a function that
# include/ferry/*.hpp marks FERRY_EXPORT. Anything else (ferry::detail, the wire protocol, the
# standard library's templates) is a leak. usage: exported_symbols_test.sh LIBFERRY SOURCE_DIR
set -euo pipefail
lib=$1
inc=$2/include/ferry

c_api=$(grep -oE '\bferry_[a-z0-9_]+\(' "$inc/ferry.h" | tr -d '(' | sort -u)
classes=$(grep -ohE 'class (\[\[nodiscard\]\] )?FERRY_EXPORT [A-Za-z0-9_]+' "$inc"/*.hpp | awk '{print $NF}' | sort -u)
functions=$(grep -ohE '^FERRY_EXPORT [^(]* [A-Za-z0-9_]+\(' "$inc"/*.hpp | sed -E 's/.* ([A-Za-z0-9_]+)\($/\1/' | sort -u)
[[ -n $c_api && -n $classes && -n $functions ]] || { echo "FAIL: read no public API from $inc"; exit 1; }
class_re="^ferry::($(echo $classes | tr ' ' '|'))::"
function_re="^ferry::($(echo $functions | tr ' ' '|'))(\[abi:[a-z0-9]+\])?\("

symbols=$(nm -D --defined-only "$lib" | awk 'NF == 3 {print $3}' | sort -u)
[[ -n $symbols ]] || { echo "FAIL: nm -D found no symbols in $lib"; exit 1; }
leaks=0
while read -r raw; do
  if grep -qxF "$raw" <<<"$c_api"; then continue; fi
  name=$(c++filt "$raw")
  if [[ $name =~ $class_re || $name =~ $function_re ]]; then continue; fi
  echo "LEAK: $name ($raw)"
  leaks=$((leaks + 1))
done <<<"$symbols"

# And the API is there: a C function and a C++ method that every client calls.
for must in ferry_connect ferry_copy_staged; do
  grep -qxF "$must" <<<"$symbols" || { echo "FAIL: $must is not exported"; leaks=$((leaks + 1)); }
done
# (Not c++filt | grep -q: grep leaving at the first match would SIGPIPE c++filt, a failure under pipefail.)
demangled=$(c++filt <<<"$symbols")
grep -q '^ferry::Client::Connect(' <<<"$demangled" || { echo "FAIL: ferry::Client::Connect is not exported"; leaks=$((leaks + 1)); }

echo "$(wc -l <<<"$symbols") symbols exported, $leaks not part of the public API"
[[ $leaks -eq 0 ]]
