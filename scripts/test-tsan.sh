#!/usr/bin/env bash
# ThreadSanitizer: a CPU-only Debug build (-O1) in build-tsan/ with every C/C++ target
# instrumented (FLATMEM_SANITIZE=thread), then the tests of the code that runs callbacks
# and tiles on several threads: reversible segments (OVERLAPPED's two chains, the rebuild
# thread, parallel_for), the thread pool, the rings (their error paths too) and the cyclic
# runtimes over the in-process communicator group, the per-thread error text, the GEMM's
# threads. (Every test whose rank threads share state is here; the UCX ones run ranks as
# processes, and UCX itself is not instrumented.) Any report fails the test (halt_on_error).
# Usage: bash scripts/test-tsan.sh   (scripts/test.sh runs it; deps must be installed)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

flatmem_configure build-tsan -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
  -DFLATMEM_SANITIZE=thread \
  -DFLATMEM_WITH_CUDA=OFF -DFLATMEM_WITH_NCCL=OFF -DFLATMEM_WITH_UCX=OFF \
  -DFLATMEM_BUILD_BENCH=OFF
targets=(test_reversible_values test_reversible_bad_input test_reversible_blocks test_contrastive_determinism
         test_contrastive_ring_schedule
         test_comm_local test_contrastive_ring test_contrastive_sigmoid_ring test_cyclic_train
         test_cyclic_errors test_cyclic_relay test_cyclic_relay_errors test_cyclic_stages_train
         test_cyclic_stages_errors test_cyclic_memory test_cyclic_stages_memory
         test_contrastive_ring_errors test_core_abi test_core_sgemm test_nccl_standin_engine)
flatmem_build build-tsan --target "${targets[@]}"

export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
cd build-tsan
ctest --output-on-failure --timeout "${FLATMEM_CTEST_TIMEOUT:-900}" \
  -R '^(reversible/(values|bitwise|dropout|block_seed|rebuild_error|bad_input|failing_callback|options)|blocks/|contrastive/determinism|comm/local/|contrastive/ring/|contrastive/sigmoid/ring/|cyclic/(train|errors|relay|memory)/|cyclic_stages/(train|errors|memory)/|core/last-error/|core/sgemm/.*threads|nccl-stand-in/engine:)'
