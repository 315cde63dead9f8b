"""Ring CLIP loss across processes, in plain NumPy: a linear two-tower model
trained with a few SGD steps, the global batch spread over the ranks.

Every rank creates its communicator from the environment, holds its own shard
of the global batch (the shards are uneven: rank r has 3 + r pairs), computes
the ring CLIP loss of the WHOLE batch with flatmem (nobody holds all of it),
checks it against a float64 NumPy loss of the concatenated batch, and takes an
SGD step. flatmem's dq and dk are the exact gradients of the global loss
w.r.t. this rank's rows, so the parameter gradient is the SUM over ranks of
each rank's X_r^T dq_r (an all-reduce), not an average. Rank 0 prints the loss
of every step; every launcher must print the same numbers.

Launch (FLATMEM_COORDINATOR=host:port is where rank 0 listens; pick a free port):

  Open MPI:
    FLATMEM_COORDINATOR=127.0.0.1:29500 mpirun -n 4 -x FLATMEM_COORDINATOR \\
        python examples/python/ring_clip_numpy.py
    (as root: mpirun --allow-run-as-root --oversubscribe ...; flatmem reads
    OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE)
  A shell loop (or any launcher that sets FLATMEM_RANK / FLATMEM_WORLD_SIZE):
    export FLATMEM_COORDINATOR=127.0.0.1:29500 FLATMEM_WORLD_SIZE=4
    for r in 0 1 2 3; do FLATMEM_RANK=$r python examples/python/ring_clip_numpy.py & done; wait
  Slurm (srun sets SLURM_PROCID / SLURM_NTASKS, which flatmem reads):
    export FLATMEM_COORDINATOR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):29500
    srun -n 4 python examples/python/ring_clip_numpy.py
  torchrun (sets RANK / WORLD_SIZE, which flatmem reads; no torch needed in the script):
    FLATMEM_COORDINATOR=127.0.0.1:29500 torchrun --nproc-per-node 4 \\
        examples/python/ring_clip_numpy.py
  On one machine over loopback, UCX wants e.g. UCX_TLS=tcp,self,posix
  UCX_NET_DEVICES=lo (and UCX_ERROR_SIGNALS= UCX_HANDLE_ERRORS=none for Python).

Options: --steps N (default 3), --lr X (default 0.05), --timeout-ms T (every
wait's deadline, default 30000).
"""
import argparse
import sys

import numpy as np

import flatmem

D_IN, D_OUT, SCALE = 16, 8, 1.0


def global_batch(world_size, seed=0):
    """(images, texts) of all ranks: B x D_IN each, texts a noisy linear map
    of the images (so there is something to learn). Every rank makes the same."""
    rng = np.random.default_rng(seed)
    B = sum(3 + r for r in range(world_size))
    images = rng.standard_normal((B, D_IN)).astype(np.float32)
    mix = rng.standard_normal((D_IN, D_IN)).astype(np.float32) / np.sqrt(D_IN)
    texts = (images @ mix + 0.1 * rng.standard_normal((B, D_IN))).astype(np.float32)
    return images, texts


def shard(world_size, rank):
    start = sum(3 + r for r in range(rank))
    return slice(start, start + 3 + rank)


def clip_loss_float64(q, k, s):
    """1/2 (mean_i [lse_j s<q_i,k_j> - s<q_i,k_i>] + mean_j [lse_i ... - s<q_j,k_j>])."""
    x = s * (q.astype(np.float64) @ k.astype(np.float64).T)
    def lse(a, axis):
        m = a.max(axis=axis, keepdims=True)
        return (m + np.log(np.exp(a - m).sum(axis=axis, keepdims=True))).squeeze(axis)
    return 0.5 * (np.mean(lse(x, 1) - np.diag(x)) + np.mean(lse(x, 0) - np.diag(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--timeout-ms", type=int, default=30000)
    args = parser.parse_args()

    comm = flatmem.Communicator.from_env(timeout_ms=args.timeout_ms)
    rank, n = comm.rank, comm.world_size
    images, texts = global_batch(n)
    mine = shard(n, rank)
    x_img, x_txt = images[mine], texts[mine]
    rng = np.random.default_rng(1)  # the same initial towers on every rank
    w_img = (rng.standard_normal((D_IN, D_OUT)) / np.sqrt(D_IN)).astype(np.float32)
    w_txt = (rng.standard_normal((D_IN, D_OUT)) / np.sqrt(D_IN)).astype(np.float32)

    losses = []
    with comm:
        for step in range(args.steps):
            q, k = x_img @ w_img, x_txt @ w_txt            # this rank's rows and columns
            loss, backward = flatmem.contrastive_loss(q, k, SCALE, comm=comm)
            dq, dk, _ = backward()                          # d(global loss)/d(my rows)
            # The check: the loss of the concatenated batch in float64 from the
            # same fp32 features. flatmem's error is fp32 rounding, ~1e-6 of the
            # loss here (d = 8, B = 18); 1e-4 leaves room for it, while a lost
            # or doubled block of columns changes the loss by O(1/B).
            reference = clip_loss_float64(images @ w_img, texts @ w_txt, SCALE)
            if abs(float(loss) - reference) > 1e-4 * max(1.0, abs(reference)):
                sys.exit(f"rank {rank}: step {step}: flatmem loss {float(loss)!r} != reference {reference!r}")
            # Parameter gradients: sum over ranks of X_r^T dq_r (one all-reduce).
            grads = np.concatenate([(x_img.T @ dq).ravel(), (x_txt.T @ dk).ravel()])
            comm.all_reduce(grads, grads)
            w_img -= args.lr * grads[: w_img.size].reshape(w_img.shape)
            w_txt -= args.lr * grads[w_img.size:].reshape(w_txt.shape)
            losses.append(float(loss))
            if rank == 0:
                print(f"step {step} loss {float(loss):.9g} (float64 reference {reference:.9g})", flush=True)
        comm.barrier()
    if losses[-1] >= losses[0]:
        sys.exit(f"rank {rank}: the loss did not decrease: {losses}")
    if rank == 0:
        print(f"ring_clip_numpy: OK, {n} ranks, global batch {images.shape[0]}", flush=True)


if __name__ == "__main__":
    main()
