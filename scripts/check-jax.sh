#!/usr/bin/env bash
# The JAX binding's check, against the INSTALLED wheel (scripts/build-wheel.sh installs it into
# the fresh venv $FLATMEM_WHEEL_VENV, default build/wheel-venv):
#   1. flatmem_jax and flatmem.jax import from the installed wheel, and its libflatmem_jax.so
#      (RUNPATH $ORIGIN/../flatmem) loads the wheel's libflatmem.so.<FLATMEM_ABI_VERSION>;
#   2. pytest -v bindings/jax/tests against the installed packages (no PYTHONPATH, no
#      FLATMEM_JAX_LIBRARY); the ring tests launch 1 to 4 Python processes over UCX on
#      loopback, each under a hard deadline, and examples/jax/run_two_tower.sh (loop, and
#      mpirun when installed);
#   3. the numeric tests once per CPU instruction set this processor runs.
# The CUDA handlers' driver program (tests/cuda_handler_check.cpp) is not in the wheel: when the
# wheel has CUDA handlers, it is built by the standalone CMake build of bindings/jax against the
# flatmem installed in $FLATMEM_PREFIX (or FLATMEM_JAX_CUDA_HANDLER_CHECK names it).
# Usage: bash scripts/check-jax.sh [pytest arguments]   (after scripts/build-wheel.sh). Exits
#        non-zero on any failure, including pytest collecting no tests (its exit status 5).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"
fail() { echo "check-jax: FAIL: $*" >&2; exit 1; }

python=$FLATMEM_WHEEL_VENV/bin/python
[ -x "$python" ] || fail "no $python (run scripts/build-wheel.sh first)"
# Run from / so that nothing of the checkout shadows the installed packages.
installed_dir() { (cd / && env -u PYTHONPATH "$python" -c "import os, $1; print(os.path.dirname(os.path.realpath($1.__file__)))"); }

step "the installed flatmem_jax ($FLATMEM_WHEEL_VENV)"
package=$(installed_dir flatmem_jax) || fail "the installed flatmem_jax does not import"
flatmem_dir=$(installed_dir flatmem)
case "$package" in
  "$(cd "$FLATMEM_ROOT" && pwd -P)"/bindings/*) fail "flatmem_jax imports from the checkout" ;;
esac
library=$package/libflatmem_jax.so
[ -f "$library" ] || fail "the installed flatmem_jax holds no libflatmem_jax.so ($package)"
echo "check-jax: flatmem_jax installed in $package"
(cd / && env -u PYTHONPATH "$python" -c "import flatmem.jax; print('check-jax: flatmem.jax ->', flatmem.jax.clip_loss.__module__)") ||
  fail "import flatmem.jax fails"
echo "check-jax: RUNPATH $(readelf -d "$library" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')"
# FLATMEM_ABI_VERSION of the header flatmem was built with: the library's SONAME.
abi=$(cd / && env -u PYTHONPATH "$python" -c 'import flatmem; print(flatmem.capi.ABI_VERSION)')
resolved=$(ldd "$library" | sed -n 's/^[[:space:]]*libflatmem\.so\.[0-9]* => \([^ ]*\).*/\1/p')
[ "$(readlink -f "$resolved")" = "$flatmem_dir/libflatmem.so.$abi" ] ||
  { ldd "$library"; fail "libflatmem resolves to '$resolved', not to $flatmem_dir/libflatmem.so.$abi"; }

step "pytest bindings/jax/tests (installed flatmem_jax and flatmem)"
test_env=(FLATMEM_JAX_EXPECT_PREFIX="$flatmem_dir" FLATMEM_JAX_EXPECT_INSTALLED=1)
cuda_check=${FLATMEM_JAX_CUDA_HANDLER_CHECK:-}
if [ -z "$cuda_check" ] && "$python" -c 'import flatmem_jax, sys; sys.exit(not flatmem_jax.has_cuda)' &&
   [ -d "$FLATMEM_PREFIX" ]; then
  # The wheel has CUDA handlers: build their driver program with the standalone CMake build of
  # bindings/jax against the installed flatmem of $FLATMEM_PREFIX (scripts/test.sh made it),
  # which also keeps that way of building the plugin working.
  step "bindings/jax standalone against $FLATMEM_PREFIX: the CUDA handlers' driver program (build/jax)"
  cmake -S bindings/jax -B build/jax -DCMAKE_PREFIX_PATH="$FLATMEM_PREFIX" \
        -DPython3_EXECUTABLE="$FLATMEM_VENV/bin/python" -DFLATMEM_JAX_WITH_CUDA=ON >/dev/null
  cmake --build build/jax -j "$FLATMEM_JOBS" --target flatmem_jax_cuda_handler_check
  cuda_check=$FLATMEM_ROOT/build/jax/flatmem_jax_cuda_handler_check
fi
[ -n "$cuda_check" ] && test_env+=(FLATMEM_JAX_CUDA_HANDLER_CHECK="$cuda_check")
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

step "the numeric tests once per CPU instruction set ($(flatmem_cpu_isas "$flatmem_dir"))"
for isa in $(flatmem_cpu_isas "$flatmem_dir"); do
  echo "check-jax: FLATMEM_CPU_ISA=$isa"
  env -u FLATMEM_JAX_LIBRARY -u PYTHONPATH "${test_env[@]}" FLATMEM_CPU_ISA="$isa" \
    "$python" -m pytest -q -p no:cacheprovider bindings/jax/tests/test_jax_values.py \
    bindings/jax/tests/test_jax_vmap.py bindings/jax/tests/test_jax_reversible.py \
    bindings/jax/tests/test_jax_sigmoid.py ||
    fail "the numeric tests under FLATMEM_CPU_ISA=$isa"
done
echo "check-jax: OK"
