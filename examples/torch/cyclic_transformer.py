#!/usr/bin/env python3
"""Cyclic data parallelism for a small transformer, one process per rank under torchrun:

    torchrun --nproc-per-node 4 examples/torch/cyclic_transformer.py                    # delay1, replicated
    torchrun --nproc-per-node 4 examples/torch/cyclic_transformer.py --parameters relayed
    torchrun --nproc-per-node 4 examples/torch/cyclic_transformer.py --rule sync --steps 10

The model (an input projection, pre-LN encoder layers, a head) is cut into --stages stages by
flatmem.torch.split_sequential; every rank trains on its own synthetic sequences (predict each
token's predecessor) with AdamW, the ranks staggered by 2L/N time steps, each stage's gradient
averaged over the ranks by flatmem's point-to-point chain as soon as its backward ran. Rank 0
prints the loss of every step (the mean over ranks) and, at the end, what the runtime measured:
this rank's activation peak, the ranks' summed peak, bytes sent per time step.
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn

import flatmem.torch as fmt


def model(width, layers, features):
    torch.manual_seed(0)  # every rank starts from the same weights
    blocks = [nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
              for _ in range(layers)]
    return nn.Sequential(nn.Linear(features, width), *blocks, nn.LayerNorm(width), nn.Linear(width, features))


def batch(step, rank, rows, tokens, features):
    g = torch.Generator().manual_seed(100_003 * step + rank)
    x = torch.randn(rows, tokens, features, generator=g)
    return x, torch.roll(x, 1, dims=1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rule", default="delay1", choices=["delay1", "newest", "sync"])
    p.add_argument("--parameters", default="replicated", choices=["replicated", "relayed"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--width", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = fmt.communicator()  # flatmem's communicator of the same ranks

    net = model(args.width, args.stages, 16)
    stages = fmt.split_sequential(net, args.stages)
    optimizer = lambda params: torch.optim.AdamW(params, lr=1e-3)  # noqa: E731 - one per stage (shards if relayed)
    cdp = fmt.CyclicDataParallel(stages, optimizer, nn.functional.mse_loss, comm, steps=args.steps,
                                 rule=args.rule, parameters=args.parameters)
    losses = []
    for s in range(args.steps):
        losses.append(cdp.step(*batch(s, rank, 8, 32, 16)))
    cdp.finish()

    mean = torch.stack(losses) / world
    dist.all_reduce(mean)
    peak = torch.zeros(1 << 12, dtype=torch.int64)  # activation bytes held per global time step, summed
    for t, held in dict(cdp.activation_trace()).items():
        peak[t] = held
    dist.all_reduce(peak)
    summary = cdp.summary()
    sent = [s.bytes_sent for s in cdp.stats()]
    if rank == 0:
        for s, loss in enumerate(mean.tolist()):
            print(f"step {s:3d}  loss {loss:.5f}")
        print(f"{world} ranks, {args.stages} stages, rule {args.rule}, parameters {args.parameters}")
        print(f"activations: this rank's peak {cdp.activation_peak_bytes / 2**20:.2f} MiB, the ranks' summed peak "
              f"{int(peak.max()) / 2**20:.2f} MiB (lockstep would be {world * cdp.activation_peak_bytes / 2**20:.2f})")
        print(f"bytes sent per time step: max {max(sent)}, mean {sum(sent) / len(sent):.0f}; "
              f"total {summary.bytes_sent} in {summary.messages_sent} messages")
        if args.parameters == "relayed":
            r = cdp.relay_summary()
            print(f"parameters per rank: shards {r.shard_bytes} B + staging {r.staging_bytes} B "
                  f"(a replica is {r.replicated_bytes} B)")
    cdp.close()
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
