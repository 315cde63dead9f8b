"""Two towers trained with flatmem.torch's CLIP (or SigLIP) loss under DistributedDataParallel.

    torchrun --nproc-per-node 2 examples/torch/ddp_clip.py [--loss clip|siglip] [--steps 30]

Each rank embeds its own shard of the global batch; ClipLoss(rank=r, world_size=N) computes the loss
of the GLOBAL batch over a ring of flatmem communicators (made from the process group at the first
call), with no all-gather of features and no b x b logits. DDP averages the gradients: towers,
logit_scale and logit_bias all end up with the gradient one process would get on the whole batch.
"""
import argparse

import torch
import torch.distributed as dist

import flatmem.torch as fmt


class TwoTowers(torch.nn.Module):
    def __init__(self, image_dim=32, text_dim=24, width=16):
        super().__init__()
        self.image = torch.nn.Sequential(torch.nn.Linear(image_dim, 64), torch.nn.GELU(), torch.nn.Linear(64, width))
        self.text = torch.nn.Sequential(torch.nn.Linear(text_dim, 64), torch.nn.GELU(), torch.nn.Linear(64, width))
        self.logit_scale = torch.nn.Parameter(torch.tensor(2.659))  # learned; open_clip's init, log(1 / 0.07)
        self.logit_bias = torch.nn.Parameter(torch.tensor(-10.0))   # learned by SigLIP (its gradient is 0 for CLIP)

    def forward(self, images, texts):
        normalize = torch.nn.functional.normalize
        return normalize(self.image(images), dim=-1), normalize(self.text(texts), dim=-1)


def global_batch(step, size, generator_seed=1234):
    """Pairs (image, text) of one step, the same on every rank: a text is a fixed linear view of its image."""
    g = torch.Generator().manual_seed(generator_seed + step)
    images = torch.randn(size, 32, generator=g)
    mixing = torch.randn(32, 24, generator=torch.Generator().manual_seed(7))
    return images, images @ mixing / 32**0.5 + 0.1 * torch.randn(size, 24, generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--loss", choices=("clip", "siglip"), default="clip")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64, help="global batch (split evenly over the ranks)")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(TwoTowers())
    criterion = (fmt.ClipLoss if args.loss == "clip" else fmt.SigLipLoss)(rank=rank, world_size=world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    shard = slice(rank * args.batch // world, (rank + 1) * args.batch // world)

    for step in range(args.steps):
        images, texts = global_batch(step, args.batch)
        image_features, text_features = model(images[shard], texts[shard])
        towers = model.module
        loss = criterion(image_features, text_features, towers.logit_scale.exp(), towers.logit_bias)
        optimizer.zero_grad()
        loss.backward()  # the global loss's gradient, after DDP's average
        optimizer.step()
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}: {args.loss} loss {loss.item():.4f} (global batch {args.batch}), "
                  f"logit_scale {towers.logit_scale.item():.4f}, logit_bias {towers.logit_bias.item():.4f}",
                  flush=True)

    # every rank holds the same parameters, as under any DDP run
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    agree = torch.equal(spread, flat)
    # (one write per line: the ranks share the terminal)
    print(f"rank {rank}: done, parameters {'identical on every rank' if agree else 'DIFFER between ranks'}\n",
          end="", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
