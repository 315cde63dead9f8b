#!/usr/bin/env bash
# The library's ABI against the baseline kept in the repository: libabigail's abidiff, and
# scripts/abi_compare.py for structs, enumerators and signatures (abidiff comes from Debian's
# abigail-tools, installed here with apt-get when missing).
#   tests/abi/libflatmem.so.1.abi   abidw of libflatmem for ABI 1 (public types; the handles
#                                   declaration-only, as callers see them)
#   tests/abi/evolution.suppr       the one thing abidiff is told to allow: fields appended at the end
#                                   of a struct. That suppression also hides same-size edits (a swap,
#                                   int64_t -> double, a field resized into padding), so
#                                   scripts/abi_compare.py decides about structs: the baseline's
#                                   members an exact prefix of the new ones (names, offsets, types),
#                                   the frozen structs unchanged, no padding anywhere, enumerators kept.
# Added functions and enumerators are allowed. Anything else fails: a removed or changed function, a
# parameter removed or retyped (handle types included), a field inserted, removed, resized, retyped
# or moved, padding, an enumerator removed or renumbered.
# Usage: bash scripts/check-abi.sh LIBRARY             check (the ctest test abi/abidiff)
#        bash scripts/check-abi.sh --update LIBRARY    rewrite the baseline from LIBRARY: only for an
#                                                      intended break, with the SONAME bumped
#                                                      (docs/abi.md, "Breaking the ABI on purpose")
#   --baseline FILE --headers DIR --frozen REGEX       another library's gate (tests/abi/gate/)
# LIBRARY needs its C API translation units' DWARF (src/CMakeLists.txt compiles them with -g).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

update=0 baseline= headers=$FLATMEM_ROOT/include/flatmem
frozen='^(flatmem_reversible_function|flatmem_reversible_block|flatmem_comm_unique_id)$'
suppressions=$FLATMEM_ROOT/tests/abi/evolution.suppr
while [ $# -gt 1 ]; do
  case $1 in
    --update) update=1; shift ;;
    --baseline) baseline=$2; shift 2 ;;
    --headers) headers=$2; shift 2 ;;
    --frozen) frozen=$2; shift 2 ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || { sed -n '2,21p' "$0" >&2; exit 2; }
library=$1
[ -f "$library" ] || { echo "check-abi: no library $library" >&2; exit 1; }
command -v abidiff >/dev/null || apt_install abigail-tools
soname=$(objdump -p "$library" | sed -n 's/^ *SONAME *//p')
baseline=${baseline:-$FLATMEM_ROOT/tests/abi/$soname.abi}

# The corpus as callers see it: types defined in the public headers, the rest (the handles'
# definitions inside the library) declaration-only -- kept as opaque types, never dropped, so a
# handle parameter removed or retyped is a change like any other.
write_corpus() {
  abidw --headers-dir "$headers" --drop-private-types --exported-interfaces-only \
        --no-corpus-path --no-comp-dir-path --short-locs --out-file "$2" "$1"
}

if [ "$update" = 1 ]; then
  write_corpus "$library" "$baseline"
  python3 "$FLATMEM_ROOT/scripts/abi_compare.py" --frozen "$frozen" "$baseline" "$baseline"
  echo "check-abi: wrote $baseline ($(grep -c '<elf-symbol ' "$baseline") functions)"
  exit 0
fi
[ -f "$baseline" ] || {
  echo "check-abi: FAIL: no baseline $baseline for SONAME $soname; a new SONAME needs" \
       "'bash scripts/check-abi.sh --update $library' (docs/abi.md)" >&2
  exit 1
}
current=$(mktemp --suffix=.abi)
trap 'rm -f "$current"' EXIT
write_corpus "$library" "$current"
set +e
report=$(abidiff --no-added-syms --suppressions "$suppressions" "$baseline" "$current" 2>&1)
rc=$?
compare=$(python3 "$FLATMEM_ROOT/scripts/abi_compare.py" --frozen "$frozen" "$baseline" "$current")
compare_rc=$?
set -e
# abidiff's status bits: 1 error, 2 usage error, 4 ABI change, 8 incompatible ABI change.
if [ "$rc" -ne 0 ] || [ "$compare_rc" -ne 0 ]; then
  [ "$rc" -eq 0 ] || echo "$report"
  echo "$compare"
  echo "check-abi: FAIL: against $baseline (abidiff status $rc, struct/signature check status $compare_rc):" \
       "the change above breaks ABI $soname (only new functions, new enumerators and fields appended" \
       "8-byte aligned at the end of a non-frozen struct keep it)" >&2
  exit 1
fi
echo "$compare"
echo "check-abi: OK: $library keeps the ABI of $(basename "$baseline")" \
     "($(grep -c '<elf-symbol ' "$baseline") functions in the baseline)"
