"""Launching the ranks of a multi-process test: world_size Python processes
over UCX on loopback, each with FLATMEM_RANK / FLATMEM_WORLD_SIZE /
FLATMEM_COORDINATOR (a free port on 127.0.0.1), all under ONE hard
deadline: a rank still running when it passes is killed, with the others,
and the test fails showing what each printed. No test may hang."""
import dataclasses
import os
import pathlib
import subprocess
import sys
import time

import flatmem_jax
from python_ranks import free_port

TESTS = pathlib.Path(__file__).resolve().parent
WORKER = TESTS / "ring_worker.py"

# UCX on one host, embedded in Python (FIELD-NOTES: UCX 1.13).
UCX_ENV = {
    "UCX_TLS": "tcp,self,posix",
    "UCX_NET_DEVICES": "lo",
    "UCX_WARN_UNUSED_ENV_VARS": "n",
    "UCX_ERROR_SIGNALS": "",
    "UCX_HANDLE_ERRORS": "none",
}




def child_environment(rank, world_size, coordinator, extra=None):
    """The environment of one rank: this one, the UCX recipe, the rank's
    variables, and the module path this process imported flatmem_jax and the
    test helpers from (installed or the source tree, see conftest.py)."""
    env = dict(os.environ)
    env.update(UCX_ENV)
    paths = [str(TESTS), str(TESTS.parents[1] / "python" / "tests"),
             str(pathlib.Path(flatmem_jax.__file__).resolve().parents[1])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(JAX_PLATFORMS="cpu", FLATMEM_JAX_NUM_THREADS="1", FLATMEM_RANK=str(rank),
               FLATMEM_WORLD_SIZE=str(world_size), FLATMEM_COORDINATOR=coordinator)
    env.update(extra or {})
    return env


@dataclasses.dataclass
class Rank:
    rank: int
    returncode: int
    stdout: str
    stderr: str

    def lines(self, tag):
        """The words after `tag` of each stdout line starting with it."""
        return [line.split()[1:] for line in self.stdout.splitlines() if line.split()[:1] == [tag]]

    def describe(self):
        return (f"--- rank {self.rank}: exit status {self.returncode}\n{self.stdout[-3000:]}"
                f"\n--- stderr:\n{self.stderr[-3000:]}")


def launch(world_size, args, *, deadline_s, env=None, command=None):
    """Runs `python ring_worker.py *args` (or `command`) as world_size ranks;
    returns their Rank records once all exited. Kills every rank and raises
    AssertionError when the deadline passes first."""
    coordinator = f"127.0.0.1:{free_port()}"
    command = command or [sys.executable, str(WORKER)]
    procs = [subprocess.Popen([*command, *map(str, args)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=child_environment(r, world_size, coordinator, env))
             for r in range(world_size)]
    end = time.monotonic() + deadline_s
    ranks = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=max(0.1, end - time.monotonic()))
            ranks.append(Rank(r, p.returncode, out, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        report = []
        for r, p in enumerate(procs):
            out, err = p.communicate()
            report.append(Rank(r, p.returncode, out, err).describe())
        raise AssertionError(f"{world_size} ranks of {args} ran past the {deadline_s} s deadline "
                             "and were killed:\n" + "\n".join(report)) from None
    return ranks


def assert_all_succeeded(ranks):
    failed = [r for r in ranks if r.returncode != 0]
    assert not failed, "\n".join(r.describe() for r in failed)
