#!/usr/bin/env bash
# The library's ABI against the baseline kept in the repository (libabigail's abidiff; Debian's
# abigail-tools, installed here with apt-get when missing).
#   tests/abi/libflatmem.so.1.abi   abidw of libflatmem at the release of ABI 1 (public types only)
#   tests/abi/evolution.suppr       what the ABI rules allow (flatmem.h, "Conventions"): fields
#                                   appended at the end of a struct (except the frozen ones); the
#                                   opaque handles' definitions are not ABI and are dropped
# Added functions are allowed too (--no-added-syms). Anything else abidiff reports -- a removed or
# changed function, a field inserted, removed, resized or moved, an enumerator changed -- fails.
# Usage: bash scripts/check-abi.sh LIBRARY             check (the ctest test abi/abidiff)
#        bash scripts/check-abi.sh --update LIBRARY    rewrite the baseline from LIBRARY: only for an
#                                                      intended break, with the SONAME bumped
#                                                      (docs/abi.md, "Breaking the ABI on purpose")
# LIBRARY needs its C API translation units' DWARF (src/CMakeLists.txt compiles them with -g).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

update=0
if [ "${1:-}" = --update ]; then update=1; shift; fi
[ $# -eq 1 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
library=$1
[ -f "$library" ] || { echo "check-abi: no library $library" >&2; exit 1; }
command -v abidiff >/dev/null || apt_install abigail-tools
abi_dir=$FLATMEM_ROOT/tests/abi
soname=$(objdump -p "$library" | sed -n 's/^ *SONAME *//p')
baseline=$abi_dir/$soname.abi
headers=$FLATMEM_ROOT/include/flatmem

if [ "$update" = 1 ]; then
  abidw --headers-dir "$headers" --drop-private-types --exported-interfaces-only --suppressions "$abi_dir/evolution.suppr" \
        --no-corpus-path --no-comp-dir-path --short-locs --out-file "$baseline" "$library"
  echo "check-abi: wrote $baseline ($(grep -c '<elf-symbol ' "$baseline") functions)"
  exit 0
fi
[ -f "$baseline" ] || {
  echo "check-abi: FAIL: no baseline $baseline for SONAME $soname; a new SONAME needs" \
       "'bash scripts/check-abi.sh --update $library' (docs/abi.md)" >&2
  exit 1
}
set +e
report=$(abidiff --exported-interfaces-only --no-added-syms \
                 --suppressions "$abi_dir/evolution.suppr" "$baseline" "$library" 2>&1)
rc=$?
set -e
# abidiff's status bits: 1 error, 2 usage error, 4 ABI change, 8 incompatible ABI change.
if [ "$rc" -ne 0 ]; then
  echo "$report"
  echo "check-abi: FAIL: abidiff status $rc against $baseline: the change above breaks ABI $soname" \
       "(only fields appended at the end of a non-frozen struct, and new functions, keep it)" >&2
  exit 1
fi
echo "check-abi: OK: $library keeps the ABI of $(basename "$baseline")" \
     "($(grep -c '<elf-symbol ' "$baseline") functions in the baseline)"
