#!/usr/bin/env bash
# CI smoke of the libFuzzer targets (tests/fuzz/): builds them in build-fuzz/ (clang, ASan +
# UBSan) and runs each for FLATMEM_FUZZ_SECONDS (default 15) from its checked-in seed corpus,
# failing on any crash, leak, timeout or sanitizer report. Prints executions per target.
# The comm targets need a network namespace (root); where none can be made they are
# skipped with a message. Longer runs of one target: bash scripts/fuzz.sh TARGET SECONDS.
# Usage: bash scripts/test-fuzz.sh   (needs clang: scripts/install-deps.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

seconds=${FLATMEM_FUZZ_SECONDS:-15}
targets=(fuzz_contrastive fuzz_sigmoid fuzz_reversible fuzz_cyclic fuzz_cyclic_stages fuzz_comm_id
         fuzz_comm_env fuzz_abi)
summary=()
for target in "${targets[@]}"; do
  status=0
  line=$(bash scripts/fuzz.sh "$target" "$seconds" | tail -n 1) || status=$?
  case $status in
    0) summary+=("$line") ;;
    77) summary+=("fuzz: $target: SKIPPED (no network namespace)") ;;
    *) echo "test-fuzz: $target failed" >&2; exit 1 ;;
  esac
done
step "fuzz summary"
printf '%s\n' "${summary[@]}"
