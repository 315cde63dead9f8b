#!/usr/bin/env bash
# The ABI gate's own test: each kind of change that breaks callers of a released library is applied
# to a scratch copy of a stand-in header + library (tests/abi/gate/standin.{h,c}, flatmem's shapes in
# miniature), which is rebuilt and judged by scripts/check-abi.sh against the pristine baseline. Every
# incompatible change must be REJECTED, every compatible one ACCEPTED; any other verdict fails this
# script (ctest abi/gate_rejects_incompatible_changes). Usage: bash tests/abi/gate/check-gate.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
frozen='^standin_callback$'

# build DIR: compile DIR/standin.c against DIR/standin.h into DIR/libstandin.so (DWARF included).
build() { gcc -std=c99 -g -O1 -shared -fPIC -I "$1" -Wl,-soname,libstandin.so.1 -o "$1/libstandin.so" "$1/standin.c"; }
gate() { bash "$root/scripts/check-abi.sh" --baseline "$scratch/baseline.abi" --headers "$1" --frozen "$frozen" "$1/libstandin.so"; }

mkdir "$scratch/pristine"
cp "$here/standin.h" "$here/standin.c" "$scratch/pristine/"
build "$scratch/pristine"
bash "$root/scripts/check-abi.sh" --update --baseline "$scratch/baseline.abi" --headers "$scratch/pristine" \
     --frozen "$frozen" "$scratch/pristine/libstandin.so" >/dev/null

failures=0 cases=0
# expect VERDICT NAME PERL-EXPRESSION: apply the expression to both files of a scratch copy, rebuild,
# and compare the gate's verdict with VERDICT (accepted / rejected).
expect() {
  local verdict=$1 name=$2 edit=$3 dir="$scratch/case$cases" got
  cases=$((cases + 1))
  mkdir "$dir"
  cp "$here/standin.h" "$here/standin.c" "$dir/"
  perl -0pi -e "$edit" "$dir/standin.h" "$dir/standin.c"
  if cmp -s "$dir/standin.h" "$here/standin.h" && cmp -s "$dir/standin.c" "$here/standin.c"; then
    echo "check-gate: FAIL: '$name': the edit changed nothing (the stand-in moved on?)"; failures=$((failures + 1)); return
  fi
  build "$dir"
  if gate "$dir" >"$dir/gate.log" 2>&1; then got=accepted; else got=rejected; fi
  if [ "$got" = "$verdict" ]; then
    printf 'check-gate: ok   %-8s %s\n' "$got" "$name"
    [ "$got" = accepted ] || { grep -m2 -E '^abi-compare: [a-z]+ ?[a-z_]+:|\[[A-Z]\]' "$dir/gate.log" || true; } |
                             sed 's/^/                    /'
  else
    printf 'check-gate: FAIL %-8s %s (expected %s)\n' "$got" "$name" "$verdict"; sed 's/^/    /' "$dir/gate.log"
    failures=$((failures + 1))
  fi
}

# Compatible: the gate must let these through.
expect accepted "a comment edited"                   's/stand-in for flatmem.h/stand-in for flatmem.h (edited)/'
expect accepted "an int64_t field appended"          's/(  int32_t reserved0;\n)/$1  int64_t added;\n/'
expect accepted "two int32_t fields appended"        's/(  int32_t reserved0;\n)/$1  int32_t added;\n  int32_t added2;\n/'
expect accepted "a function added"                   's/(standin_status standin_run\(standin_thing_t \*thing, const standin_callback \*callback\)(;| \{ return STANDIN_OK; \}))/$1\nstandin_status standin_added(standin_thing_t *thing)$2/'
expect accepted "an enumerator added"                's/(  STANDIN_BAD = 1,\n)/$1  STANDIN_WORSE = 2,\n/'
expect accepted "a handle's private definition grown" 's/  int x;\n/  int x;\n  double more[4];\n/'
expect accepted "a parameter renamed"                's/standin_comm_t \*comm\)/standin_comm_t *link)/'

# Incompatible: every one must be rejected.
expect rejected "a handle parameter removed"         's/standin_destroy\(standin_thing_t \*thing\)/standin_destroy(void)/'
expect rejected "a handle retyped (thing_t * -> comm_t *)" 's/standin_attach\(standin_thing_t \*thing/standin_attach(standin_comm_t *thing/'
expect rejected "a parameter added"                  's/standin_destroy\(standin_thing_t \*thing\)/standin_destroy(standin_thing_t *thing, int flags)/'
expect rejected "a function removed"                 's/standin_status standin_attach\([^)]*\)[^\n]*\n//'
expect rejected "two members swapped"                's/  int64_t count;\n  int64_t limit;\n/  int64_t limit;\n  int64_t count;\n/'
expect rejected "int64_t -> double (same size)"      's/  int64_t count;/  double count;/'
expect rejected "int64_t -> int32_t (padding after)" 's/  int64_t count;/  int32_t count;/'
expect rejected "int64_t -> uint64_t (same size)"    's/  int64_t limit;/  uint64_t limit;/'
expect rejected "the last int32_t grown into the reserved bytes" 's/  int32_t mode;\n  int32_t reserved0;\n/  int64_t mode;\n/'
expect rejected "a reserved field renamed"           's/int32_t reserved0;/int32_t flags;/'
expect rejected "one int32_t appended (tail padding)" 's/(  int32_t reserved0;\n)/$1  int32_t added;\n/'
expect rejected "a field inserted mid-struct"        's/(  int64_t count;\n)/$1  int64_t inserted;\n/'
expect rejected "a field removed"                    's/  double scale;\n//'
expect rejected "a pointer field retyped"            's/  const int64_t \*sizes;/  const int32_t *sizes;/'
expect rejected "an enumerator renumbered"           's/STANDIN_BAD = 1/STANDIN_BAD = 3/'
expect rejected "an enumerator removed"              's/  STANDIN_BAD = 1,\n//'
expect rejected "a frozen struct appended to"        's/(  void \*user;\n)/$1  void *more;\n/'
expect rejected "the return type changed"            's/standin_status standin_destroy/int64_t standin_destroy/g'

echo "check-gate: $((cases - failures)) of $cases verdicts as expected"
[ "$failures" -eq 0 ]
