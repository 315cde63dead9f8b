#!/usr/bin/env python3
"""Reversible transformer stacks in PyTorch on the CPU: flatmem.torch against RevLib,
torch.utils.checkpoint and ordinary backprop, forward + backward, side by side in one run.

The stack: depth blocks of pre-LayerNorm multi-head self-attention (F, torch.nn.MultiheadAttention)
and pre-LayerNorm MLP (G, hidden 4 w, GELU), the same modules (same seeds) for every method:
  backprop      y1 = x1 + F(x2), y2 = x2 + G(y1), ordinary autograd (keeps every activation)
  checkpoint    the same, each F and G under torch.utils.checkpoint (use_reentrant=False)
  revlib        revlib.ReversibleSequential(F1, G1, F2, G2, ..., split_dim=2) on cat(x1, x2)
  flatmem-*     flatmem.torch.ReversibleSequence([(F1, G1), ...], mode=vanilla | overlapped | auto)
  builtin       flatmem.torch.ReversibleTransformer (flatmem's own attention and MLP blocks, in C++,
                same shapes; not the same modules: it shows what the module adds to the C segment)
Each (method, depth) runs in its own subprocess: time = the best of --reps steps after a warm-up
step (four for the AUTO rows, which time both backward modes in their first four). Peak = how far
a step raises the resident set above where it starts (VmHWM reset through /proc/self/clear_refs;
glibc's mmap threshold fixed so that freed blocks leave the resident set), measured on the same
step with the parameters frozen: what the method keeps for the backward of the states
(activations, their gradients, its bookkeeping) without the parameter gradients, which every
method pays alike; builtin (whose blocks need gradient buffers) is its training step's rise minus
the parameter gradients, its peak being at the end of the backward. Printed: a
table with time and peak per depth, ratios to RevLib, and the targets (flatmem's peak within
1.05x from the smallest depth to the largest; its time within 1.1x RevLib's).

    python3 bench/torch_reversible_bench.py                    # width 384, 6 heads, depths 4,8,16,32
    python3 bench/torch_reversible_bench.py --width 768 --heads 12 --depths 4,12 --csv out.csv
    python3 bench/torch_reversible_bench.py --quick            # a smoke run (seconds)

Needs the wheel's venv (scripts/build-wheel.sh: flatmem, torch and revlib). Full run on a 2-core EPYC: docs/benchmarks/pytorch-cpu.md.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import time

METHODS = ["backprop", "checkpoint", "revlib", "flatmem-vanilla", "flatmem-overlapped", "flatmem-auto", "builtin"]


def make_blocks(torch, width, heads, depth):
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(width)
            self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)

        def forward(self, x):
            h = self.norm(x)
            return self.attn(h, h, h, need_weights=False)[0]

    def mlp():
        return torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                   torch.nn.Linear(4 * width, width))

    torch.manual_seed(0)
    return [(Attention(), mlp()) for _ in range(depth)]


def child(args):
    """One (method, depth) measurement; prints a JSON line."""
    import torch

    import torch_bench_support as sup

    torch.set_num_threads(args.threads)
    import flatmem.torch as fmt

    method, depth = args.child_method, args.child_depth
    shape = (args.batch, args.tokens, args.width)
    g = torch.Generator().manual_seed(1)
    x1, x2 = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    blocks = make_blocks(torch, args.width, args.heads, depth) if method != "builtin" else None
    if method == "builtin":
        model = fmt.ReversibleTransformer(args.width, args.heads, depth, mode="auto")
        step_forward = model
    elif method.startswith("flatmem-"):
        model = fmt.ReversibleSequence(blocks, mode=method.split("-")[1])
        step_forward = model
    elif method == "revlib":
        import revlib

        model = revlib.ReversibleSequential(*[m for pair in blocks for m in pair], split_dim=2)

        def step_forward(a, b):
            y = model(torch.cat([a, b], dim=2))
            return y[..., :args.width], y[..., args.width:]
    else:
        model = torch.nn.ModuleList(torch.nn.ModuleList(p) for p in blocks)
        checkpointed = method == "checkpoint"

        def apply(m, x):
            return torch.utils.checkpoint.checkpoint(m, x, use_reentrant=False) if checkpointed else m(x)

        def step_forward(a, b):
            for f, g_ in blocks:
                a = a + apply(f, b)
                b = b + apply(g_, a)
            return a, b
    def step(a, b):
        """One step; returns how far it raised the resident set above where it started (the
        parameters' gradients it ends with included)."""
        for p in model.parameters():
            p.grad = None
        a.grad = b.grad = None
        start = sup.status_bytes("VmRSS")
        sup.reset_peak()
        y1, y2 = step_forward(a, b)
        (y1.square().mean() + y2.mean()).backward()
        return sup.status_bytes("VmHWM") - start

    # torch's and the method's one-time set-up (thread pools, kernels, handles) on a tiny batch
    # first, so that the peak below is the step's own
    step(x1[:1, :2].clone().requires_grad_(), x2[:1, :2].clone().requires_grad_())
    a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    # warm-up at full size; AUTO (flatmem-auto, builtin) times vanilla and overlapped in its first
    # four backwards of a shape and keeps the faster: the timed steps come after its choice
    for _ in range(4 if method in ("flatmem-auto", "builtin") else 1):
        step(a, b)
    times, rises = [], []
    for _ in range(args.reps):
        start = time.perf_counter()
        rises.append(step(a, b))
        times.append(time.perf_counter() - start)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if method == "builtin":
        # flatmem's blocks need their gradient buffers; the step's peak is at its end, every
        # parameter gradient allocated: beyond them is what the segment keeps
        peak = max(rises) - gradient_bytes
    else:
        # what the method keeps for the backward of the states, alone: the same step with the
        # parameters frozen (no parameter gradients, whose memory every method pays alike)
        for p in model.parameters():
            p.requires_grad_(False)
        for _ in range(4 if method == "flatmem-auto" else 1):
            step(a, b)
        peak = max(step(a, b) for _ in range(2))
    print(json.dumps({"method": method, "depth": depth, "seconds": min(times),
                      "peak_bytes": peak, "gradient_bytes": gradient_bytes,
                      "last_mode": getattr(model, "last_mode", "")}), flush=True)


def run(args, method, depth):
    command = [sys.executable, os.path.abspath(__file__), "--child-method", method, "--child-depth", str(depth),
               "--width", str(args.width), "--heads", str(args.heads), "--batch", str(args.batch), "--tokens",
               str(args.tokens), "--reps", str(args.reps), "--threads", str(args.threads)]
    # A fixed mmap threshold: glibc's grows after the first large free and then keeps freed
    # blocks resident, which would hide (or double) what a step allocates.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="131072")
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, env=env)
    if done.returncode != 0:
        return {"method": method, "depth": depth, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def mib(n):
    return f"{n / 2**20:8.1f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--depths", default="4,8,16,32")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--csv", default="")
    p.add_argument("--quick", action="store_true", help="width 64, 4 heads, depths 2,4, one rep")
    p.add_argument("--child-method", help=argparse.SUPPRESS)
    p.add_argument("--child-depth", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child_method:
        return child(args)
    if args.quick:
        args.width, args.heads, args.depths, args.reps, args.tokens = 64, 4, "2,4", 1, 16
    depths = [int(d) for d in args.depths.split(",")]
    methods = args.methods.split(",")
    print(f"reversible stacks, CPU fp32: width {args.width}, {args.heads} heads, MLP {4 * args.width}, batch "
          f"{args.batch}, {args.tokens} tokens; forward + backward, best of {args.reps}; {args.threads} threads")
    rows = [run(args, m, d) for d in depths for m in methods]
    by = {(r["method"], r["depth"]): r for r in rows}
    print(f"\n{'method':<20}" + "".join(f"{f'depth {d}':>24}" for d in depths) +
          "   (time s / peak MiB beyond model, inputs and parameter gradients)")
    for m in methods:
        cells = []
        for d in depths:
            r = by[(m, d)]
            cells.append(f"{'failed':>24}" if "error" in r else f"{r['seconds']:>12.3f} {mib(r['peak_bytes']):>11}")
        print(f"{m:<20}" + "".join(cells))
    print("\nratios to revlib (time, peak):")
    for m in methods:
        cells = []
        for d in depths:
            r, v = by[(m, d)], by.get(("revlib", d), {})
            ok = "error" not in r and "error" not in v and v
            cells.append(f"{r['seconds'] / v['seconds']:>11.2f}x {r['peak_bytes'] / max(v['peak_bytes'], 1):>10.2f}x"
                         if ok else f"{'-':>24}")
        print(f"{m:<20}" + "".join(cells))
    print("\ntargets:")
    for m in [m for m in methods if m.startswith("flatmem") or m == "builtin"]:
        first, last = by[(m, depths[0])], by[(m, depths[-1])]
        if "error" in first or "error" in last:
            continue
        growth = last["peak_bytes"] / max(first["peak_bytes"], 1)
        print(f"  {m}: peak at depth {depths[-1]} / depth {depths[0]} = {growth:.2f}x "
              f"({'met' if growth <= 1.05 else 'MISSED'}: <= 1.05x)")
        if m != "builtin" and ("revlib", depths[-1]) in by and "error" not in by[("revlib", depths[-1])]:
            worst = max(by[(m, d)]["seconds"] / by[("revlib", d)]["seconds"] for d in depths)
            print(f"  {m}: time / revlib's, worst over depths = {worst:.2f}x ({'met' if worst <= 1.1 else 'MISSED'}: "
                  "<= 1.1x)")
    for r in rows:
        if "error" in r:
            print(f"  {r['method']} depth {r['depth']} failed: {r['error']}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["method", "depth", "width", "heads", "batch", "tokens", "seconds", "peak_bytes",
                        "gradient_bytes", "last_mode"])
            for r in rows:
                if "error" not in r:
                    w.writerow([r["method"], r["depth"], args.width, args.heads, args.batch, args.tokens,
                                f"{r['seconds']:.6f}", r["peak_bytes"], r["gradient_bytes"], r["last_mode"]])
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    sys.exit(main())
