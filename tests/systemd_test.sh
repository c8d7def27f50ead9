#!/usr/bin/env bash
# The systemd units, checked by systemd's own tools: systemd-analyze verify, the security
# exposure of the service against a threshold, and the sysusers/tmpfiles files applied to a
# scratch root. usage: systemd_test.sh SOURCE_DIR FERRYD
set -euo pipefail
src=$1 ferryd=$2
threshold=2.0  # systemd-analyze security: 0 is fully locked down, 10 is unprotected
for tool in systemd-analyze systemd-sysusers systemd-tmpfiles; do
  command -v $tool >/dev/null || { echo "FAIL: $tool missing (scripts/setup.sh installs systemd)"; exit 1; }
done
dir=$(mktemp -d /tmp/ferry-systemd-XXXXXX)
trap 'rm -rf "$dir"' EXIT
# The unit as installed names /usr/bin/ferryd; point it at this build for verify.
sed "s|/usr/bin/ferryd|$ferryd|g" "$src/systemd/ferryd.service" >"$dir/ferryd.service"
if ! out=$(systemd-analyze verify "$dir/ferryd.service" 2>&1) || [ -n "$out" ]; then
  echo "$out"; echo "FAIL: systemd-analyze verify"; exit 1
fi
echo "systemd-analyze verify: clean"
sec=$(systemd-analyze security --offline=yes "$dir/ferryd.service" 2>&1)
score=$(echo "$sec" | sed -n 's/.*Overall exposure level for ferryd.service: \([0-9.]*\).*/\1/p')
[ -n "$score" ] || { echo "$sec" | tail -5; echo "FAIL: no exposure score"; exit 1; }
echo "systemd-analyze security: exposure $score (threshold $threshold)"
awk -v s="$score" -v t="$threshold" 'BEGIN { exit !(s <= t) }' || { echo "$sec" | grep "✗"; echo "FAIL: exposure above threshold"; exit 1; }
mkdir -p "$dir/root/etc"
: >"$dir/root/etc/passwd"; : >"$dir/root/etc/group"
systemd-sysusers --root="$dir/root" "$src/systemd/ferry.sysusers"
grep -q '^ferry:' "$dir/root/etc/passwd" || { echo "FAIL: sysusers made no ferry user"; exit 1; }
grep -q '^ferry:' "$dir/root/etc/group" || { echo "FAIL: sysusers made no ferry group"; exit 1; }
systemd-tmpfiles --root="$dir/root" --create "$src/systemd/ferry.tmpfiles"
[ "$(stat -c %a "$dir/root/run/ferry")" = 750 ] || { echo "FAIL: /run/ferry mode"; exit 1; }
[ -d "$dir/root/var/lib/ferry/snapshots" ] || { echo "FAIL: no snapshot directory"; exit 1; }
echo "sysusers and tmpfiles: applied to a scratch root"
echo PASS
