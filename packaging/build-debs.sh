#!/usr/bin/env bash
# Builds ferry's Debian packages from a build directory that is already built: nothing is
# compiled. Each package's files are `cmake --install --component` of the build, laid out as
# Debian 12 wants them; its control files come from packaging/debian/, its dependencies on
# Debian's libraries from dpkg-shlibdeps. Needs dpkg-dev (dpkg-shlibdeps, dpkg-architecture) and
# binutils (strip).
# usage: build-debs.sh BUILD_DIR OUT_DIR [VERSION]
#   VERSION: the packages' version (default: the tree's, project(VERSION) in CMakeLists.txt)
# env: FERRY_DEB_MAINTAINER overrides the Maintainer field.
case "${1:-}" in -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR OUT_DIR [VERSION]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
version=${3:-$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")}
[ -n "$version" ] || { echo "build-debs: no project version in $build/CMakeCache.txt" >&2; exit 1; }
maintainer=${FERRY_DEB_MAINTAINER:-ferry maintainers <maintainers@ferry.example>}
arch=$(dpkg --print-architecture)
major=$(sed -n 's/^CMAKE_PROJECT_VERSION_MAJOR:STATIC=//p' "$build/CMakeCache.txt")
minor=$(sed -n 's/^CMAKE_PROJECT_VERSION_MINOR:STATIC=//p' "$build/CMakeCache.txt")
soversion=$major.$minor  # libferry's SONAME is libferry.so.MAJOR.MINOR (CMakeLists.txt says why)
date=$(date -R)
if grep -q 'kBuiltWithCuda = true' "$build/generated/ferry/version.hpp"; then
  cuda=1
  cudart=$(readelf -d "$build/ferryd" | sed -n 's/.*NEEDED.*\[\(libcudart[^]]*\)\].*/\1/p')
  backend="cuda backend: needs the NVIDIA driver and the CUDA runtime (${cudart:-libcudart})."
else
  cuda=0
  backend="Host backend only (built without the CUDA toolkit): no GPU support."
fi

stage=$(mktemp -d /tmp/ferry-debs-XXXXXX)
trap 'rm -rf "$stage"' EXIT

install_component() {  # component root
  DESTDIR=$2 cmake --install "$build" --prefix /usr --component "$1" >/dev/null
}
move() {  # root from to: moves a staged path to where Debian wants it
  [ -e "$1/$2" ] || { echo "build-debs: $2 is not in the install" >&2; exit 1; }
  mkdir -p "$(dirname "$1/$3")"
  mv "$1/$2" "$1/$3"
  rmdir -p --ignore-fail-on-non-empty "$(dirname "$1/$2")"
}
is_elf() { [ "$(head -c 4 "$1" | tr -d '\0')" = $'\x7fELF' ]; }
# As dh_strip does: no debug sections or comments in what is shipped.
strip_elf() {
  local f
  while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    if [[ $f == *.so* ]]; then
      strip --remove-section=.comment --remove-section=.note --strip-unneeded "$f"
    else
      strip --remove-section=.comment --remove-section=.note "$f"
    fi
  done < <(find "$1" -type f -print0)
}
docs() {  # root package
  local d=$1/usr/share/doc/$2
  mkdir -p "$d"
  install -m644 "$here/debian/copyright" "$d/copyright"
  sed -e "s|@VERSION@|$version|g" -e "s|@MAINTAINER@|$maintainer|g" -e "s|@DATE@|$date|g" \
    "$here/debian/changelog.in" | gzip -9n >"$d/changelog.gz"
  chmod 644 "$d/changelog.gz"
}
# dpkg-shlibdeps on a package's ELF files: the packages of the libraries they need, libferry's
# from its shlibs file (it is not installed here).
shlibs_of() {  # root
  local elves=() f
  while IFS= read -r -d '' f; do
    is_elf "$f" && elves+=("$f")
  done < <(find "$1" -type f -print0)
  [ ${#elves[@]} -gt 0 ] || return 0
  local opts=(-l"$stage/libferry/$libdir")
  # A cuda build's libcudart comes from the toolkit (/usr/local/cuda), which no Debian package
  # may own: it is looked for there and named by no dependency.
  [ $cuda = 1 ] && opts+=(-l/usr/local/cuda/lib64 --ignore-missing-info)
  (cd "$stage/shlibdeps" && dpkg-shlibdeps -O -L"$stage/shlibs.local" "${opts[@]}" "${elves[@]}" 2>"$stage/shlibdeps.err") |
    sed -n 's/^shlibs:Depends=//p' || { cat "$stage/shlibdeps.err" >&2; exit 1; }
}
build_deb() {  # root package template-dir [python-depends]
  local root=$1 pkg=$2 tmpl=$here/debian/$3 f
  docs "$root" "$pkg"
  mkdir -p "$root/DEBIAN"
  local shlibs size
  shlibs=$(shlibs_of "$root")
  size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
  sed -e "s|@VERSION@|$version|g" -e "s|@ARCH@|$arch|g" -e "s|@MAINTAINER@|$maintainer|g" \
    -e "s|@SIZE@|$size|g" -e "s|@SHLIBS@|$shlibs|g" -e "s|@SOVERSION@|$soversion|g" \
    -e "s|@BACKEND@|$backend|g" -e "s|@PYTHON_DEPENDS@|${4:-}|g" "$tmpl/control" >"$root/DEBIAN/control"
  for f in postinst prerm postrm; do
    [ -f "$tmpl/$f" ] && install -m755 "$tmpl/$f" "$root/DEBIAN/$f"
  done
  for f in triggers shlibs; do
    [ -f "$tmpl/$f" ] && sed -e "s|@VERSION@|$version|g" -e "s|@SOVERSION@|$soversion|g" "$tmpl/$f" >"$root/DEBIAN/$f"
  done
  if [ -d "$root/etc" ]; then
    (cd "$root" && find etc -type f | sort | sed 's|^|/|') >"$root/DEBIAN/conffiles"
  fi
  (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
  find "$root" -type d -exec chmod 755 {} +
  chmod 644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
  dpkg-deb --root-owner-group -Zxz --build "$root" "$out/${pkg}_${version}_${arch}.deb" >/dev/null
  echo "$out/${pkg}_${version}_${arch}.deb"
}

mkdir -p "$stage/shlibdeps/debian"
: >"$stage/shlibdeps/debian/control"  # dpkg-shlibdeps reads it
echo "libferry $soversion libferry$soversion (= $version)" >"$stage/shlibs.local"

# libferry<SOVERSION>: the shared library.
install_component libferry "$stage/libferry"
strip_elf "$stage/libferry"
so=$(cd "$stage/libferry" && find usr/lib -maxdepth 2 -name "libferry.so.$soversion" | head -1)
[ -n "$so" ] || { echo "build-debs: no libferry.so.$soversion in the install" >&2; exit 1; }
libdir=$(dirname "$so")
build_deb "$stage/libferry" "libferry$soversion" libferry

# libferry-dev: headers, the link-time symlink, CMake config, pkg-config. ferry.pc names the
# prefix the build was configured with; the package's is /usr.
install_component dev "$stage/dev"
sed -i 's|^prefix=.*|prefix=/usr|' "$stage/dev/$libdir/pkgconfig/ferry.pc"
# pkg-config's cross wrappers search the multiarch directory only.
[ "$libdir" = usr/lib ] && move "$stage/dev" usr/lib/pkgconfig "usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/pkgconfig"
build_deb "$stage/dev" libferry-dev libferry-dev

# ferryd: the daemon, its tools and their manual pages, the unit, config and policies.
root=$stage/ferryd
install_component ferryd "$root"
move "$root" usr/etc etc                                    # the sysconfdir of /usr is /etc
move "$root" usr/share/ferry/policies etc/ferry/policies    # conffiles; ferry-bench looks here first
move "$root" usr/lib/systemd/system lib/systemd/system      # Debian 12's unit directory
strip_elf "$root"
build_deb "$root" ferryd ferryd

# python3-ferry: where the build made the Python package.
if [ -d "$build/python/ferry" ]; then
  root=$stage/python
  install_component python "$root"
  ext=$(find "$root" -name '_ferry.cpython-*.so' | head -1)
  [ -n "$ext" ] || { echo "build-debs: no ferry extension in the python component" >&2; exit 1; }
  # Its RPATH points at a /usr/local install; the package's libferry is on the loader's path.
  cmake -DF="$ext" -P "$here/rpath_remove.cmake"
  strip_elf "$root"
  pyver=$(basename "$ext" | sed -n 's/^_ferry\.cpython-\([0-9]\)\([0-9]*\)-.*/\1.\2/p')
  next=$(echo "$pyver" | awk -F. '{ print $1 "." $2 + 1 }')
  find "$root" -name __pycache__ -prune -exec rm -rf {} +
  build_deb "$root" python3-ferry python3-ferry "python3 (>= $pyver~), python3 (<< $next)"
fi
