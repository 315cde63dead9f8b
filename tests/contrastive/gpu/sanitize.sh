#!/usr/bin/env bash
# compute-sanitizer over the small GPU case: sanitize.sh TEST_EXECUTABLE TOOL (memcheck | racecheck | ...).
# Exit 77 (the ctest SKIP_RETURN_CODE) with a "skipped: ..." line when there is no CUDA device or no
# compute-sanitizer (looked up on PATH, then under /usr/local/cuda); otherwise the sanitizer's verdict
# (--error-exitcode 1: any report fails the test).
set -uo pipefail
exe=$1
tool=$2
"$exe" --probe-device >/dev/null
case $? in
  0) ;;
  77) echo "skipped: no CUDA device"; exit 77 ;;
  *) echo "$exe --probe-device failed"; exit 1 ;;
esac
sanitizer=$(command -v compute-sanitizer || true)
for candidate in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -n "$sanitizer" ] || { [ -x "$candidate" ] && sanitizer=$candidate; }
done
if [ -z "$sanitizer" ]; then
  echo "skipped: compute-sanitizer not found (PATH, /usr/local/cuda)"
  exit 77
fi
exec "$sanitizer" --tool "$tool" --error-exitcode 1 "$exe" '--test-case=*sanitizer-case*'
