#!/usr/bin/env bash
# valgrind memcheck over the C examples of the Release build in build/ (at small sizes) and
# one multi-process run: tests/fuzz/valgrind/ring_two_ranks.c (two ranks over UCX on
# loopback: all-reduce, ring shift, ring contrastive forward + backward), compiled here
# against build/. Every run must report 0 errors and 0 bytes definitely or indirectly lost
# (--error-exitcode, leaks counted as errors). No suppressions: with UCX's memory hooks off
# (below) UCX 1.13 on tcp gives memcheck nothing to report; add a UCX-only suppression
# file with a reason per entry if a later UCX does, never one for libflatmem.
# Usage: bash scripts/test-valgrind.sh   (after the Release build: scripts/test.sh makes it;
#        needs valgrind: scripts/install-deps.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

command -v valgrind >/dev/null || { echo "test-valgrind: valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
for program in clip_loss demo_large_batch reversible_transformer; do
  [ -x "build/examples/$program" ] ||
    { echo "test-valgrind: build/examples/$program missing: make the Release build in build/ first" >&2; exit 1; }
done
library_dir=$(dirname "$(find build/src -maxdepth 1 -name 'libflatmem.so.[0-9]*' -print -quit)")

memcheck=(valgrind --tool=memcheck --error-exitcode=99 --leak-check=full
          --show-leak-kinds=definite,indirect --errors-for-leak-kinds=definite,indirect
          --track-origins=yes --num-callers=30 --quiet)
# Small and quick under valgrind (~20-50x slower): 2 threads, small batches.
run() {
  local name=$1
  shift
  step "memcheck: $name"
  local log=build/valgrind-$name.log
  # A hard deadline per program; valgrind's reports go to $log.memcheck.
  if ! timeout 300 "${memcheck[@]}" --log-file="$log.memcheck" "$@" >"$log" 2>&1; then
    echo "test-valgrind: $name FAILED; its output and valgrind's reports:" >&2
    cat "$log" "$log.memcheck" >&2 || true
    exit 1
  fi
  tail -n 3 "$log"
  echo "test-valgrind: $name: 0 errors, 0 bytes definitely/indirectly lost"
}

export FLATMEM_CPU_ISA=${FLATMEM_CPU_ISA:-}   # valgrind runs the AVX-512 kernels too (it emulates them)
run clip_loss build/examples/clip_loss
run demo_large_batch build/examples/demo_large_batch --batch 512 --dim 32 --threads 2
run reversible_transformer build/examples/reversible_transformer

step "build the two-rank program against build/"
cc -std=c99 -Wall -Wextra -Werror -O1 -g -Iinclude tests/fuzz/valgrind/ring_two_ranks.c \
   -L"$library_dir" -Wl,-rpath,"$FLATMEM_ROOT/$library_dir" -lflatmem -o build/valgrind-ring_two_ranks
# UCX on loopback: TCP for the bootstrap, shared memory off (valgrind cannot follow its
# cross-process atomics), quiet; its memory hooks off (valgrind replaces malloc itself).
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n UCX_MEM_EVENTS=no \
       UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
run ring_two_ranks build/valgrind-ring_two_ranks
