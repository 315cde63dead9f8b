#!/usr/bin/env bash
# Trains examples/jax/two_tower_clip.py with 4 ranks on this host (UCX over
# loopback) and checks its output: every rank exits 0, rank 0 reports that
# step 1 matches the single-process loss and that the loss fell.
#
# Usage: examples/jax/run_two_tower.sh [loop|mpirun] [extra arguments for the example]
#   loop    (default) a shell loop starting the 4 processes, FLATMEM_RANK /
#           FLATMEM_WORLD_SIZE / FLATMEM_COORDINATOR set for each;
#   mpirun  Open MPI's mpirun -n 4 (each rank reads OMPI_COMM_WORLD_RANK / _SIZE;
#           FLATMEM_COORDINATOR is still needed and passed with -x).
# Environment: PYTHON (default $FLATMEM_WHEEL_VENV/bin/python, else build/wheel-venv/bin/python: scripts/build-wheel.sh)
#   with flatmem_jax importable (the wheel: pip install ., or
#   PYTHONPATH=bindings/jax/python FLATMEM_JAX_LIBRARY=build/jax/libflatmem_jax.so);
#   RANKS (default 4); DEADLINE_S (default 120): every process is killed after it.
# Logs: $LOG_DIR (default a temporary folder), rank<r>.log each.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
mode=${1:-loop}
[ $# -gt 0 ] && shift
python=${PYTHON:-${FLATMEM_WHEEL_VENV:-$root/build/wheel-venv}/bin/python}
ranks=${RANKS:-4}
deadline=${DEADLINE_S:-120}
logs=${LOG_DIR:-$(mktemp -d)}
mkdir -p "$logs"
fail() { echo "run_two_tower: FAIL: $*" >&2; exit 1; }

# UCX on one host, embedded in Python; one flatmem thread per rank (4 ranks share the cores).
export UCX_TLS=${UCX_TLS:-tcp,self,posix} UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export UCX_WARN_UNUSED_ENV_VARS=n UCX_ERROR_SIGNALS= UCX_HANDLE_ERRORS=none
export JAX_PLATFORMS=cpu FLATMEM_JAX_NUM_THREADS=${FLATMEM_JAX_NUM_THREADS:-1}
# A port free now, for rank 0 to listen on.
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export FLATMEM_COORDINATOR=127.0.0.1:$port
example=("$python" "$here/two_tower_clip.py" "$@")

case $mode in
  loop)
    pids=()
    for ((r = 0; r < ranks; r++)); do
      FLATMEM_RANK=$r FLATMEM_WORLD_SIZE=$ranks timeout -k 5 "$deadline" "${example[@]}" \
        >"$logs/rank$r.log" 2>&1 &
      pids+=($!)
    done
    status=0
    for ((r = 0; r < ranks; r++)); do
      wait "${pids[$r]}" || { echo "run_two_tower: rank $r exited with status $?" >&2; status=1; }
    done
    ;;
  mpirun)
    command -v mpirun >/dev/null || fail "mpirun not found (Debian: apt-get install openmpi-bin)"
    as_root=()
    [ "$(id -u)" = 0 ] && as_root=(--allow-run-as-root)
    exports=()  # the variables above, and where flatmem_jax comes from when they are set
    for name in FLATMEM_COORDINATOR UCX_TLS UCX_NET_DEVICES UCX_WARN_UNUSED_ENV_VARS \
                UCX_ERROR_SIGNALS UCX_HANDLE_ERRORS JAX_PLATFORMS FLATMEM_JAX_NUM_THREADS \
                PYTHONPATH FLATMEM_JAX_LIBRARY; do
      [ -n "${!name+set}" ] && exports+=(-x "$name")
    done
    status=0
    # Every rank's output goes to one log, rank 0's lines tagged [1,0]<stdout>.
    timeout -k 5 "$deadline" mpirun "${as_root[@]}" --oversubscribe -n "$ranks" --tag-output \
      "${exports[@]}" "${example[@]}" >"$logs/rank0.log" 2>&1 || status=$?
    ;;
  *) fail "unknown mode '$mode' (loop or mpirun)" ;;
esac

cat "$logs/rank0.log"
[ "$status" = 0 ] || { tail -n 20 "$logs"/rank*.log >&2; fail "a rank failed (logs in $logs)"; }
grep -q "step 1 matches the single-process loss" "$logs/rank0.log" || fail "step 1 was not checked"
grep -q "loss fell" "$logs/rank0.log" || fail "the loss did not fall"
echo "run_two_tower: OK ($ranks ranks, $mode)"
