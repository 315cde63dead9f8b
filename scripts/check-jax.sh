#!/usr/bin/env bash
# The JAX binding's check, against an INSTALLED flatmem:
#   1. the bindings' venv (scripts/python-env.sh: NumPy, JAX CPU, pytest);
#   2. libflatmem_jax.so from bindings/jax/CMakeLists.txt into build/jax/ (find_package(flatmem)
#      in PREFIX, XLA FFI headers from the venv's jaxlib, the CUDA handlers too when nvcc is found);
#   3. checks that it links the libflatmem.so.0 of PREFIX (RUNPATH, ldd);
#   4. pytest -v bindings/jax/tests with FLATMEM_JAX_LIBRARY and PYTHONPATH pointing at them.
# Usage: bash scripts/check-jax.sh [PREFIX]   (default $FLATMEM_PREFIX, i.e. build/prefix, made by
#        cmake --install build --prefix build/prefix). Exits non-zero on any failure, including
#        pytest collecting no tests (its exit status 5).
# Environment: FLATMEM_JAX_BUILD (default build/jax), FLATMEM_JAX_WITH_CUDA (AUTO|ON|OFF),
#              FLATMEM_VENV (default build/venv); extra arguments after PREFIX go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"
fail() { echo "check-jax: FAIL: $*" >&2; exit 1; }

prefix_arg=${1:-$FLATMEM_PREFIX}
[ $# -gt 0 ] && shift
[ -d "$prefix_arg" ] || fail "no install prefix at '$prefix_arg' (run: cmake --install build --prefix build/prefix)"
prefix=$(cd "$prefix_arg" && pwd)
config=$(find "$prefix" -path '*/cmake/flatmem/flatmemConfig.cmake' -print -quit)
[ -n "$config" ] || fail "$prefix holds no lib*/cmake/flatmem/flatmemConfig.cmake: not a flatmem install"
build=${FLATMEM_JAX_BUILD:-$FLATMEM_ROOT/build/jax}
python=$FLATMEM_VENV/bin/python

step "Python venv ($FLATMEM_VENV)"
bash scripts/python-env.sh

step "configure and build libflatmem_jax.so ($build) against $prefix"
# -U flatmem_DIR: find flatmem again in this PREFIX even when the cache remembers another one.
cmake -S bindings/jax -B "$build" -U flatmem_DIR -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" -DPython3_EXECUTABLE="$python" \
      -DFLATMEM_JAX_WITH_CUDA="${FLATMEM_JAX_WITH_CUDA:-AUTO}"
cmake --build "$build" -j "$FLATMEM_JOBS"
library=$build/libflatmem_jax.so
[ -f "$library" ] || fail "$library was not built"

step "linkage"
runpath=$(readelf -d "$library" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
echo "check-jax: RUNPATH $runpath"
resolved=$(ldd "$library" | sed -n 's/^[[:space:]]*libflatmem\.so\.[0-9]* => \([^ ]*\).*/\1/p')
[ -n "$resolved" ] || { ldd "$library"; fail "libflatmem.so.* does not resolve"; }
case "$(readlink -f "$resolved")" in
  "$prefix"/*) echo "check-jax: libflatmem resolves to $resolved" ;;
  *) fail "libflatmem resolves to $resolved, not into $prefix" ;;
esac

step "pytest bindings/jax/tests"
set +e
FLATMEM_JAX_LIBRARY=$library FLATMEM_JAX_EXPECT_PREFIX=$prefix \
  PYTHONPATH=$FLATMEM_ROOT/bindings/jax/python${PYTHONPATH:+:$PYTHONPATH} \
  "$python" -m pytest -v -p no:cacheprovider bindings/jax/tests "$@"
rc=$?
set -e
case $rc in
  0) echo "check-jax: OK" ;;
  5) fail "pytest collected no tests" ;;
  *) fail "pytest exit status $rc" ;;
esac
