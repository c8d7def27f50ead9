#!/usr/bin/env bash
# The Debian packages, built from this build directory (packaging/build-debs.sh: no compiling),
# checked by lintian and then installed on this machine with apt-get: the installed ferryd checks
# its packaged config, its unit passes systemd-analyze, and started as the packaged user with the
# packaged config it serves a client built against the installed libferry-dev by an outside
# CMake project (find_package) and a C program built with pkg-config, every byte checked.
# Removing the development packages stops nothing; reinstalling and upgrading keep an edited
# /etc/ferry/ferryd.yaml; purging leaves only what the operator wrote. The machine is left as it
# was found: the packages purged, the ferry user and group deleted if this test made them.
# Runs as root where dpkg and apt are (else skipped: exit 77).
# usage: package_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
threshold=1.6  # systemd-analyze security of the unit in the tree: the installed one may not be worse
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "installing packages needs root"
for tool in dpkg dpkg-deb dpkg-shlibdeps apt-get; do
  command -v $tool >/dev/null || skip "no $tool (not a Debian machine)"
done
for tool in lintian systemd-analyze pkg-config setpriv; do
  command -v $tool >/dev/null || fail "$tool missing (scripts/setup.sh installs it)"
done
packages=(ferryd libferry-dev python3-ferry)
soversion=$(sed -n 's/^CMAKE_PROJECT_VERSION_MAJOR:STATIC=//p' "$build/CMakeCache.txt").$(sed -n 's/^CMAKE_PROJECT_VERSION_MINOR:STATIC=//p' "$build/CMakeCache.txt")
packages+=("libferry$soversion")
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qv "not-installed"; then
    skip "$p is installed on this machine: this test installs and purges it"
  fi
done
for d in /etc/ferry /run/ferry /var/lib/ferry; do
  [ ! -e $d ] || skip "$d exists on this machine: this test installs and purges ferry's packages"
done
had_user=0; getent passwd ferry >/dev/null && had_user=1
had_group=0; getent group ferry >/dev/null && had_group=1
export DEBIAN_FRONTEND=noninteractive
apt() { apt-get -y -qq -o Dpkg::Use-Pty=0 "$@" </dev/null >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "apt-get $*"; }; }

work=$(mktemp -d /tmp/ferry-package-XXXXXX)
chmod 755 "$work"  # the clients run as another user
ferryd_pid=""
cleanup() {
  if [ -n "$ferryd_pid" ]; then kill "$ferryd_pid" 2>/dev/null && wait "$ferryd_pid" 2>/dev/null || true; fi
  local installed=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qv "not-installed" && installed+=("$p")
  done
  [ ${#installed[@]} -eq 0 ] || apt-get purge -y -qq "${installed[@]}" </dev/null >/dev/null 2>&1 || true
  rm -rf /etc/ferry /run/ferry /var/lib/ferry
  [ $had_user = 1 ] || userdel ferry 2>/dev/null || true
  [ $had_group = 1 ] || groupdel ferry 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
t0=$(date +%s.%N)
lap() { echo "[$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%5.1f s", b - a }')] $*"; }

# --- the packages: this build's version, and a later one to upgrade to ---
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
bash "$src/packaging/build-debs.sh" "$build" "$work/debs" >/dev/null
bash "$src/packaging/build-debs.sh" "$build" "$work/next" "$version+1" >/dev/null
ls "$work/debs"
[ "$(ls "$work/debs" | wc -l)" = ${#packages[@]} ] || fail "expected ${#packages[@]} packages"
lap "packages built"
for deb in "$work"/debs/*.deb; do
  if dpkg-deb -c "$deb" | grep -i cuda; then fail "$(basename "$deb") has CUDA files"; fi
done
lintian --fail-on error,warning "$work"/debs/*.deb >"$work/lintian.log" 2>&1 || { cat "$work/lintian.log"; fail "lintian"; }
grep -E '^[EW]:' "$work/lintian.log" && fail "lintian warnings"
lap "lintian: no errors or warnings"

# --- installed ---
apt install "$work"/debs/*.deb
for p in "${packages[@]}"; do
  [ "$(dpkg-query -W -f='${Version}' "$p")" = "$version" ] || fail "$p $version not installed"
  dpkg -L "$p" >"$work/files.$p"
done
getent passwd ferry | grep -q ':/var/lib/ferry:/usr/sbin/nologin$' || fail "no ferry user: $(getent passwd ferry)"
[ "$(stat -c '%U:%G %a' /run/ferry)" = "ferry:ferry 750" ] || fail "/run/ferry: $(stat -c '%U:%G %a' /run/ferry)"
[ "$(stat -c '%U:%G %a' /var/lib/ferry/snapshots)" = "ferry:ferry 750" ] || fail "/var/lib/ferry/snapshots"
conffiles=$(dpkg-query -W -f='${Conffiles}' ferryd)
for f in /etc/ferry/ferryd.yaml /etc/ferry/policies/chunked.yaml; do
  echo "$conffiles" | grep -q " $f " || fail "$f is not a conffile"
done
for f in /usr/share/ferry/ferry-dashboard.json /usr/share/ferry/ferry-rules.yaml /usr/include/ferry/ferry.h \
  /usr/lib/cmake/ferry/ferryConfig.cmake; do
  [ -f "$f" ] || fail "$f not installed"
done
as_ferry() { setpriv --reuid=ferry --regid=ferry --init-groups "$@"; }
as_client() { setpriv --reuid=nobody --regid=nogroup --groups="$(getent group ferry | cut -d: -f3)" "$@"; }
as_ferry /usr/bin/ferryd --check-config /etc/ferry/ferryd.yaml >"$work/check.log" 2>&1 ||
  { cat "$work/check.log"; fail "ferryd --check-config"; }
lap "installed: ferryd --check-config passes on the packaged config"

unit=/lib/systemd/system/ferryd.service
out=$(systemd-analyze verify "$unit" 2>&1) && [ -z "$out" ] || { echo "$out"; fail "systemd-analyze verify $unit"; }
score=$(systemd-analyze security --offline=yes "$unit" 2>&1 | sed -n 's/.*Overall exposure level for ferryd.service: \([0-9.]*\).*/\1/p')
awk -v s="$score" -v t="$threshold" 'BEGIN { exit !(s != "" && s <= t) }' || fail "exposure '$score' above $threshold"
lap "systemd-analyze: verify clean, security exposure $score (at most $threshold)"

# --- served: ferryd as the packaged user with the packaged config, as its unit runs it ---
start_ferryd() {
  if [ -d /run/systemd/system ]; then
    systemctl restart ferryd.service || { journalctl -u ferryd.service -n 30 --no-pager; fail "systemctl start ferryd"; }
  else  # no systemd here: the unit's user, limits and command line
    # The unit's LimitMEMLOCK=infinity and LimitNOFILE=65536, or the most this machine allows.
    ( (ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -Hl)") &&
      (ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)") &&
      exec setpriv --reuid=ferry --regid=ferry --init-groups /usr/bin/ferryd --config /etc/ferry/ferryd.yaml
    ) >"$work/ferryd.log" 2>&1 &
    ferryd_pid=$!
  fi
  local deadline=$((SECONDS + 60)) rc
  while :; do
    rc=0; /usr/bin/ferryctl status >/dev/null 2>&1 || rc=$?
    [ $rc = 0 ] && break
    [ -z "$ferryd_pid" ] || kill -0 "$ferryd_pid" 2>/dev/null || { cat "$work/ferryd.log"; fail "ferryd exited"; }
    [ $SECONDS -lt $deadline ] || { cat "$work/ferryd.log" 2>/dev/null; fail "ferryd not ready in 60 s"; }
    sleep 0.1
  done
}
stop_ferryd() {
  if [ -n "$ferryd_pid" ]; then
    kill -TERM "$ferryd_pid"; wait "$ferryd_pid" || fail "ferryd exited $? on SIGTERM"; ferryd_pid=""
  fi
}
start_ferryd
serving_pid=$(pgrep -u ferry -x ferryd) || fail "no ferryd running as ferry"
lap "ferryd serving as user ferry (pid $serving_pid)"

cmake -S "$src/tests/package" -B "$work/cmake-client" -G Ninja -DCMAKE_BUILD_TYPE=Release >"$work/client.log" 2>&1 &&
  cmake --build "$work/cmake-client" >>"$work/client.log" 2>&1 || { cat "$work/client.log"; fail "outside CMake project"; }
cc -O2 -Wall -Werror -o "$work/pkgconfig_client" "$src/tests/package/pkgconfig_client.c" $(pkg-config --cflags --libs ferry) ||
  fail "C program with pkg-config ferry"
packaged=$(readlink -f "$(grep "libferry.so.$soversion\$" "$work/files.libferry$soversion")")
for client in "$work/cmake-client/cmake_client" "$work/pkgconfig_client"; do
  found=$(ldd "$client" | awk '/libferry/ { print $3 }')
  [ "$(readlink -f "$found")" = "$packaged" ] || fail "$client loads libferry from '$found', not the package's $packaged"
done
lap "clients built: find_package(ferry) and pkg-config ferry"
bytes=$(( (24 << 20) + 4093 ))
as_client "$work/cmake-client/cmake_client" $bytes || fail "cmake_client"
as_client "$work/pkgconfig_client" $bytes || fail "pkgconfig_client"
as_client /usr/bin/python3 -c "import ferry; assert ferry.__version__ == '$version', ferry.__version__" || fail "import ferry"
/usr/bin/python3 -c "import ferry.bench" || fail "import ferry.bench"  # as root: byte-compiled files, purged too
lap "served: both clients (as nobody, group ferry), every byte checked; python3 -c 'import ferry'"

# --- the operator's changes, kept by a reinstall and by an upgrade ---
sed -i 's/^  size: 1GiB /  size: 512MiB /' /etc/ferry/ferryd.yaml
grep -q '^  size: 512MiB ' /etc/ferry/ferryd.yaml || fail "the config's pool size line changed: edit the test"
/usr/bin/ferryctl keygen --dir /etc/ferry --name operator >/dev/null
edited=$(md5sum </etc/ferry/ferryd.yaml)
kept() {
  [ "$(md5sum </etc/ferry/ferryd.yaml)" = "$edited" ] || fail "$1 changed the edited /etc/ferry/ferryd.yaml"
  ! ls /etc/ferry/*.dpkg-* 2>/dev/null || fail "$1 left dpkg's copies beside the config"
  as_ferry /usr/bin/ferryd --check-config --config /etc/ferry/ferryd.yaml | grep -q '^pool 536870912 bytes' ||
    fail "$1: ferryd --check-config does not read the edited config"
}
apt install --reinstall "$work"/debs/*.deb
kept "apt-get install --reinstall"
apt install "$work"/next/*.deb
[ "$(dpkg-query -W -f='${Version}' ferryd)" = "$version+1" ] || fail "not upgraded to $version+1"
kept "the upgrade to $version+1"
lap "the edited config kept by a reinstall and by the upgrade to $version+1"
if [ -z "$ferryd_pid" ]; then
  [ "$(systemctl show -P MainPID ferryd.service)" != "$serving_pid" ] || fail "the upgrade did not restart ferryd"
else  # no systemd to restart it: the upgraded ferryd started again
  stop_ferryd; start_ferryd
fi
serving_pid=$(pgrep -u ferry -x ferryd)
as_client "$work/pkgconfig_client" $bytes || fail "pkgconfig_client after the upgrade"

# --- removed: the development packages stop nothing; ferryd's removal keeps its config ---
apt remove libferry-dev python3-ferry
[ "$(pgrep -u ferry -x ferryd)" = "$serving_pid" ] || fail "removing libferry-dev and python3-ferry touched ferryd"
as_client "$work/pkgconfig_client" $bytes || fail "pkgconfig_client after libferry-dev was removed"
stop_ferryd  # without systemd; with it, ferryd's prerm stops the service
apt remove ferryd
if [ -d /run/systemd/system ]; then
  ! systemctl is-active --quiet ferryd.service || fail "apt-get remove ferryd left ferryd running"
fi
[ "$(dpkg-query -W -f='${Status}' ferryd)" = "deinstall ok config-files" ] || fail "ferryd's config not kept on remove"
[ "$(md5sum </etc/ferry/ferryd.yaml)" = "$edited" ] || fail "remove changed the config"
getent passwd ferry >/dev/null || fail "remove deleted the ferry user"
[ ! -e /usr/bin/ferryd ] || fail "/usr/bin/ferryd left after remove"
lap "removed: ferryd served until it was stopped, config and user kept"

# --- purged: nothing of the packages' left, the operator's files kept ---
present=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -qv "not-installed" && present+=("$p")
done
apt purge "${present[@]}"
for p in "${packages[@]}"; do
  while IFS= read -r f; do
    [ -d "$f" ] || { [ ! -e "$f" ] && [ ! -L "$f" ]; } || fail "$f ($p) left after purge"
  done <"$work/files.$p"
done
for d in /run/ferry /var/lib/ferry /etc/ferry/policies $(grep -h ferry "$work"/files.* | grep -vx /etc/ferry | sort -u); do
  [ ! -e "$d" ] || fail "$d left after purge: $(find "$d")"
done
left=$(cd /etc/ferry && find . -mindepth 1 | sort | tr '\n' ' ')
[ "$left" = "./operator.key ./operator.pub " ] || fail "/etc/ferry after purge holds '$left', not only the operator's key pair"
lap "purged: nothing left but the operator's key pair in /etc/ferry"
echo PASS
