#!/usr/bin/env bash
# The JAX binding's check, against an INSTALLED flatmem:
#   1. the bindings' venv (scripts/python-env.sh: NumPy, JAX CPU, pytest);
#   2. the SWIG package flatmem (bindings/python, for flatmem.jax) pip-installed against PREFIX
#      as scripts/check-python.sh does it, unless the venv already has this checkout's flatmem
#      (with flatmem/jax.py) linked to PREFIX's libflatmem;
#   3. pip install --no-build-isolation bindings/jax: its setup.py runs CMake on
#      bindings/jax/CMakeLists.txt (find_package(flatmem) in the prefix `pkg-config flatmem`
#      names, XLA FFI headers from the venv's jaxlib, the CUDA handlers too when nvcc is found)
#      in build/jax/ and ships libflatmem_jax.so inside the flatmem_jax package;
#   4. checks that the installed libflatmem_jax.so links the libflatmem.so.0 of PREFIX (RUNPATH, ldd);
#   5. pytest -v bindings/jax/tests against the installed packages (no PYTHONPATH, no
#      FLATMEM_JAX_LIBRARY); the ring tests launch 1 to 4 Python processes over UCX on
#      loopback, each under a hard deadline, and examples/jax/run_two_tower.sh (loop, and
#      mpirun when installed).
# Usage: bash scripts/check-jax.sh [PREFIX]   (default $FLATMEM_PREFIX, i.e. build/prefix, made by
#        cmake --install build --prefix build/prefix). Exits non-zero on any failure, including
#        pytest collecting no tests (its exit status 5).
# Environment: FLATMEM_JAX_BUILD (CMake build folder, default build/jax), FLATMEM_JAX_WITH_CUDA
#              (AUTO|ON|OFF), FLATMEM_VENV (default build/venv); extra arguments after PREFIX go
#              to pytest.
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
pc=$(find "$prefix" -name flatmem.pc -path '*/pkgconfig/*' -print -quit)
[ -n "$pc" ] || fail "$prefix holds no lib*/pkgconfig/flatmem.pc: not a flatmem install"
export PKG_CONFIG_PATH=$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
case "$(cd "$(pkg-config --variable=prefix flatmem)" 2>/dev/null && pwd -P)" in
  "$(cd "$prefix" && pwd -P)") ;;
  *) fail "pkg-config finds flatmem in '$(pkg-config --variable=prefix flatmem)', not in $prefix" ;;
esac
build=${FLATMEM_JAX_BUILD:-$FLATMEM_ROOT/build/jax}
python=$FLATMEM_VENV/bin/python
pip() { "$python" -m pip --disable-pip-version-check "$@"; }
# Run from / so that nothing of the checkout shadows the installed packages.
installed_dir() { (cd / && "$python" -c "import os, $1; print(os.path.dirname(os.path.realpath($1.__file__)))"); }

step "Python venv ($FLATMEM_VENV)"
bash scripts/python-env.sh

step "the SWIG package flatmem (flatmem.jax) against $prefix"
swig_ok=no
if flatmem_dir=$(installed_dir flatmem 2>/dev/null) &&
   cmp -s "$flatmem_dir/jax.py" bindings/python/src/flatmem/jax.py &&
   ldd "$flatmem_dir"/_capi*.so 2>/dev/null | grep -F "$prefix/" >/dev/null; then
  swig_ok=yes
  echo "check-jax: flatmem already installed in $flatmem_dir, linked to $prefix"
fi
if [ "$swig_ok" = no ]; then
  # As scripts/check-python.sh: in place, no isolation, offline, no stale build/ of another prefix.
  rm -rf bindings/python/build bindings/python/src/flatmem.egg-info
  pip install --no-build-isolation --no-deps --no-index --force-reinstall bindings/python
  flatmem_dir=$(installed_dir flatmem)
  ldd "$flatmem_dir"/_capi*.so | grep -F "$prefix/" >/dev/null || fail "flatmem's extension does not load libflatmem from $prefix"
fi

step "pip install bindings/jax against $prefix ($(pkg-config --modversion flatmem)), CMake build in $build"
rm -rf bindings/jax/build bindings/jax/python/flatmem_jax.egg-info
FLATMEM_JAX_BUILD_DIR=$build FLATMEM_JAX_WITH_CUDA=${FLATMEM_JAX_WITH_CUDA:-AUTO} \
  pip install --no-build-isolation --no-deps --no-index --force-reinstall bindings/jax
package=$(installed_dir flatmem_jax) || fail "the installed flatmem_jax does not import"
library=$package/libflatmem_jax.so
[ -f "$library" ] || fail "the installed flatmem_jax holds no libflatmem_jax.so ($package)"
echo "check-jax: flatmem_jax installed in $package"
(cd / && "$python" -c "import flatmem.jax; print('check-jax: flatmem.jax ->', flatmem.jax.clip_loss.__module__)") ||
  fail "import flatmem.jax fails"

step "linkage"
runpath=$(readelf -d "$library" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')
echo "check-jax: RUNPATH $runpath"
resolved=$(ldd "$library" | sed -n 's/^[[:space:]]*libflatmem\.so\.[0-9]* => \([^ ]*\).*/\1/p')
[ -n "$resolved" ] || { ldd "$library"; fail "libflatmem.so.* does not resolve"; }
case "$(readlink -f "$resolved")" in
  "$prefix"/*) echo "check-jax: libflatmem resolves to $resolved" ;;
  *) fail "libflatmem resolves to $resolved, not into $prefix" ;;
esac

step "pytest bindings/jax/tests (installed flatmem_jax and flatmem)"
test_env=(FLATMEM_JAX_EXPECT_PREFIX="$prefix" FLATMEM_JAX_EXPECT_INSTALLED=1)
# The CUDA handlers' driver program (built when nvcc is found) stays in the CMake build folder.
cuda_check=$build/flatmem_jax_cuda_handler_check
[ -x "$cuda_check" ] && test_env+=(FLATMEM_JAX_CUDA_HANDLER_CHECK="$cuda_check")
set +e
env -u FLATMEM_JAX_LIBRARY -u PYTHONPATH "${test_env[@]}" \
  "$python" -m pytest -v -p no:cacheprovider bindings/jax/tests "$@"
rc=$?
set -e
case $rc in
  0) ;;
  5) fail "pytest collected no tests" ;;
  *) fail "pytest exit status $rc" ;;
esac

step "the numeric tests once per CPU instruction set ($(flatmem_cpu_isas "$prefix"))"
for isa in $(flatmem_cpu_isas "$prefix"); do
  echo "check-jax: FLATMEM_CPU_ISA=$isa"
  env -u FLATMEM_JAX_LIBRARY -u PYTHONPATH "${test_env[@]}" FLATMEM_CPU_ISA="$isa" \
    "$python" -m pytest -q -p no:cacheprovider bindings/jax/tests/test_jax_values.py \
    bindings/jax/tests/test_jax_vmap.py bindings/jax/tests/test_jax_reversible.py \
    bindings/jax/tests/test_jax_sigmoid.py ||
    fail "the numeric tests under FLATMEM_CPU_ISA=$isa"
done
echo "check-jax: OK"
