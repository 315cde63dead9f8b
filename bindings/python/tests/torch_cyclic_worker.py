"""One torchrun rank of test_torch_cyclic_torchrun.py. Modes:

  sync         CyclicDataParallel "sync" (float64 MLP, 3 stages, SGD) equals one process on the
               concatenated batch (computed here, in this process) within 1e-12; "delay1" equals
               the same optimizer one step late.
  transformer  a small pre-LN transformer (3 encoder layers) trained 20 steps with AdamW twice from
               the same weights: CyclicDataParallel "sync" over flatmem, and torch's
               DistributedDataParallel over gloo; the per-step losses (mean over ranks) agree.
  killed       rank 1 exits in the middle of step 2; every other rank's step raises flatmem's error
               naming it, within the timeout, and says how long it took.

Prints "rank R: MODE ok" (or "rank R: failed as expected after S s: ...") for the launcher.
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import flatmem
import flatmem.torch as fmt
from torch_cyclic_support import data, loss_fn, mlp, reference, sgd


def mode_sync(rank, world, comm):
    for rule, delay in (("sync", 0), ("delay1", 1)):
        model = mlp(0, (16, 16), torch.float64)
        with fmt.CyclicDataParallel(fmt.split_sequential(model, 3), sgd(0.1), loss_fn, comm, steps=4,
                                    rule=rule) as cdp:
            for s in range(4):
                cdp.step(*data(s, rank, dtype=torch.float64))
            cdp.finish()
            got = torch.cat([cdp.flat_parameters(j) for j in range(3)])
        _, want = reference(world, 4, delay, sgd(0.1), dtype=torch.float64)
        error = (got - want).abs().max().item()
        assert error <= 1e-12, (rule, error)


def transformer(seed=0, width=32, layers=3):
    torch.manual_seed(seed)
    blocks = [nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
              for _ in range(layers)]
    return nn.Sequential(nn.Linear(8, width), *blocks, nn.LayerNorm(width), nn.Linear(width, 8))


def token_batch(step, rank):
    g = torch.Generator().manual_seed(7919 * step + rank)
    x = torch.randn(4, 12, 8, generator=g)
    return x, torch.roll(x, 1, dims=1)  # predict the previous token's features


def mode_transformer(rank, world, comm, steps=20):
    cdp_losses, ddp_losses = [], []
    model = transformer()
    with fmt.CyclicDataParallel(fmt.split_sequential(model, 3), torch.optim.AdamW(model.parameters(), lr=1e-3),
                                loss_fn, comm, steps=steps, rule="sync") as cdp:
        for s in range(steps):
            cdp_losses.append(cdp.step(*token_batch(s, rank)))
        cdp.finish()
    reference_model = transformer()
    ddp = nn.parallel.DistributedDataParallel(reference_model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    for s in range(steps):
        x, t = token_batch(s, rank)
        opt.zero_grad()
        loss = loss_fn(ddp(x), t)
        loss.backward()
        opt.step()
        ddp_losses.append(loss.detach())
    mean = lambda losses: torch.stack(losses).to(torch.float64) / world  # noqa: E731
    a, b = mean(cdp_losses), mean(ddp_losses)
    dist.all_reduce(a)
    dist.all_reduce(b)
    # fp32 both ways; the gradient averages differ only in summation order (chain vs gloo's
    # all-reduce), a few ulps per step that AdamW passes on at O(1): 1e-4 relative after 20 steps;
    # the loss falls by >5 % over the run, so a step out of place fails it.
    assert torch.allclose(a, b, rtol=1e-4, atol=0), (a, b)
    assert a[-1] < 0.95 * a[0], a  # it trained
    # The parameters: Adam's step is ~lr wherever a gradient is not ~0, so an element whose
    # gradient is rounding noise may move either way; held is that the two trained models differ
    # by far less than training moved them (a step out of place moves them by O(lr) everywhere).
    flat = lambda m: torch.cat([p.detach().reshape(-1) for p in m.parameters()])  # noqa: E731
    moved = (flat(reference_model) - flat(transformer())).norm()
    apart = (flat(model) - flat(reference_model)).norm()
    print(f"rank {rank}: parameters apart {apart:.3g}, moved {moved:.3g}", flush=True)
    assert apart <= 1e-2 * moved, (apart, moved)


def mode_killed(rank, world, comm):
    model = mlp(0)
    cdp = fmt.CyclicDataParallel(fmt.split_sequential(model, 3), sgd(0.1), loss_fn, comm, steps=5, rule="delay1",
                                 timeout_ms=8000)
    start = None
    try:
        for s in range(5):
            if s == 2:
                start = time.monotonic()
                if rank == 1:
                    os._exit(0)  # gone, without a word, in the middle of the run
            cdp.step(*data(s, rank))
        cdp.finish()
    except flatmem.Error as e:
        start = start or time.monotonic()
        # One write of the whole line: the ranks share the launcher's pipe, and print()'s text and
        # newline can be split by another rank's line (which once hid a rank's line from the test).
        line = f"rank {rank}: failed as expected after {time.monotonic() - start:.1f} s: {type(e).__name__}: {e}\n"
        os.write(sys.stdout.fileno(), line.encode())
        os._exit(0)  # the process group's peer is gone too: no orderly shutdown
    print(f"rank {rank}: no error", flush=True)
    os._exit(1)


def main():
    mode = sys.argv[1]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = fmt.communicator(timeout_ms=20000)
    {"sync": mode_sync, "transformer": mode_transformer, "killed": mode_killed}[mode](rank, world, comm)
    print(f"rank {rank}: {mode} ok", flush=True)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
