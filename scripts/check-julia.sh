#!/usr/bin/env bash
# The Julia binding's check, in place of running it (no Julia runtime exists on
# these machines). The constants, handle types and struct mirrors are generated
# (bindings/julia/generated.jl, by scripts/gen_julia.py); bindings/julia/
# check_ccalls.py compares every ccall of bindings/julia/*.jl with
# include/flatmem/*.h (and <dlpack/dlpack.h>), requires generated.jl to be what
# the headers give and its mirrors to lay out as the C compiler measures the C
# structs, a wrapper (or an allow-list entry with a reason) for every public C
# function and GC-safe brackets around every call that may wait.
#   1. its self-test: deliberate mistakes applied to the real sources must each
#      be reported (so the checker cannot silently pass);
#   2. the real check.
# Exits non-zero on any mismatch or any missed self-test mistake. The last line
# is "N passed, M failed" (checks of the real run + self-test cases).
# Usage: bash scripts/check-julia.sh [-v]
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

checker=bindings/julia/check_ccalls.py
verbose=()
[ "${1:-}" = "-v" ] && verbose=(-v)

step "julia: checker self-test"
selftest_out=$("$FLATMEM_PYTHON" "$checker" --self-test "${verbose[@]}" 2>&1)
selftest_rc=$?
printf '%s\n' "$selftest_out"

step "julia: ccalls vs include/flatmem/flatmem.h"
check_out=$("$FLATMEM_PYTHON" "$checker" --header include/flatmem/flatmem.h "${verbose[@]}" bindings/julia 2>&1)
check_rc=$?
printf '%s\n' "$check_out"

# The checker's last lines: "check_ccalls: self-test detected=D missed=M" and
# "check_ccalls: checks passed=P failed=F ccalls=N". A crash leaves them out.
field() { sed -n "s/^check_ccalls: $1.* $2=\([0-9]*\).*/\1/p" <<<"$3" | tail -n 1; }
detected=$(field self-test detected "$selftest_out")
missed=$(field self-test missed "$selftest_out")
passed=$(field checks passed "$check_out")
failed=$(field checks failed "$check_out")
ccalls=$(field checks ccalls "$check_out")
: "${detected:=0}" "${passed:=0}" "${ccalls:=0}"
# A run that failed without saying so (a crash: no summary line) counts as one failure.
if [ -z "$missed" ] || { [ "$selftest_rc" -ne 0 ] && [ "$missed" -eq 0 ]; }; then missed=1; fi
if [ -z "$failed" ] || { [ "$check_rc" -ne 0 ] && [ "$failed" -eq 0 ]; }; then failed=1; fi

echo
echo "julia ccall check: $ccalls ccalls match their C prototypes; $detected self-test mismatches detected, $missed missed"
echo "$((passed + detected)) passed, $((failed + missed)) failed"
[ "$selftest_rc" -eq 0 ] && [ "$check_rc" -eq 0 ] && [ "$missed" -eq 0 ] && [ "$failed" -eq 0 ]
