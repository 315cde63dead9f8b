"""flatmem.torch.CyclicDataParallel in real processes under torchrun (torch's launcher, 1 to 4 on
this machine), the communicator from torch.distributed's process group: the rules against one
process on the concatenated batch, a small transformer's losses against DistributedDataParallel's,
and a rank that disappears. The checks are in torch_cyclic_worker.py; each launch is held to a
deadline and its output read."""
import pathlib

import pytest

from test_torch_ring import torchrun_worker

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "torch" / "cyclic_transformer.py"


def launch(mode, ranks, timeout=300):
    return torchrun_worker("torch_cyclic_worker.py", mode, ranks, timeout)


@pytest.mark.parametrize("ranks", [1, 2, 4])  # 3: the killed test; 1 .. 4 in-process: test_torch_cyclic.py
def test_sync_and_delay1_equal_one_process_under_torchrun(ranks):
    rc, out = launch("sync", ranks)
    assert rc == 0, out
    for r in range(ranks):
        assert f"rank {r}: sync ok" in out, out


def test_a_transformer_trains_as_under_distributed_data_parallel():
    rc, out = launch("transformer", 4)
    assert rc == 0, out
    for r in range(4):
        assert f"rank {r}: transformer ok" in out, out


def test_a_rank_that_disappears_fails_the_others_without_a_hang():
    rc, out = launch("killed", 3, timeout=120)
    for r in (0, 2):
        # Each rank writes its line in one write; still, find it anywhere in a line (another
        # process's unterminated output may precede it) and cut it at the next rank's message.
        start = out.find(f"rank {r}: failed as expected")
        assert start >= 0, out
        line = out[start:].splitlines()[0]
        line = line.split(f"rank {2 - r}: failed as expected")[0]
        assert "rank 1" in line or "peer 1" in line, line
        seconds = float(line.split("after ")[1].split(" s")[0])
        assert seconds < 30, line
    del rc  # torchrun reports the vanished rank's exit its own way; the lines above are the check


def test_the_example_runs_relayed_under_torchrun():
    rc, out = torchrun_worker(str(EXAMPLE), "--parameters", 2, 300, "relayed", "--steps", "4", "--stages", "2")
    assert rc == 0, out
    assert "step   3  loss" in out and "parameters per rank: shards" in out, out
