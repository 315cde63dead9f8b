"""flatmem.torch's ring losses in a real DistributedDataParallel training run under torchrun (2 and
4 processes, gloo): a two-tower model with a LEARNED logit_scale (and SigLIP logit_bias) trains
20 SGD steps with fmt.ClipLoss / fmt.infonce_loss(comm=, grad_scale=N) / fmt.SigLipLoss, eager,
with the loss module under torch.compile, and on uneven shards; after every step every parameter
and the loss must equal those of one process on the concatenated batch, and open_clip's own
losses under DDP must train the same parameters. With the scale / bias gradients of before
94538a7 (N times too large under DDP) the comparison must fail. The checks are in
torch_ddp_worker.py; here each launch is held to a deadline and its output read."""
import pytest

from test_torch_ring import torchrun_worker
from torch_ddp_worker import BUGGY_CASES, CASES, FULLGRAPH_CASES, LAZY_CASES

WORKER = "torch_ddp_worker.py"


def launch(mode, ranks):
    return torchrun_worker(WORKER, mode, ranks, 240)


def assert_ok(rc, out, ranks, cases):
    assert rc == 0, out
    for r in range(ranks):
        for case in cases:
            assert f"rank {r}: ddp {case} ok" in out, out


@pytest.mark.parametrize("ranks", [2, 4])
def test_ddp_training_equals_one_process_and_open_clip(ranks):
    rc, out = launch("train", ranks)
    assert_ok(rc, out, ranks, CASES)


def test_the_comparison_fails_with_the_old_scalar_gradients():
    rc, out = launch("buggy", 2)
    assert rc == 0, out
    for r in range(2):
        for case in BUGGY_CASES:
            line = next((x for x in out.splitlines() if x.startswith(f"rank {r}: buggy {case} caught")), None)
            assert line is not None, out
            # after the first step only the scalars differ: the towers' gradients were still equal
            assert ": logit_scale off by" in line or ": logit_bias off by" in line, line
            assert "relative after step 1 " in line, line


# torch.compile(fullgraph=True) of the loss modules: the communicator's slot and size are plain
# attributes by the time the forward is traced (distributed.slot), and a module whose communicator
# it makes itself makes it when it is constructed (collective, eager), so nothing in the forward
# needs a graph break.
def test_the_loss_modules_compile_without_graph_breaks():
    rc, out = launch("fullgraph", 2)
    assert_ok(rc, out, 2, FULLGRAPH_CASES)


def test_a_compiled_loss_module_that_makes_its_own_communicator():
    rc, out = launch("lazy", 2)
    assert_ok(rc, out, 2, LAZY_CASES)
