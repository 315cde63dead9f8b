"""One rank of flatmem.torch's ring tests, launched by torchrun (test_torch_ring.py).

    python -m torch.distributed.run --standalone --nproc-per-node N torch_ring_worker.py MODE

MODE
  values     the ring CLIP, InfoNCE (global labels) and sigmoid losses over uneven shards of one
             global batch, with a communicator made from the gloo process group: the loss and this
             rank's gradients against the float64 reference of the whole batch, within the bounds
             of python_reference (which hold for any summation order); ClipLoss(world_size=N) under
             DistributedDataParallel gives the gradients of the global loss (grad_scale = N);
             prints "rank R: values ok"
  env        the same CLIP check with a communicator from torchrun's environment alone
             (communicator_from_env, no process group); prints "rank R: env ok"
  killed     rank 1 exits (status 0, so torchrun leaves the others running) just before the ring
             forward; every other rank must fail with flatmem's error naming the peer, within
             its 5 s deadline; prints "rank R: failed as expected: <error>"
"""
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import flatmem
import flatmem.torch as fmt
import torch_reference as ref
from python_reference import forward_tolerance, gradient_tolerances
from python_sigmoid_reference import sigmoid_tolerances

SHARDS = [3, 5, 1, 4]  # rows per rank (the first world_size of them)



def say(line):
    """One line to stdout in ONE write (atomic on the pipe the ranks share, below PIPE_BUF):
    print() writes the text and its newline separately, and another rank's line can land
    between them."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())

def global_batch(world, d=11, dtype=torch.float32):
    sizes = SHARDS[:world]
    total = sum(sizes)
    g = torch.Generator().manual_seed(42)
    q = torch.nn.functional.normalize(torch.randn(total, d, generator=g, dtype=torch.float64), dim=1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(total, d, generator=g, dtype=torch.float64), dim=1).to(dtype)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return q, k, sizes, starts


def check(name, got, want, tau):
    got = got.detach().double().numpy() if isinstance(got, torch.Tensor) else np.asarray(got, np.float64)
    err = np.abs(got - want)
    if not np.all(err <= tau):
        raise AssertionError(f"{name}: max error {np.max(err):.3g}, bound at worst {np.max(tau):.3g}")


def leaves(q, k, *scalars):
    return [q.clone().requires_grad_(), k.clone().requires_grad_()] + [
        torch.tensor(v, requires_grad=True) for v in scalars]


def values(rank, world, comm):
    q, k, sizes, starts = global_batch(world)
    mine = slice(starts[rank], starts[rank + 1])
    q64, k64 = ref.widened(q), ref.widened(k)

    # CLIP
    q_, k_, s_ = leaves(q[mine], k[mine], 14.3)
    loss = fmt.clip_loss(q_, k_, s_, comm=comm)
    loss.backward()
    want = ref.clip(q, k, 14.3)
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q64, k64, np.float32(14.3))
    check("clip loss", loss, want[0], forward_tolerance(q64, k64, 14.3, want[0]))
    check("clip dq", q_.grad, want[1][mine], tau_dq[mine])
    check("clip dk", k_.grad, want[2][mine], tau_dk[mine])
    check("clip ds", s_.grad, want[3], tau_ds)

    # InfoNCE with GLOBAL labels pointing at other ranks' columns
    labels_all = (np.arange(len(q)) * 7 + 3) % len(q)
    q_, k_, s_ = leaves(q[mine], k[mine], 9.0)
    loss = fmt.infonce_loss(q_, k_, s_, torch.as_tensor(labels_all[mine]), comm=comm)
    loss.backward()
    want = ref.infonce(q, k, 9.0, labels_all)
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q64, k64, np.float32(9.0), labels_all, False)
    check("infonce loss", loss, want[0], forward_tolerance(q64, k64, 9.0, want[0]))
    check("infonce dq", q_.grad, want[1][mine], tau_dq[mine])
    check("infonce dk", k_.grad, want[2][mine], tau_dk[mine])
    check("infonce ds", s_.grad, want[3], tau_ds)

    # sigmoid
    q_, k_, s_, t_ = leaves(q[mine], k[mine], 10.0, -10.0)
    loss = fmt.sigmoid_loss(q_, k_, s_, t_, comm=comm)
    loss.backward()
    want = ref.sigmoid(q, k, 10.0, -10.0)
    tau = sigmoid_tolerances(q64, k64, np.float32(10.0), np.float32(-10.0))
    check("sigmoid loss", loss, want[0], tau["loss"])
    check("sigmoid dq", q_.grad, want[1][mine], tau["dq"][mine])
    check("sigmoid dk", k_.grad, want[2][mine], tau["dk"][mine])
    check("sigmoid ds", s_.grad, want[3], tau["ds"])
    check("sigmoid dt", t_.grad, want[4], tau["dt"])

    # ClipLoss under DDP: a linear tower per modality, DDP averages; the result must be the
    # gradient of the global loss (what one process computes on the whole batch).
    torch.manual_seed(0)
    tower = torch.nn.Linear(11, 11, bias=False).double()
    full = fmt.clip_loss(torch.nn.functional.normalize(tower(q.double()), dim=1).float(), k, 14.3)
    full.backward()
    reference_grad = tower.weight.grad.clone()
    tower.weight.grad = None
    model = torch.nn.parallel.DistributedDataParallel(tower)
    criterion = fmt.ClipLoss(rank=rank, world_size=world, comm=comm)
    out = criterion(torch.nn.functional.normalize(model(q[mine].double()), dim=1).float(), k[mine], 14.3)
    out.backward()
    err = (tower.weight.grad - reference_grad).abs().max().item()
    scale = reference_grad.abs().max().item()
    if not err <= 1e-5 * scale + 1e-7:
        raise AssertionError(f"ClipLoss under DDP: weight gradient off by {err:.3g} (largest {scale:.3g})")


def main():
    mode = sys.argv[1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    if mode == "env":
        comm = fmt.communicator_from_env(timeout_ms=20000)
        q, k, sizes, starts = global_batch(world)
        mine = slice(starts[rank], starts[rank + 1])
        q_, k_ = leaves(q[mine], k[mine])
        loss = fmt.clip_loss(q_, k_, 14.3, comm=comm)
        loss.backward()
        want = ref.clip(q, k, 14.3)
        tau_dq, _, _ = gradient_tolerances(ref.widened(q), ref.widened(k), np.float32(14.3))
        check("env clip dq", q_.grad, want[1][mine], tau_dq[mine])
        comm.close()
        say(f"rank {rank}: env ok")
        return
    dist.init_process_group("gloo")
    if mode == "values":
        comm = fmt.communicator(timeout_ms=20000)
        values(rank, world, comm)
        say(f"rank {rank}: values ok")
    elif mode == "killed":
        comm = fmt.communicator(timeout_ms=5000)
        q, k, sizes, starts = global_batch(world)
        mine = slice(starts[rank], starts[rank + 1])
        if rank == 1:
            os._exit(0)  # gone, mid-step, without a word
        start = time.monotonic()
        try:
            fmt.clip_loss(q[mine], k[mine], 14.3, comm=comm)
        except flatmem.Error as e:
            say(f"rank {rank}: failed as expected after {time.monotonic() - start:.1f} s: "
                f"{type(e).__name__}: {e}")
            os._exit(0)  # the process group's peers are gone too: no orderly teardown
        raise AssertionError("the ring loss succeeded without rank 1")
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
