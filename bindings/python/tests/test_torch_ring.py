"""flatmem.torch's ring under torchrun (torch's own launcher, 4 processes on this machine): the
values of one process on the concatenated batch, over uneven shards, with a communicator from
the process group and one from torchrun's environment; DDP's gradients; a rank that disappears
mid-step fails the others with flatmem's error, without a hang. The checks themselves are in
torch_ring_worker.py; here each launch is held to a deadline and its output read."""
import os
import pathlib
import subprocess
import sys

import pytest
from python_ranks import free_port

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "torch_ring_worker.py"




def torchrun(mode, ranks=4, timeout=240):
    return torchrun_worker(WORKER.name, mode, ranks, timeout)


def torchrun_worker(worker, mode, ranks, timeout, *more):
    """python -m torch.distributed.run of `worker` (a path, or a file of tests/) `mode` `more...` on
    `ranks` processes; (exit status, output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    env.pop("FLATMEM_COORDINATOR", None)
    port = free_port()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--master-addr", "127.0.0.1",
               "--master-port", str(port), str(HERE / worker), mode, *more]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_ring_equals_one_process_on_the_concatenated_batch(ranks):
    rc, out = torchrun("values", ranks)
    assert rc == 0, out
    for r in range(ranks):
        assert f"rank {r}: values ok" in out, out


def test_a_communicator_from_torchruns_environment():
    rc, out = torchrun("env", 3)
    assert rc == 0, out
    for r in range(3):
        assert f"rank {r}: env ok" in out, out


def test_a_rank_that_disappears_fails_the_others_without_a_hang():
    rc, out = torchrun("killed", 4, timeout=120)
    assert rc == 0, out
    for r in (0, 2, 3):
        line = next((x for x in out.splitlines() if x.startswith(f"rank {r}: failed as expected")), None)
        assert line is not None, out
        assert "rank 1" in line or "peer 1" in line, line
        seconds = float(line.split("after ")[1].split(" s")[0])
        assert seconds < 15, line
