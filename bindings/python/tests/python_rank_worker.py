"""What one rank does in the communicator tests. Each job_<name>(comm, params)
returns a picklable value; the jobs run in subprocesses (python_ranks.py:
`python python_rank_worker.py <job> <env|uid> <outdir>`) and, with
Communicator.create_local, in threads of the test process.

Data is derived from params["seed"] alone, so every rank (and the test's
reference) builds the same global batch and takes its own shard.
"""
import os
import pickle
import sys
import time

import numpy as np

import flatmem


def global_batch(params):
    """(q, k, labels) of the whole batch: unit-norm float32 rows (CLIP-like);
    labels (InfoNCE) are global column indices, or None."""
    rng = np.random.default_rng(params["seed"])
    shards = params["shards"]
    B = sum(b for b, _ in shards)
    C = sum(c for _, c in shards)
    d = params["d"]

    def rows(n):
        x = rng.standard_normal((n, d))
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)

    q, k = rows(B), rows(C)
    labels = rng.integers(0, C, size=B).astype(np.int64) if params.get("labels") else None
    return q, k, labels


def shard_bounds(shards, rank):
    """(row start, row stop, column start, column stop) of this rank's shard."""
    r0 = sum(b for b, _ in shards[:rank])
    c0 = sum(c for _, c in shards[:rank])
    return r0, r0 + shards[rank][0], c0, c0 + shards[rank][1]


def job_ring_loss(comm, params):
    """The ring loss of this rank's shard and its gradients (dloss = 1)."""
    q, k, labels = global_batch(params)
    r0, r1, c0, c1 = shard_bounds(params["shards"], comm.rank)
    q_r, k_r = q[r0:r1], k[c0:c1]
    labels_r = labels[r0:r1] if labels is not None else None
    symmetric = params["symmetric"]
    if params.get("api") == "handle":
        with flatmem.Contrastive("symmetric" if symmetric else "infonce", num_threads=1,
                                 tile_rows=3, tile_cols=2, comm=comm) as h:
            saved = h.forward(q_r, k_r, params["s"], labels_r)
            dq, dk, ds = h.backward(q_r, k_r, params["s"], saved.row_lse, saved.col_lse, labels_r)
        loss = saved.loss
    else:
        loss, backward = flatmem.contrastive_loss(q_r, k_r, params["s"], labels=labels_r,
                                                  symmetric=symmetric, num_threads=1, comm=comm)
        dq, dk, ds = backward()
    return {"loss": float(loss), "dq": dq, "dk": dk, "ds": float(ds)}


def job_sigmoid_ring(comm, params):
    """The sigmoid (SigLIP) ring loss of this rank's shard: the loss from the
    forward, value_and_grad's five outputs and backward(g)'s four, through
    the functions (api "function") or a Contrastive("sigmoid") handle."""
    q, k, labels = global_batch(params)
    r0, r1, c0, c1 = shard_bounds(params["shards"], comm.rank)
    q_r, k_r = q[r0:r1], k[c0:c1]
    labels_r = labels[r0:r1] if labels is not None else None
    s, t, g = params["s"], params["t"], params["g"]
    if params.get("api") == "handle":
        with flatmem.Contrastive("sigmoid", num_threads=1, tile_rows=3, tile_cols=2, comm=comm) as h:
            loss = h.sigmoid_forward(q_r, k_r, s, t, labels_r)
            result = h.sigmoid_value_and_grad(q_r, k_r, s, t, labels_r)
            grads = h.sigmoid_backward(q_r, k_r, s, t, labels_r, g)
    else:
        loss, backward = flatmem.sigmoid_loss(q_r, k_r, s, t, labels_r, num_threads=1, comm=comm)
        grads = backward(g)
        result = flatmem.sigmoid_value_and_grad(q_r, k_r, s, t, labels_r, num_threads=1, comm=comm)
    return {"loss": loss, "result": tuple(result), "grads": tuple(grads)}


def job_messages(comm, params):
    """isend/irecv around the ring (and to itself), all-reduce of several
    dtypes, ring_shift and barrier."""
    r, n = comm.rank, comm.world_size
    mine = np.random.default_rng(100 + r).standard_normal((5, 3)).astype(np.float32)
    got = np.zeros_like(mine)
    recv = comm.irecv(got, (r - 1) % n, tag=7)
    send = comm.isend(mine, (r + 1) % n, tag=7)
    self_got = np.zeros(4, np.int64)
    self_recv = comm.irecv(self_got, r, tag=9)
    comm.send(np.arange(4, dtype=np.int64) + r, r, tag=9)
    send.wait()
    assert recv.wait() is got and self_recv.wait() is self_got
    sums = {}
    for dtype in ("float32", "float64", "int32", "int64"):
        x = np.random.default_rng(200 + r).standard_normal(params.get("count", 1001)) * 1e3
        x = x.astype(dtype)
        sums[dtype] = (x, comm.all_reduce(x))
    inplace = np.full(3, float(r + 1))
    comm.all_reduce(inplace, inplace)
    shifted = comm.ring_shift(np.array([r, 10 * r], np.int32))
    comm.barrier()
    return {"got": got, "self": self_got, "sums": sums, "inplace": inplace, "shifted": shifted}


def cyclic_targets(params, rank):
    """t[step, stage]: the rank's regression targets (steps, stages, m)."""
    rng = np.random.default_rng(params["seed"] * 1000 + rank)
    return rng.standard_normal((params["steps"], params["stages"], params["m"]))


def job_cyclic(comm, params):
    """A plain NumPy 'model': stage j holds w_j (m,), the loss of rank r at
    step s is sum_j 1/2 |w_j - t[s, j]|^2, so the backward of stage j gives
    w_j - t[s, j]. SGD with the averaged gradients the runtime delivers.
    Returns the final parameters and the ones each backward used."""
    t = cyclic_targets(params, comm.rank)
    L, lr = params["stages"], params["lr"]
    w = [np.zeros(params["m"]) for _ in range(L)]
    grads = [[np.zeros(params["m"]) for _ in range(2)] for _ in range(L)]
    used = {}
    with flatmem.Cyclic(comm, stages=L, steps=params["steps"], rule=params["rule"],
                        timeout_ms=20000) as cyc:
        while True:
            a = cyc.next()
            if a.kind == "done":
                break
            if a.update_stage is not None:
                w[a.update_stage] -= lr * grads[a.update_stage][a.update_step % 2]
            if a.kind == "backward":
                g = grads[a.stage][a.step % 2]
                used[(a.step, a.stage)] = w[a.stage].copy()
                np.subtract(w[a.stage], t[a.step, a.stage], out=g)
                cyc.reduce(a.stage, g)
        summary = cyc.summary()
    return {"w": w, "used": used, "time_steps": summary.time_steps}


def job_killed(comm, params):
    """The victim sleeps until it is killed; the others block in a barrier and
    report what it raised, how long it took, and the next call's error."""
    if comm.rank == params["victim"]:
        time.sleep(60)
        return None
    start = time.monotonic()
    try:
        comm.barrier(params["timeout_ms"])
    except flatmem.Error as e:
        first = (type(e).__name__, str(e), isinstance(e, (ConnectionError, TimeoutError)))
    else:
        first = None
    elapsed = time.monotonic() - start
    try:
        comm.barrier(params["timeout_ms"])
    except flatmem.Error as e:
        later = (type(e).__name__, str(e))
    else:
        later = None
    comm.abort()
    return {"first": first, "elapsed": elapsed, "later": later}


def stage_mlp(params):
    """The test MLP of the stage-parallel jobs (python_stage_mlp.StageMlp)."""
    from python_stage_mlp import StageMlp
    return StageMlp(params["widths"], params["rows"], params["seed"], params["dtype"])


def job_stages(comm, params):
    """Stage comm.rank of the stage-parallel MLP (python_stage_mlp.train_stages)."""
    from python_stage_mlp import train_stages
    return train_stages(comm, stage_mlp(params), params["micro_batches"], params["steps"], params["rule"],
                        params["lr"])


def job_relayed(comm, params):
    """The ZeRO relay and the replicated training of the same MLP on this rank."""
    from python_stage_mlp import train_data_parallel, train_relayed
    mlp = stage_mlp(params)
    return {"replicated": train_data_parallel(comm, mlp, params["steps"], "delay1", params["lr"]),
            "relayed": train_relayed(comm, mlp, params["steps"], params["lr"])}


def job_stages_killed(comm, params):
    """Stage-parallel training where stage params["victim"] stops after its
    first action (the test kills it there); the others report what they
    raised and how long it took."""
    from python_stage_mlp import train_stage
    mlp = stage_mlp(params)
    h = flatmem.CyclicStages(comm, micro_batches=params["micro_batches"], steps=params["steps"],
                             boundary_bytes=mlp.boundary_bytes(), timeout_ms=params["timeout_ms"])
    if comm.rank == params["victim"]:
        h.next()
        time.sleep(60)
        return None
    start = time.monotonic()
    try:
        train_stage(h, mlp, params["lr"])
    except flatmem.Error as e:
        first = (type(e).__name__, str(e))
    else:
        first = None
    elapsed = time.monotonic() - start
    try:
        h.next()
    except flatmem.Error as e:
        later = type(e).__name__
    else:
        later = None
    h.close()
    comm.abort()
    return {"first": first, "elapsed": elapsed, "later": later}


def communicator(mode, rank, outdir):
    """This rank's Communicator: from the environment, or from rank 0's
    UniqueId (written by rank 0 to outdir/uid as hex, read by the others)."""
    if mode == "env":
        return flatmem.Communicator.from_env(timeout_ms=20000, connect_timeout_ms=20000)
    world_size = int(os.environ["FLATMEM_WORLD_SIZE"])
    path = os.path.join(outdir, "uid")
    if rank == 0:
        uid = flatmem.UniqueId("127.0.0.1:0")
        with open(path + ".tmp", "w") as f:
            f.write(uid.hex())
        os.rename(path + ".tmp", path)
    else:
        end = time.monotonic() + 20
        while not os.path.exists(path):
            if time.monotonic() > end:
                raise TimeoutError("rank 0 wrote no unique id within 20 s")
            time.sleep(0.01)
        with open(path) as f:
            uid = bytes.fromhex(f.read())  # the id travels as bytes here (hex in the file)
    return flatmem.Communicator(rank, world_size, uid, timeout_ms=20000, connect_timeout_ms=20000)


def main():
    job, mode, outdir = sys.argv[1:4]
    rank = int(os.environ["FLATMEM_RANK"])
    with open(os.path.join(outdir, "params.pickle"), "rb") as f:
        params = pickle.load(f)
    comm = communicator(mode, rank, outdir)
    assert comm.rank == rank and comm.world_size == int(os.environ["FLATMEM_WORLD_SIZE"])
    open(os.path.join(outdir, f"ready{rank}"), "w").close()
    result = globals()["job_" + job](comm, params)
    if not comm.closed:
        comm.close()
    with open(os.path.join(outdir, f"result{rank}.pickle"), "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main()
