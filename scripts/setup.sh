#!/usr/bin/env bash
# Installs what ferry needs to build and test on Debian 12 (run as root, or with sudo available).
# The CUDA toolkit is not a Debian package here: if /usr/local/cuda exists the build uses it,
# otherwise ferry builds the host backend alone and says so.
# usage: scripts/setup.sh
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libboost-dev libyaml-cpp-dev libsodium-dev prometheus-cpp-dev libgtest-dev libgmock-dev
  libsystemd-dev
  # the Python package (python/): its extension, and its tests with real torch tensors
  python3-dev python3-pybind11 python3-numpy python3-pytest python3-torch
  # used by the tests: the real tools users run (chromium and nodejs: the buyer's page,
  # `ferryctl report html`, checked in a real browser and its script under node's test runner)
  minisign prometheus systemd python3 curl chromium nodejs
  # the Debian packages' test: dpkg-shlibdeps, and lintian on every package
  dpkg-dev lintian
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: dependencies present"
