#!/usr/bin/env bash
# The multi-process Python example, examples/python/ring_clip_numpy.py, under the launchers
# people use, against the INSTALLED wheel (scripts/build-wheel.sh's venv, $FLATMEM_WHEEL_VENV):
#   (a) Open MPI: mpirun -n 4 (flatmem reads OMPI_COMM_WORLD_RANK / _SIZE);
#   (b) a plain shell loop setting FLATMEM_RANK / FLATMEM_WORLD_SIZE.
# Both use FLATMEM_COORDINATOR=127.0.0.1:<a free port> and UCX over loopback. Every run has a
# hard deadline (timeout kills it); both must finish, print "OK", and print the same loss of
# every step (the ring loss is bitwise reproducible for fixed ranks and shapes).
# Usage: bash scripts/check-launchers.sh   (after scripts/build-wheel.sh)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
fail() { echo "check-launchers: FAIL: $*" >&2; exit 1; }

python=$FLATMEM_WHEEL_VENV/bin/python
[ -x "$python" ] || fail "no $python (run scripts/build-wheel.sh first)"
example=$FLATMEM_ROOT/examples/python/ring_clip_numpy.py
ranks=4
deadline=90   # seconds per launch (the runs take a few seconds)
out=$FLATMEM_ROOT/build/launchers
rm -rf "$out"
mkdir -p "$out"

step "the installed flatmem ($FLATMEM_WHEEL_VENV)"
(cd / && env -u PYTHONPATH "$python" -c 'import flatmem; print("check-launchers: flatmem", flatmem.capi.version(), "from", flatmem.__file__)') ||
  fail "import flatmem fails in $FLATMEM_WHEEL_VENV"

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo UCX_WARN_UNUSED_ENV_VARS=n UCX_ERROR_SIGNALS= UCX_HANDLE_ERRORS=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# the launchers' own variables must not leak into the other launch
unset FLATMEM_RANK FLATMEM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE

step "(a) mpirun -n $ranks"
command -v mpirun >/dev/null || fail "mpirun not found (Debian: apt-get install openmpi-bin)"
root_flags=()
[ "$(id -u)" -eq 0 ] && root_flags=(--allow-run-as-root)
export FLATMEM_COORDINATOR=127.0.0.1:$(free_port)
rc=0
timeout -k 5 "$deadline" mpirun "${root_flags[@]}" --oversubscribe -n "$ranks" \
  -x FLATMEM_COORDINATOR -x UCX_TLS -x UCX_NET_DEVICES -x UCX_WARN_UNUSED_ENV_VARS -x UCX_ERROR_SIGNALS \
  -x UCX_HANDLE_ERRORS -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS \
  "$python" "$example" >"$out/mpirun.txt" 2>&1 || rc=$?
cat "$out/mpirun.txt"
[ "$rc" -eq 0 ] || fail "mpirun exited with $rc (124: it overran ${deadline} s and was killed)"

step "(b) a shell loop: FLATMEM_RANK=0..$((ranks - 1)) FLATMEM_WORLD_SIZE=$ranks"
export FLATMEM_COORDINATOR=127.0.0.1:$(free_port)
pids=()
for ((r = 0; r < ranks; ++r)); do
  FLATMEM_RANK=$r FLATMEM_WORLD_SIZE=$ranks timeout -k 5 "$deadline" "$python" "$example" \
    >"$out/loop$r.txt" 2>&1 &
  pids+=($!)
done
failed=0
for ((r = 0; r < ranks; ++r)); do
  rc=0
  wait "${pids[$r]}" || rc=$?
  [ "$rc" -eq 0 ] || { echo "check-launchers: rank $r exited with $rc" >&2; cat "$out/loop$r.txt" >&2; failed=1; }
done
cat "$out/loop0.txt"
[ "$failed" -eq 0 ] || fail "the shell-loop launch failed (124: a rank overran ${deadline} s and was killed)"

step "both launches agree"
grep '^step ' "$out/mpirun.txt" | sed 's/ (float64.*//' >"$out/mpirun.loss"
grep '^step ' "$out/loop0.txt" | sed 's/ (float64.*//' >"$out/loop.loss"
[ -s "$out/mpirun.loss" ] || fail "mpirun printed no loss"
grep -q "ring_clip_numpy: OK, $ranks ranks" "$out/mpirun.txt" || fail "mpirun: no OK line"
grep -q "ring_clip_numpy: OK, $ranks ranks" "$out/loop0.txt" || fail "shell loop: no OK line"
diff "$out/mpirun.loss" "$out/loop.loss" || fail "the two launches printed different losses"
echo "check-launchers: OK ($(wc -l <"$out/mpirun.loss") steps, the same losses under mpirun and the shell loop)"
