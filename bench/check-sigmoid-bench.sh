#!/usr/bin/env bash
# The sigmoid (SigLIP) loss benchmark's check: a Release CPU build in build/ (configured as
# scripts/common.sh does, CUDA off), the sigmoid suites of ctest (values and refused input
# under every CPU ISA the processor has; the bench/sigmoid_smoke tests: sigmoid against
# sigmoid-naive within derived bounds; bench/log1p_unit_check: the kernel's fp32 log1p), then `contrastive_bench --loss sigmoid --quick` and,
# when the bindings' venv has JAX, `jax_peer_bench.py --loss sigmoid` at one small size. Every
# step under a hard deadline. Timings printed here are for show: the machine may be busy.
#   bash bench/check-sigmoid-bench.sh            # -j2 (FLATMEM_JOBS_OVERRIDE=N for more)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/common.sh"
cd "$FLATMEM_ROOT"
FLATMEM_JOBS=${FLATMEM_JOBS_OVERRIDE:-2}

step "configure and build (Release, CUDA off, build/)"
flatmem_configure build -DCMAKE_BUILD_TYPE=Release -DFLATMEM_WITH_CUDA=OFF >/dev/null
# the targets ctest -R 'sigmoid|log1p' runs; the UCX ring test exists only where UCX was found
targets=(isa_run test_contrastive_sigmoid_values test_contrastive_sigmoid_bad_input
         test_contrastive_sigmoid_ring contrastive_bench log1p_unit_check)
if cmake --build build --target help | grep -qw test_contrastive_sigmoid_ring_ucx; then
  targets+=(test_contrastive_sigmoid_ring_ucx)
fi
timeout 1800 cmake --build build -j "$FLATMEM_JOBS" --target "${targets[@]}"

step "ctest -R 'sigmoid|log1p'"
(cd build && ctest -R 'sigmoid|log1p' --output-on-failure --timeout 300)

step "contrastive_bench --loss sigmoid --quick --check"
timeout 600 build/bench/contrastive_bench --loss sigmoid --quick --check

python=$FLATMEM_WHEEL_VENV/bin/python   # scripts/build-wheel.sh: the wheel and JAX
if [ -x "$python" ] && "$python" -c "import flatmem.jax" 2>/dev/null; then
  step "jax_peer_bench.py --loss sigmoid (b = 512, one timed call)"
  timeout 600 "$python" bench/jax_peer_bench.py --loss sigmoid --sizes 512 --reps 1
else
  step "jax_peer_bench.py skipped: no flatmem.jax in $FLATMEM_WHEEL_VENV (bash scripts/build-wheel.sh makes it)"
fi
echo "check-sigmoid-bench: OK"
