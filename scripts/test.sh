#!/usr/bin/env bash
# The README's test command: bash scripts/test.sh
# 1. Debian packages (scripts/install-deps.sh)
# 2. Release build in build/ (CUDA kernels compiled for sm_90 when nvcc is found; GPU tests skip without a GPU)
# 3. the install check (scripts/check-install.sh), then an install into build/prefix that
#    the C-level bindings' checks (scripts/check-{java,rust,julia,readme}.sh) build and test
#    against; the Python wheel, built as `pip install .` builds it, auditwheel-repaired and
#    installed into a fresh venv (scripts/build-wheel.sh), which the Python, launcher (the
#    multi-process Python example under mpirun and under a shell loop) and JAX checks test;
#    then the docs (scripts/check-docs.sh: Doxygen + Sphinx, warnings are errors, coverage)
# 4. four network namespaces joined by a router, one rank each, under delay, loss, a bandwidth
#    cap, a partition and a killed host (scripts/test-netns.sh; exit 77 = skipped, said loudly)
#    then the ASan+UBSan build in build-asan/ and its ctest (scripts/test-sanitize.sh)
# 5. the ThreadSanitizer build of the threaded tests in build-tsan/ (scripts/test-tsan.sh), the
#    libFuzzer smoke in build-fuzz/ (scripts/test-fuzz.sh) and valgrind memcheck over the examples
#    and a two-rank run (scripts/test-valgrind.sh)
# 6. ctest in build/ -- last, so that its summary is the last thing printed.
# Stops at the first failing stage with a non-zero exit status.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

step "dependencies"
bash scripts/install-deps.sh
step "configure and build (Release, build/)"
flatmem_configure build -DCMAKE_BUILD_TYPE=Release
flatmem_build build
step "install check"
bash scripts/check-install.sh build
step "install into $FLATMEM_PREFIX for the bindings"
rm -rf "$FLATMEM_PREFIX"
cmake --install build --prefix "$FLATMEM_PREFIX" >/dev/null
step "the Python wheel (pip wheel ., auditwheel repair, a fresh venv: scripts/build-wheel.sh)"
bash scripts/build-wheel.sh
for binding in python launchers jax java rust julia readme; do
  step "bindings: $binding"
  case $binding in
    python|launchers|jax) bash "scripts/check-$binding.sh" ;;  # the wheel's venv
    *) bash "scripts/check-$binding.sh" "$FLATMEM_PREFIX" ;;
  esac
done
step "docs/: Doxygen and Sphinx without warnings, every C function and Python entry point in them"
bash scripts/check-docs.sh "$FLATMEM_WHEEL_VENV/bin/python"
step "multi-host runs over emulated networks (scripts/test-netns.sh; skipped without namespaces)"
rc=0
bash scripts/test-netns.sh build || rc=$?
[ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || exit "$rc"
step "ASan+UBSan build and tests (build-asan/)"
bash scripts/test-sanitize.sh
step "ThreadSanitizer build and tests (build-tsan/)"
bash scripts/test-tsan.sh
step "libFuzzer smoke: every target 15 s (build-fuzz/)"
bash scripts/test-fuzz.sh
step "valgrind memcheck: the examples and a two-rank UCX run (build/)"
bash scripts/test-valgrind.sh
step "tests (Release, build/)"
cd build
ctest --output-on-failure --timeout "${FLATMEM_CTEST_TIMEOUT:-900}"
