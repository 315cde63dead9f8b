#!/usr/bin/env bash
# The install check: installs an already built tree into a temporary prefix and uses it
# the two ways a consumer would, with nothing from the source or build tree:
#   (a) examples/clip_loss.c built with `cc ... $(pkg-config --cflags --libs flatmem)`;
#   (b) tests/install/find_package/, a CMake project doing find_package(flatmem 0.2 REQUIRED).
# Also checks the SONAME, the .pc paths and that no installed file names the build tree.
# Usage: bash scripts/check-install.sh [BUILD_DIR]   (default build/, must be built)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build=$(cd "${1:-$FLATMEM_ROOT/build}" && pwd)
tmp=$(mktemp -d /tmp/flatmem-install-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "check-install: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
pc=$(find "$prefix" -name flatmem.pc -path '*/pkgconfig/*')
[ -n "$pc" ] || fail "no flatmem.pc installed under $prefix"
libdir=$(dirname "$(dirname "$pc")")
echo "check-install: installed into $prefix (libdir ${libdir#"$prefix"/})"

# SONAME: libflatmem.so.<FLATMEM_ABI_VERSION>, with the usual symlinks.
abi=$(sed -n 's/^ *set(FLATMEM_ABI_VERSION \([0-9]*\)).*/\1/p' "$FLATMEM_ROOT/CMakeLists.txt")
[ -n "$abi" ] || fail "FLATMEM_ABI_VERSION not found in CMakeLists.txt"
soname=$(readelf -d "$libdir/libflatmem.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = "libflatmem.so.$abi" ] || fail "SONAME is '$soname', expected libflatmem.so.$abi"
[ -L "$libdir/libflatmem.so" ] && [ -e "$libdir/libflatmem.so.$abi" ] || fail "libflatmem.so symlinks missing"
echo "check-install: SONAME $soname"

# pkg-config: paths under this prefix, version of this build.
export PKG_CONFIG_PATH=$libdir/pkgconfig
pc_query() { pkg-config "$@" flatmem | sed 's/ *$//'; }   # (pkg-config ends some answers with a space)
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
[ "$(pc_query --variable=prefix)" = "$prefix" ] || fail "flatmem.pc prefix is $(pc_query --variable=prefix)"
[ "$(pc_query --modversion)" = "$version" ] || fail "flatmem.pc version $(pc_query --modversion) != $version"
[ "$(pc_query --cflags)" = "-I$prefix/include" ] || fail "cflags: $(pc_query --cflags)"
[ "$(pc_query --libs)" = "-L$libdir -lflatmem" ] || fail "libs: $(pc_query --libs)"
[ -f "$prefix/include/flatmem/flatmem.h" ] || fail "header not installed"
echo "check-install: flatmem.pc $version: $(pc_query --cflags --libs)"
# A relative --prefix (as in `cmake --install build --prefix build/prefix`) must still give
# absolute paths in the .pc file.
(cd "$tmp" && cmake --install "$build" --prefix relative-prefix >/dev/null) || fail "install to a relative prefix"
rel_pc=$(find "$tmp/relative-prefix" -name flatmem.pc -path '*/pkgconfig/*')
grep -qx "prefix=$tmp/relative-prefix" "$rel_pc" || fail "relative --prefix: $(grep ^prefix= "$rel_pc")"
echo "check-install: a relative --prefix gives absolute .pc paths"

# No installed file may point into the source or build tree.
if grep -rlF -e "$build" -e "$FLATMEM_ROOT" "$prefix" --include='*.cmake' --include='*.pc'; then
  fail "the files above name the source or build tree"
fi

# (a) pkg-config consumer: the C99 example, built the way its comment documents (plus strict warnings).
cc -std=c99 -pedantic -Wall -Wextra -Werror "$FLATMEM_ROOT/examples/clip_loss.c" \
   $(pkg-config --cflags --libs flatmem) -o "$tmp/pc_consumer" || fail "examples/clip_loss.c does not build"
LD_LIBRARY_PATH=$libdir ldd "$tmp/pc_consumer" | grep -F "$libdir/libflatmem.so.$abi" >/dev/null ||
  fail "pkg-config consumer does not load the installed libflatmem"
(cd "$tmp" && LD_LIBRARY_PATH=$libdir ./pc_consumer) || fail "pkg-config consumer failed"
cc -std=c99 -pedantic -Wall -Wextra -Werror "$FLATMEM_ROOT/examples/reversible_transformer.c" \
   $(pkg-config --cflags --libs flatmem) -o "$tmp/pc_reversible" || fail "examples/reversible_transformer.c does not build"
(cd "$tmp" && LD_LIBRARY_PATH=$libdir ./pc_reversible >/dev/null) || fail "examples/reversible_transformer failed"
echo "check-install: (a) examples/clip_loss.c and reversible_transformer.c built with pkg-config and ran"

# (b) CMake consumer: find_package(flatmem 0.2 REQUIRED) + flatmem::flatmem.
unset PKG_CONFIG_PATH
cmake -S "$FLATMEM_ROOT/tests/install/find_package" -B "$tmp/fp" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release >"$tmp/fp.log" 2>&1 || { cat "$tmp/fp.log"; fail "find_package consumer: configure"; }
cmake --build "$tmp/fp" >>"$tmp/fp.log" 2>&1 || { cat "$tmp/fp.log"; fail "find_package consumer: build"; }
(cd "$tmp" && "$tmp/fp/consumer") || fail "find_package consumer failed"
echo "check-install: (b) find_package(flatmem 0.2) consumer built and ran"
echo "check-install: OK"
