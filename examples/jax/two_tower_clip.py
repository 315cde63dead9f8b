"""A two-tower linear CLIP model trained by several processes with flatmem's
ring loss in JAX (flatmem_jax.clip_loss(..., comm=...)).

Model: image features x (N, 24) and text features t (N, 16) of N synthetic
pairs (both noisy linear views of one latent), two weight matrices W_img
(24, 8) and W_txt (16, 8), and a learnable log logit scale:

    q = normalise(x W_img),  k = normalise(t W_txt),  L = CLIP(q, k, exp(log_s))

Each of the world_size processes holds ITS shard of the pairs (uneven here:
np.array_split) and calls the ring loss on it; nobody holds the whole batch.
The loss is that of the global batch, and jax.grad gives this rank's share
of the gradient of the global mean:
  - W_img, W_txt: rank r's gradient covers only its own rows, so the global
    gradient is the SUM over ranks -- one flatmem all-reduce of the two,
    flattened into one vector (one collective, so every rank runs the same
    calls in the same order);
  - log_s: the scale's gradient from the ring is already the global one,
    identical on every rank (flatmem.h, "Ring across ranks") -- it is NOT
    summed.
Every rank then applies the same SGD update to the same parameters, which
stay identical on every rank (the all-reduce gives every rank the same bits).

Step 1 is checked against one process: the single-process flatmem loss of
the concatenated batch (which every rank can build here, the data being
synthetic) and the gradients of that loss; the example prints both
differences and exits non-zero when they exceed the tolerance.

Launch (4 ranks on one host, UCX over loopback), from the repository root:

    examples/jax/run_two_tower.sh              # a shell loop, FLATMEM_RANK per process
    examples/jax/run_two_tower.sh mpirun       # Open MPI's mpirun (OMPI_COMM_WORLD_RANK)

or by hand:

    export FLATMEM_COORDINATOR=127.0.0.1:29500 FLATMEM_WORLD_SIZE=4 \\
           UCX_TLS=tcp,self,posix UCX_NET_DEVICES=lo UCX_ERROR_SIGNALS= UCX_HANDLE_ERRORS=none
    for r in 0 1 2 3; do FLATMEM_RANK=$r python examples/jax/two_tower_clip.py & done; wait
"""
import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import flatmem_jax

N_PAIRS, D_IMG, D_TXT, D_LATENT, D_EMBED = 61, 24, 16, 6, 8


def synthetic_pairs(seed=0):
    """N_PAIRS (image, text) feature pairs: two noisy linear views of one latent."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((N_PAIRS, D_LATENT))
    x = z @ rng.standard_normal((D_LATENT, D_IMG)) + 0.3 * rng.standard_normal((N_PAIRS, D_IMG))
    t = z @ rng.standard_normal((D_LATENT, D_TXT)) + 0.3 * rng.standard_normal((N_PAIRS, D_TXT))
    return x.astype(np.float32), t.astype(np.float32)


def initial_parameters(seed=1):
    rng = np.random.default_rng(seed)
    return {
        "W_img": jnp.asarray(rng.standard_normal((D_IMG, D_EMBED)) / np.sqrt(D_IMG), jnp.float32),
        "W_txt": jnp.asarray(rng.standard_normal((D_TXT, D_EMBED)) / np.sqrt(D_TXT), jnp.float32),
        "log_s": jnp.float32(np.log(10.0)),
    }


def normalise(v):
    return v / jnp.linalg.norm(v, axis=1, keepdims=True)


def clip_objective(params, x, t, comm=None):
    """The loss of (x, t): this rank's shard in the ring (comm), or a whole batch alone (None)."""
    q, k = normalise(x @ params["W_img"]), normalise(t @ params["W_txt"])
    return flatmem_jax.clip_loss(q, k, jnp.exp(params["log_s"]), comm=comm)


def make_step(comm, lr):
    @jax.jit
    def step(params, x, t):
        loss, grads = jax.value_and_grad(clip_objective)(params, x, t, comm)
        towers = {"W_img": grads["W_img"], "W_txt": grads["W_txt"]}
        flat, unflatten = ravel_pytree(towers)
        towers = unflatten(comm.all_reduce(flat))  # sum of the ranks' shares
        grads = dict(towers, log_s=grads["log_s"])  # already global: not summed
        new = jax.tree.map(lambda p, g: p - lr * g, params, grads)
        return loss, grads, new

    return step


def check_first_step(rank, loss, grads, params, x, t):
    """The ring's step-1 loss and summed gradients against one process on the
    concatenated batch. Tolerances: both sides are fp32 computations of the
    same quantities summed in different orders (the ring merges per-rank
    blocks; XLA's feature products may block rows differently). At N = 61,
    d = 8, s = 10, flatmem's worst-case forward bound (tests/support/
    tolerance.hpp: s gamma_{d+1} + (2N + 8) u + 2u|L|, doubled) is ~2e-5 per
    side, so 1e-4 absolute bounds the loss difference; the gradients are sums
    of 61 terms each with relative error ~1e-6, bounded by 1e-4 of their
    largest element."""
    alone = jax.jit(jax.value_and_grad(clip_objective))(params, x, t)
    loss_diff = abs(float(loss) - float(alone[0]))
    grad_diff = max(float(jnp.max(jnp.abs(grads[n] - alone[1][n])) / jnp.max(jnp.abs(alone[1][n])))
                    for n in grads)
    ok = loss_diff <= 1e-4 and grad_diff <= 1e-4
    if rank == 0:
        print(f"step 1: ring loss {float(loss):.6f}, single-process loss of the concatenated batch "
              f"{float(alone[0]):.6f} (|diff| {loss_diff:.2e}); gradients' largest relative "
              f"difference {grad_diff:.2e}", flush=True)
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    comm = flatmem_jax.ring.initialize()  # FLATMEM_COORDINATOR + FLATMEM_RANK/_WORLD_SIZE or mpirun's
    rank, world = comm.rank, comm.world_size
    x_all, t_all = synthetic_pairs()
    mine = np.array_split(np.arange(N_PAIRS), world)[rank]  # uneven shards when world does not divide N
    x, t = jnp.asarray(x_all[mine]), jnp.asarray(t_all[mine])
    print(f"rank {rank} of {world}: pairs {mine[0]}..{mine[-1]} ({len(mine)})", flush=True)

    step = make_step(comm, args.lr)
    params = initial_parameters()
    losses, ok = [], True
    for i in range(1, args.steps + 1):
        loss, grads, new = step(params, x, t)
        if i == 1:
            ok = check_first_step(rank, loss, grads, params, jnp.asarray(x_all), jnp.asarray(t_all))
        losses.append(float(loss))
        if rank == 0:
            print(f"step {i:3d}  loss {losses[-1]:.6f}  logit scale {float(jnp.exp(params['log_s'])):.3f}",
                  flush=True)
        params = new
    # Falling, and well below chance (log N: features that match nothing).
    fell = losses[-1] < losses[0] and losses[-1] < 0.5 * np.log(N_PAIRS)
    if rank == 0:
        print(("step 1 matches the single-process loss and gradients" if ok
               else "step 1 DIFFERS from the single-process loss or gradients")
              + f"; loss {'fell' if fell else 'did NOT fall enough'}: {losses[0]:.4f} -> {losses[-1]:.4f}",
              flush=True)
    flatmem_jax.ring.finalize()
    return 0 if ok and fell else 1


if __name__ == "__main__":
    sys.exit(main())
