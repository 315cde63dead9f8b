#!/usr/bin/env bash
# The Python binding's check, against an INSTALLED flatmem:
#   1. the venv (scripts/python-env.sh: NumPy, ml_dtypes, pytest, JAX, setuptools from PyPI);
#   2. pip-installs bindings/python, built with `pkg-config flatmem` from PREFIX (swig on
#      bindings/swig/flatmem.i, the wrapper linked with an rpath to PREFIX's libdir);
#   3. pytest bindings/python/tests, verbose.
# Exits non-zero when any step fails, including when pytest collects no test.
# Usage: bash scripts/check-python.sh [PREFIX]   (default $FLATMEM_PREFIX = build/prefix, as made by
#        cmake --install build --prefix build/prefix)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

prefix=$(cd "${1:-$FLATMEM_PREFIX}" 2>/dev/null && pwd) ||
  { echo "check-python: no install prefix ${1:-$FLATMEM_PREFIX} (cmake --install build --prefix ...)" >&2; exit 1; }
pc=$(find "$prefix" -name flatmem.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || { echo "check-python: no flatmem.pc under $prefix" >&2; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
python=$FLATMEM_VENV/bin/python

step "Python environment ($FLATMEM_VENV)"
bash "$FLATMEM_ROOT/scripts/python-env.sh"

step "pip install bindings/python against $prefix ($(pkg-config --modversion flatmem))"
# Build in place without isolation (the venv's setuptools, offline); a stale build/ of an
# earlier prefix must not be reused.
rm -rf "$FLATMEM_ROOT/bindings/python/build" "$FLATMEM_ROOT/bindings/python/src/flatmem.egg-info"
"$python" -m pip install --disable-pip-version-check --no-build-isolation --no-deps --no-index \
  --force-reinstall "$FLATMEM_ROOT/bindings/python"
installed=$(cd /tmp && "$python" -c 'import flatmem, os; print(os.path.dirname(flatmem.__file__))')
echo "check-python: flatmem installed in $installed"
ldd "$installed"/_capi*.so | grep -F "$prefix" ||
  { echo "check-python: the extension does not load libflatmem from $prefix" >&2; exit 1; }

step "pytest bindings/python/tests"
cd "$FLATMEM_ROOT"
rc=0
"$python" -m pytest -v -p no:cacheprovider bindings/python/tests || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "check-python: FAIL: pytest collected no tests" >&2
  exit 1
elif [ "$rc" -ne 0 ]; then
  echo "check-python: FAIL: pytest exit status $rc" >&2
  exit "$rc"
fi
step "the numeric tests once per CPU instruction set ($(flatmem_cpu_isas "$prefix"))"
for isa in $(flatmem_cpu_isas "$prefix"); do
  echo "check-python: FLATMEM_CPU_ISA=$isa"
  FLATMEM_CPU_ISA=$isa "$python" -m pytest -q -p no:cacheprovider \
    bindings/python/tests/test_python_values.py bindings/python/tests/test_python_sigmoid.py \
    bindings/python/tests/test_python_reversible.py ||
    { echo "check-python: FAIL: the numeric tests under FLATMEM_CPU_ISA=$isa" >&2; exit 1; }
done
echo "check-python: OK"
