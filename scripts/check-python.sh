#!/usr/bin/env bash
# The Python binding's check, against the INSTALLED wheel (scripts/build-wheel.sh installs it
# into the fresh venv $FLATMEM_WHEEL_VENV, default build/wheel-venv):
#   1. the installed flatmem is the wheel's (not bindings/python/src) and its extension loads
#      the libflatmem.so.<FLATMEM_ABI_VERSION> inside the installed package;
#   2. pytest bindings/python/tests, verbose (NumPy, DLPack, flatmem.torch, the torchrun ring,
#      the example), with no PYTHONPATH;
#   3. the numeric tests once per CPU instruction set this processor runs.
# Exits non-zero when any step fails, including when pytest collects no test.
# Usage: bash scripts/check-python.sh   (after scripts/build-wheel.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
python=$FLATMEM_WHEEL_VENV/bin/python
[ -x "$python" ] || { echo "check-python: no $python (run scripts/build-wheel.sh first)" >&2; exit 1; }

step "the installed flatmem ($FLATMEM_WHEEL_VENV)"
installed=$(cd / && env -u PYTHONPATH "$python" -c 'import flatmem, os; print(os.path.dirname(os.path.realpath(flatmem.__file__)))')
echo "check-python: flatmem installed in $installed"
case "$installed" in
  "$(cd "$FLATMEM_ROOT" && pwd -P)"/bindings/*) echo "check-python: FAIL: flatmem imports from the checkout" >&2; exit 1 ;;
esac
# FLATMEM_ABI_VERSION of the header the extension was built with: the library's SONAME.
abi=$(cd / && env -u PYTHONPATH "$python" -c 'import flatmem; print(flatmem.capi.ABI_VERSION)')
ldd "$installed"/_capi*.so | grep -F "$installed/libflatmem.so.$abi (" ||
  { echo "check-python: FAIL: the extension does not load the wheel's libflatmem.so.$abi" >&2; exit 1; }

step "pytest bindings/python/tests"
cd "$FLATMEM_ROOT"
rc=0
env -u PYTHONPATH "$python" -m pytest -v -p no:cacheprovider bindings/python/tests || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "check-python: FAIL: pytest collected no tests" >&2
  exit 1
elif [ "$rc" -ne 0 ]; then
  echo "check-python: FAIL: pytest exit status $rc" >&2
  exit "$rc"
fi
step "the numeric tests once per CPU instruction set ($(flatmem_cpu_isas "$installed"))"
for isa in $(flatmem_cpu_isas "$installed"); do
  echo "check-python: FLATMEM_CPU_ISA=$isa"
  env -u PYTHONPATH FLATMEM_CPU_ISA=$isa "$python" -m pytest -q -p no:cacheprovider \
    bindings/python/tests/test_python_values.py bindings/python/tests/test_python_sigmoid.py \
    bindings/python/tests/test_python_reversible.py ||
    { echo "check-python: FAIL: the numeric tests under FLATMEM_CPU_ISA=$isa" >&2; exit 1; }
done
echo "check-python: OK"
