#!/usr/bin/env bash
# The Rust binding's check: `cargo test --offline` of bindings/rust against an installed flatmem.
#   - cargo: from PATH, else ~/.cargo/bin or /root/.cargo/bin (rustup), else Debian's `cargo`
#     package is installed (apt-get update + install; Debian 12 brings rustc 1.63, the crate's MSRV);
#   - the library: PREFIX/lib/pkgconfig/flatmem.pc through PKG_CONFIG_PATH (build.rs asks the
#     pkg-config program and links with an rpath, so no LD_LIBRARY_PATH);
#   - crates: the only ones, the `cmake` crate and its `cc` (flatmem-sys's `bundled` feature), from
#     Debian's librust-cmake-dev in /usr/share/cargo/registry (installed with apt-get when missing):
#     every cargo run gets --config bindings/rust/cargo-debian.toml, which puts that directory in
#     place of crates.io (offline, Cargo.lock names them even for builds without the feature);
#   - build output in build/rust-target (CARGO_TARGET_DIR), so the source tree stays clean.
# Usage: bash scripts/check-rust.sh [PREFIX]   (default $FLATMEM_PREFIX = build/prefix, must be installed:
#        cmake --install build --prefix "$PWD/build/prefix")
# Extra arguments after PREFIX go to `cargo test` (e.g. a test name filter, -- --nocapture).
# Then scripts/check-bindgen.sh PREFIX: flatmem-sys/src/bindings.rs is bindgen's output, byte for byte.
# Last, the `bundled` feature with no flatmem for pkg-config to find: flatmem-sys's build script builds
# the library from this checkout (in build/rust-bundled; 2-3 minutes on 2 cores the first time), and
# two test binaries run against it (FLATMEM_CHECK_RUST_BUNDLED=0 skips this stage).
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
  apt_install cargo
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

rust_dir=$FLATMEM_ROOT/bindings/rust
cargo_config=$rust_dir/cargo-debian.toml
debian_registry=$(sed -n 's/^directory = "\(.*\)"$/\1/p' "$cargo_config")
if ! compgen -G "$debian_registry/cmake-0.1.*" >/dev/null; then
  echo "check-rust: no cmake crate in $debian_registry; installing Debian's librust-cmake-dev"
  apt_install librust-cmake-dev
fi
echo "crates from $debian_registry: $(cd "$debian_registry" && echo cmake-* cc-*)"
# run_cargo ARGS...: cargo in bindings/rust, offline, with Debian's crates for crates.io.
run_cargo() {
  (cd "$rust_dir" && "$cargo" --offline --config "$cargo_config" "$@")
}

step "cargo test --offline --workspace (bindings/rust and its flatmem-sys, flatmem from $prefix)"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FLATMEM_ROOT/build/rust-target}
echo "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
echo "pkg-config: $(pkg-config --modversion flatmem) $(pkg-config --cflags --libs flatmem)"
log=$(mktemp /tmp/flatmem-check-rust.XXXXXX)
trap 'rm -f "$log"' EXIT
start=$SECONDS
status=0
# pipefail: the status is cargo's when it fails
run_cargo test --workspace "$@" 2>&1 | tee "$log" || status=$?

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
  FLATMEM_CPU_ISA=$isa run_cargo test -q --test values --test reversible --test ring --test sigmoid --test ring_sigmoid ||
    fail "the numeric tests under FLATMEM_CPU_ISA=$isa"
done

step "the generated declarations (scripts/check-bindgen.sh)"
bash "$FLATMEM_ROOT/scripts/check-bindgen.sh" "$prefix" || fail "flatmem-sys/src/bindings.rs is not bindgen's output"

# The `bundled` feature on a machine with no flatmem installed: pkg-config searches only an empty
# directory, so flatmem-sys's build script configures, builds and installs this checkout with the
# cmake crate into its OUT_DIR; the test binaries must link that copy (rpath into the target dir).
if [ "${FLATMEM_CHECK_RUST_BUNDLED:-1}" = 0 ]; then
  echo "check-rust: FLATMEM_CHECK_RUST_BUNDLED=0: the bundled build is not checked"
  exit 0
fi
bundled_target=$FLATMEM_ROOT/build/rust-bundled
step "cargo build --features bundled with no flatmem for pkg-config (the library from this checkout, in $bundled_target)"
no_pkgconfig=$(mktemp -d /tmp/flatmem-no-pkgconfig.XXXXXX)
trap 'rm -f "$log"; rm -rf "$no_pkgconfig"' EXIT
# CUDA and NCCL off: the library's AUTO builds the CUDA kernels wherever nvcc is found, for sm 80 and
# 90 (FLATMEM_CUDA_ARCHITECTURES does not reach a build inside cargo), which would triple this stage
# on the 2-core CI; the stage checks the build path, and the CPU tests below need no GPU.
run_bundled() (
  export PKG_CONFIG_PATH=$no_pkgconfig PKG_CONFIG_LIBDIR='' CARGO_TARGET_DIR=$bundled_target
  export FLATMEM_SYS_CMAKE_ARGS="-DFLATMEM_WITH_CUDA=OFF -DFLATMEM_WITH_NCCL=OFF"
  unset FLATMEM_SYS_BUNDLED
  "$@"
)
if run_bundled pkg-config --exists flatmem; then
  fail "pkg-config still finds a flatmem with PKG_CONFIG_PATH=$no_pkgconfig PKG_CONFIG_LIBDIR=" \
       "($(run_bundled pkg-config --variable=pcfiledir flatmem))"
fi
start=$SECONDS
run_bundled run_cargo build --features bundled || fail "cargo build --features bundled"
echo "check-rust: the bundled build took $((SECONDS - start)) s"

step "cargo test --features bundled --test header_macros --test values (against the bundled library)"
bundled_tests=(test --features bundled --test header_macros --test values)
run_bundled run_cargo "${bundled_tests[@]}" || fail "the tests against the bundled library"
# Each test binary must find libflatmem in the bundled install (its RUNPATH), not an installed one.
binaries=$(run_bundled run_cargo "${bundled_tests[@]}" --no-run --message-format=json |
           "$FLATMEM_PYTHON" -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable"):
        print(message["executable"])')
[ -n "$binaries" ] || fail "cargo test --no-run listed no test binaries"
for binary in $binaries; do
  runpath=$(readelf -d "$binary" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
  resolved=$(env -u LD_LIBRARY_PATH ldd "$binary" | awk '$1 ~ /^libflatmem\.so/ {print $3}')
  echo "check-rust: $(basename "$binary"): RUNPATH $runpath; libflatmem -> $resolved"
  case $runpath in
    *"$bundled_target"/*/build/flatmem-sys-*/out/lib*) ;;
    *) fail "$binary has no RUNPATH into the bundled install under $bundled_target ($runpath)" ;;
  esac
  case $resolved in
    "$bundled_target"/*/build/flatmem-sys-*/out/lib/libflatmem.so*) ;;
    *) fail "$binary loads libflatmem from '$resolved', not from the bundled install under $bundled_target" ;;
  esac
done
echo "check-rust: OK: the bundled build links and passes its tests ($((SECONDS - start)) s for the stage)"
