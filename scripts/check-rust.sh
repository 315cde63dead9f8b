#!/usr/bin/env bash
# The Rust binding's check: `cargo test --offline` of bindings/rust against an installed flatmem.
#   - cargo: from PATH, else ~/.cargo/bin or /root/.cargo/bin (rustup), else Debian's `cargo`
#     package is installed (apt-get update + install; Debian 12 brings rustc 1.63, the crate's MSRV);
#   - the library: PREFIX/lib/pkgconfig/flatmem.pc through PKG_CONFIG_PATH (build.rs asks the
#     pkg-config program and links with an rpath, so no LD_LIBRARY_PATH);
#   - build output in build/rust-target (CARGO_TARGET_DIR), so the source tree stays clean.
# Usage: bash scripts/check-rust.sh [PREFIX]   (default $FLATMEM_PREFIX = build/prefix, must be installed:
#        cmake --install build --prefix "$PWD/build/prefix")
# Extra arguments after PREFIX go to `cargo test` (e.g. a test name filter, -- --nocapture).
# Then scripts/check-bindgen.sh PREFIX: flatmem-sys/src/bindings.rs is bindgen's output, byte for byte.
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

fail() { echo "check-rust: FAIL: $*" >&2; exit 1; }
msrv=1.63

prefix=${1:-$FLATMEM_PREFIX}
if [ $# -gt 0 ]; then shift; fi
[ -d "$prefix" ] || fail "no install prefix $prefix; build and install first:
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build && cmake --install build --prefix \"\$PWD/build/prefix\""
prefix=$(cd "$prefix" && pwd)
pc=$(find "$prefix" -name flatmem.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no flatmem.pc under $prefix (is it a flatmem install prefix?)"
PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export PKG_CONFIG_PATH
if sed -n 's/^prefix=//p' "$pc" | grep -qv '^/'; then
  echo "check-rust: note: $pc has a relative prefix (installed with a relative --prefix);" \
       "build.rs falls back to pkg-config --define-prefix"
fi
command -v pkg-config >/dev/null || fail "pkg-config not found (Debian: apt-get install pkgconf)"

step "Rust toolchain"
cargo=$(command -v cargo || true)
for candidate in "${HOME:-/root}/.cargo/bin/cargo" /root/.cargo/bin/cargo; do
  if [ -z "$cargo" ] && [ -x "$candidate" ]; then cargo=$candidate; fi
done
if [ -z "$cargo" ]; then
  echo "check-rust: no cargo found; installing Debian's cargo package"
  sudo=
  if [ "$(id -u)" -ne 0 ]; then
    sudo=$(command -v sudo) || fail "not root and no sudo: install cargo (and rustc >= $msrv) first"
  fi
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends cargo
  cargo=$(command -v cargo) || fail "apt-get installed cargo but it is not on PATH"
fi
# The rustc beside this cargo (a rustup cargo off PATH would otherwise pick another rustc).
PATH=$(dirname "$cargo"):$PATH
export PATH
"$cargo" --version
rustc_version=$(rustc --version)
echo "$rustc_version"
have=$(echo "$rustc_version" | sed -n 's/^rustc \([0-9]*\.[0-9]*\).*/\1/p')
[ -n "$have" ] || fail "cannot read the rustc version from '$rustc_version'"
[ "$(printf '%s\n%s\n' "$msrv" "$have" | sort -V | head -n 1)" = "$msrv" ] ||
  fail "rustc $have is older than the crate's minimum $msrv"

step "cargo test --offline --workspace (bindings/rust and its flatmem-sys, flatmem from $prefix)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FLATMEM_ROOT/build/rust-target}
echo "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
echo "pkg-config: $(pkg-config --modversion flatmem) $(pkg-config --cflags --libs flatmem)"
log=$(mktemp /tmp/flatmem-check-rust.XXXXXX)
trap 'rm -f "$log"' EXIT
start=$SECONDS
status=0
# pipefail: the status is cargo's when it fails
(cd "$FLATMEM_ROOT/bindings/rust" && "$cargo" test --offline --workspace "$@") 2>&1 | tee "$log" || status=$?

passed=$(sed -n 's/^test result: .*\. \([0-9]*\) passed.*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
failed=$(sed -n 's/^test result: .* \([0-9]*\) failed.*/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
echo
if [ "$status" -ne 0 ]; then
  fail "cargo test exited with $status ($passed passed, $failed failed; $((SECONDS - start)) s)"
fi
echo "check-rust: OK: $passed tests passed, $failed failed, in $((SECONDS - start)) s ($rustc_version)"

step "the numeric tests once per CPU instruction set ($(flatmem_cpu_isas "$prefix"))"
for isa in $(flatmem_cpu_isas "$prefix"); do
  echo "check-rust: FLATMEM_CPU_ISA=$isa"
  (cd "$FLATMEM_ROOT/bindings/rust" && FLATMEM_CPU_ISA=$isa "$cargo" test --offline -q --test values --test reversible --test ring --test sigmoid --test ring_sigmoid) ||
    fail "the numeric tests under FLATMEM_CPU_ISA=$isa"
done

step "the generated declarations (scripts/check-bindgen.sh)"
bash "$FLATMEM_ROOT/scripts/check-bindgen.sh" "$prefix" || fail "flatmem-sys/src/bindings.rs is not bindgen's output"
