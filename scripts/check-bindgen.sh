#!/usr/bin/env bash
# The Rust binding's raw declarations are generated, not written: bindings/rust/flatmem-sys/src/bindings.rs
# is bindgen's output for the INSTALLED header, checked in. This script regenerates it and fails when the
# result differs from the checked-in file by a single byte (or, with --write, replaces the file).
#
#   bindgen: Debian 12's `bindgen` CLI 0.60.1 (installed with apt-get when missing, with the libclang
#            and clang resource headers it loads at run time); another version may print other code.
#   rustfmt: bindgen pipes its output through the rustfmt on PATH (or $RUSTFMT) with
#            bindings/rust/flatmem-sys/rustfmt.toml; rustfmt's stable style does not change between
#            versions (Debian's 1.63 and rustup's current one give the same bytes), installed with
#            apt-get (Debian's `rustfmt`) when none is found.
#   the command (also documented in bindings/rust/flatmem-sys/README.md):
#     bindgen PREFIX/include/flatmem/flatmem.h <the flags of bindgen_flags below> -o bindings.rs \
#       -- -IPREFIX/include
#
# Usage: bash scripts/check-bindgen.sh [PREFIX] [--write]   (default PREFIX: $FLATMEM_PREFIX)
set -euo pipefail
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

fail() { echo "check-bindgen: FAIL: $*" >&2; exit 1; }

prefix=${FLATMEM_PREFIX}
write=0
for arg in "$@"; do
  case $arg in
    --write) write=1 ;;
    *) prefix=$arg ;;
  esac
done
[ -f "$prefix/include/flatmem/flatmem.h" ] || fail "no $prefix/include/flatmem/flatmem.h (install flatmem first)"
prefix=$(cd "$prefix" && pwd)
sys_dir=$FLATMEM_ROOT/bindings/rust/flatmem-sys
checked_in=$sys_dir/src/bindings.rs

step "bindgen and rustfmt"
if ! command -v bindgen >/dev/null; then
  echo "check-bindgen: no bindgen found; installing Debian's bindgen (with libclang)"
  apt_install bindgen libclang1-14 libclang-common-14-dev
fi
rustfmt=${RUSTFMT:-$(command -v rustfmt || true)}
for candidate in "${HOME:-/root}/.cargo/bin/rustfmt" /root/.cargo/bin/rustfmt; do
  if [ -z "$rustfmt" ] && [ -x "$candidate" ]; then rustfmt=$candidate; fi
done
if [ -z "$rustfmt" ]; then
  echo "check-bindgen: no rustfmt found; installing Debian's rustfmt"
  apt_install rustfmt
  rustfmt=$(command -v rustfmt) || fail "apt-get installed rustfmt but it is not on PATH"
fi
export RUSTFMT=$rustfmt
bindgen --version
"$RUSTFMT" --version
[ "$(bindgen --version)" = "bindgen 0.60.1" ] ||
  echo "check-bindgen: warning: the checked-in file comes from bindgen 0.60.1 (Debian 12); $(bindgen --version) may differ"

# The flags: size_t is usize; enums are integer aliases with unprefixed constants (a Rust enum holding
# a value the C side invented would be undefined behaviour); Default and PartialEq on the structs;
# only flatmem's and DLPack's items (not libc's typedefs); rustfmt with the crate's fixed config.
bindgen_flags=(
  --size_t-is-usize
  --no-prepend-enum-name
  --with-derive-default
  --with-derive-partialeq
  --allowlist-function 'flatmem_.*'
  --allowlist-type '(flatmem_|DL).*'
  --allowlist-var '(FLATMEM_|DLPACK_|kDL).*'
  --rustfmt-configuration-file "$sys_dir/rustfmt.toml"
)

step "bindgen $prefix/include/flatmem/flatmem.h"
generated=$(mktemp /tmp/flatmem-bindings.XXXXXX.rs)
trap 'rm -f "$generated"' EXIT
# Run from / so that no rustfmt.toml of the working directory can take part.
(cd / && bindgen "$prefix/include/flatmem/flatmem.h" "${bindgen_flags[@]}" -o "$generated" -- -I"$prefix/include") ||
  fail "bindgen failed"

if [ "$write" = 1 ]; then
  cp "$generated" "$checked_in"
  echo "check-bindgen: wrote $checked_in ($(wc -l <"$checked_in") lines)"
  exit 0
fi
if ! cmp -s "$generated" "$checked_in"; then
  diff -u "$checked_in" "$generated" | head -n 60 || true
  fail "$checked_in differs from bindgen's output for $prefix/include (the header changed?):" \
       "regenerate with: bash scripts/check-bindgen.sh $prefix --write"
fi
echo "check-bindgen: OK: $checked_in is bindgen's output for $prefix/include/flatmem/flatmem.h, byte for byte"
