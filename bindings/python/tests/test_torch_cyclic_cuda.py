"""flatmem.torch's cyclic wrappers on CUDA parameters (skipped without a GPU: CI has none;
scripts/gpu-check.sh's machines have one): world 1 over the NCCL device transport, the gradients
and relayed shards handed over on torch's current stream, against the same training on the CPU.
Never run on a GPU yet.

Tolerance: fp32 on both devices, the same operations; cuBLAS and the CPU sum the products of a
row in different orders (and torch may use TF32 for matmuls when allowed: disabled here), a few
ulps per step over 4 steps of SGD at lr 0.1 on parameters ~1: 1e-5 absolute."""
import pytest
import torch

import flatmem
import flatmem.torch as fmt
from torch_cyclic_support import data, loss_fn, mlp, sgd

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no CUDA device")


def device_comm():
    comm = flatmem.Communicator.create_local(1)[0]
    try:
        comm.init_device(torch.cuda.current_device())
    except flatmem.UnsupportedError as e:
        comm.close()
        pytest.skip(f"no device transport: {e}")
    return comm


def train(device, parameters):
    torch.backends.cuda.matmul.allow_tf32 = False
    comm = device_comm() if device == "cuda" else flatmem.Communicator.create_local(1)[0]
    model = mlp(0).to(device)
    with fmt.CyclicDataParallel(fmt.split_sequential(model, 3), sgd(0.1), loss_fn, comm, steps=4, rule="delay1",
                                parameters=parameters) as cdp:
        losses = [cdp.step(*(t.to(device) for t in data(s, 0))) for s in range(4)]
        cdp.finish()
        flat = (torch.cat([s for _, s in cdp.shards().values()]) if parameters == "relayed"
                else torch.cat([cdp.flat_parameters(j) for j in range(3)]))
    comm.close()
    return [float(x) for x in losses], flat.cpu()


@pytest.mark.parametrize("parameters", ["replicated", "relayed"])
def test_cuda_training_equals_the_cpu(parameters):
    cpu_losses, cpu = train("cpu", parameters)
    gpu_losses, gpu = train("cuda", parameters)
    assert (cpu - gpu).abs().max().item() <= 1e-5
    assert all(abs(a - b) <= 1e-5 for a, b in zip(cpu_losses, gpu_losses))


def test_cuda_stage_parallel_world_1_equals_the_cpu():
    results = []
    for device in ("cpu", "cuda"):
        comm = device_comm() if device == "cuda" else flatmem.Communicator.create_local(1)[0]
        stage = mlp(0).to(device)
        with fmt.CyclicStageParallel(stage, sgd(0.1), loss_fn, comm, micro_batches=3, steps=4) as sp:
            for s in range(4):
                sp.step([tuple(t.to(device) for t in data(s, m)) for m in range(3)])
            sp.finish()
            results.append(sp.flat.flat().cpu())
        comm.close()
    assert (results[0] - results[1]).abs().max().item() <= 1e-5
