#!/usr/bin/env bash
# ASan + UBSan: a CPU-only Debug build (-O1, asserts on) in build-asan/ with every C/C++
# target sanitized (FLATMEM_SANITIZE), then its ctest. Leak checking is on; any report
# fails the test that made it (UBSan does not recover, ASan/LSan exit non-zero).
# This build also routes every bf16 tile product through the AVX512_BF16 kernels, over
# SIMDe's emulation (FLATMEM_BF16_EMULATED, FLATMEM_TEST_EMULATE_BF16=1), so that on any
# machine the whole bf16 loss -- walk, workspace carving, packing, tails -- runs through
# them under ASan; the other builds keep the processor's own path.
# Usage: bash scripts/test-sanitize.sh   (scripts/test.sh runs it; deps must be installed)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

flatmem_configure build-asan -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
  -DFLATMEM_SANITIZE=address,undefined -DFLATMEM_BF16_EMULATED=ON \
  -DFLATMEM_WITH_CUDA=OFF -DFLATMEM_WITH_NCCL=OFF -DFLATMEM_WITH_UCX=OFF \
  -DFLATMEM_BUILD_BENCH=OFF
flatmem_build build-asan

export ASAN_OPTIONS=detect_leaks=1:strict_init_order=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export FLATMEM_TEST_EMULATE_BF16=1
export LSAN_OPTIONS=suppressions=$FLATMEM_ROOT/.ci/lsan.supp:print_suppressions=0
cd build-asan
ctest --output-on-failure --timeout "${FLATMEM_CTEST_TIMEOUT:-900}"
