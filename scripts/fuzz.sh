#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, FLATMEM_FUZZ=ON: clang, ASan + UBSan, the
# library instrumented too) in build-fuzz/ and runs one of them for SECONDS.
# Usage: bash scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
#   TARGET: fuzz_contrastive fuzz_sigmoid fuzz_reversible fuzz_cyclic fuzz_cyclic_stages
#           fuzz_comm_id fuzz_comm_env fuzz_abi
#   The corpus grows in build-fuzz/corpus/TARGET (seeded from tests/fuzz/corpus/TARGET);
#   crashes, leaks and timeouts land in build-fuzz/artifacts/TARGET/ and fail the run
#   (reproduce one with: bash scripts/fuzz.sh TARGET 0 build-fuzz/artifacts/TARGET/crash-...).
#   The comm targets dial fuzzed addresses, so they run in a loopback-only network
#   namespace (unshare --net, needs root); exit status 77 when none can be made.
# Prints "fuzz: TARGET: N executions in S s, coverage C edges (F features), corpus K files" at
# the end. FLATMEM_FUZZ_BREAK_ORACLE=1 makes the targets' oracles expect wrong answers on
# purpose: a run over the seed corpus must then fail (the check that the oracles can fail).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

[ $# -ge 2 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
target=$1
seconds=$2
shift 2
[ -f "tests/fuzz/$target.cpp" ] || { echo "fuzz: no target $target (tests/fuzz/$target.cpp)" >&2; exit 2; }
command -v clang >/dev/null && command -v clang++ >/dev/null ||
  { echo "fuzz: clang and clang++ are needed (Debian: apt-get install clang)" >&2; exit 1; }

step "build build-fuzz/ ($target)"
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  flatmem_configure build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" \
    -DFLATMEM_FUZZ=ON -DFLATMEM_BUILD_TESTS=OFF -DFLATMEM_BUILD_BENCH=OFF -DFLATMEM_BUILD_EXAMPLES=OFF \
    -DFLATMEM_WITH_CUDA=OFF -DFLATMEM_WITH_NCCL=OFF -DFLATMEM_WITH_UCX=ON >/dev/null
fi
flatmem_build build-fuzz --target "$target" >/dev/null

corpus=build-fuzz/corpus/$target
artifacts=build-fuzz/artifacts/$target
mkdir -p "$corpus" "$artifacts"
log=build-fuzz/$target.log
# The shared sanitizer runtime must be the first library loaded (libstdc++ comes first in
# the targets' dependency list otherwise).
runtime=$(clang++ -print-file-name=libclang_rt.asan-x86_64.so)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# UCX on loopback, quiet, without its memory hooks (they fight ASan's allocator).
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n \
       UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none

command=(env "LD_PRELOAD=$runtime" "build-fuzz/tests/fuzz/$target" -rss_limit_mb=2048 -timeout=20
         -max_len=1024 -print_final_stats=1 "-artifact_prefix=$artifacts/")
if [ "$seconds" -gt 0 ]; then
  command+=(-max_total_time="$seconds" "$corpus" "tests/fuzz/corpus/$target")
fi
command+=("$@")
case $target in
  fuzz_comm_*)
    if ! unshare --net true 2>/dev/null; then
      echo "fuzz: $target SKIPPED: cannot make a network namespace (unshare --net needs root);" \
           "the comm targets dial fuzzed addresses and run only inside one" >&2
      exit 77
    fi
    command=(unshare --net sh -c 'ip link set lo up && exec "$@"' sh "${command[@]}")
    ;;
esac

step "run $target for ${seconds}s (log: $log)"
status=0
"${command[@]}" >"$log" 2>&1 || status=$?
executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
if [ "$status" -ne 0 ]; then
  echo "fuzz: $target FAILED (exit status $status); the end of its log:" >&2
  grep -v -E '^#[0-9]+' "$log" | tail -n 60 >&2
  exit 1
fi
coverage=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1 | awk '{print $2 " edges (" $4 " features)"}' || true)
echo "fuzz: $target: ${executions:-?} executions in ${seconds} s, coverage ${coverage:-?}, corpus $(ls "$corpus" | wc -l) files"
