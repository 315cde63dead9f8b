"""Multi-process helpers of the communicator tests: launch `world_size` ranks
of python_rank_worker.py as subprocesses, each with a hard deadline, and
collect what each rank returned (a pickle per rank).

Bootstrap modes: "env" (FLATMEM_COORDINATOR=127.0.0.1:<free port>,
FLATMEM_RANK, FLATMEM_WORLD_SIZE) or "uid" (rank 0 makes a UniqueId on
127.0.0.1:0 and writes its hex to a file the other ranks read).
UCX runs over TCP on loopback (this machine's tests), with UCX's own signal
handlers off, as flatmem.h asks for embedded interpreters.
"""
import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "python_rank_worker.py")

UCX_ENV = {
    "UCX_TLS": "tcp,self",
    "UCX_NET_DEVICES": "lo",
    "UCX_WARN_UNUSED_ENV_VARS": "n",
    "UCX_ERROR_SIGNALS": "",
    "UCX_HANDLE_ERRORS": "none",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


def _ephemeral_low():
    """The first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A TCP port on 127.0.0.1 that a coordinator can bind a moment later: free now (a bind
    succeeds) and below the kernel's ephemeral range, so that no outgoing connection of a
    concurrent test (UCX opens many) is given it as its local port in between -- the race a
    port-0 pick loses under load. Random, so that concurrent launches rarely pick the same."""
    low = _ephemeral_low()
    pick = random.SystemRandom()
    for _ in range(100):
        port = pick.randrange(max(1024, low - 12000), low)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in [{max(1024, low - 12000)}, {low})")


class Ranks:
    """Running ranks: wait for them (deadline), kill one, read results."""

    def __init__(self, procs, outdir):
        self.procs = procs
        self.outdir = outdir

    def ready(self, rank):
        return os.path.exists(os.path.join(self.outdir, f"ready{rank}"))

    def wait_ready(self, ranks, deadline_s):
        """Until every rank of `ranks` has its communicator; fails at once, with the rank's output,
        when one exits before (rather than waiting out the deadline)."""
        end = time.monotonic() + deadline_s
        while not all(self.ready(r) for r in ranks):
            for r in ranks:
                if not self.ready(r) and self.procs[r].poll() is not None:
                    out = self.procs[r].stdout.read()
                    self.kill_all()
                    pytest.fail(f"rank {r} exited with {self.procs[r].returncode} before it was ready:\n{out}")
            if time.monotonic() > end:
                self.kill_all()
                pytest.fail(f"ranks {ranks} not ready within {deadline_s} s")
            time.sleep(0.02)

    def kill(self, rank):
        self.procs[rank].send_signal(signal.SIGKILL)

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            p.wait()

    def results(self, deadline_s, expect_killed=()):
        """Each rank's returned value (None for killed ranks); fails the test
        when a rank overruns the deadline or exits non-zero."""
        end = time.monotonic() + deadline_s
        logs = []
        for rank, p in enumerate(self.procs):
            try:
                out, _ = p.communicate(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill_all()
                pytest.fail(f"rank {rank} did not finish within {deadline_s} s (killed)")
            logs.append(out)
            if rank in expect_killed:
                continue
            assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{out}"
        values = []
        for rank in range(len(self.procs)):
            path = os.path.join(self.outdir, f"result{rank}.pickle")
            if rank in expect_killed:
                values.append(None)
                continue
            with open(path, "rb") as f:
                values.append(pickle.load(f))
        return values


def launch(tmp_path, worker, world_size, params=None, mode="env", extra_env=None):
    """Start world_size ranks running python_rank_worker.<worker>(comm, params)."""
    outdir = str(tmp_path)
    env = dict(os.environ, **UCX_ENV)
    env.update(extra_env or {})
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    with open(os.path.join(outdir, "params.pickle"), "wb") as f:
        pickle.dump(params or {}, f)
    if mode == "env":
        env["FLATMEM_COORDINATOR"] = f"127.0.0.1:{free_port()}"
    procs = []
    for rank in range(world_size):
        child_env = dict(env, FLATMEM_RANK=str(rank), FLATMEM_WORLD_SIZE=str(world_size))
        procs.append(subprocess.Popen([sys.executable, WORKER, worker, mode, outdir],
                                      env=child_env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return Ranks(procs, outdir)


def run(tmp_path, worker, world_size, params=None, mode="env", deadline_s=30):
    """launch + results: the list of what each rank returned."""
    return launch(tmp_path, worker, world_size, params, mode).results(deadline_s)
