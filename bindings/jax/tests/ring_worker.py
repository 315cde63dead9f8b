"""One rank of the ring tests (test_jax_ring.py launches world_size of them
through ring_launch.py, which sets FLATMEM_RANK / _WORLD_SIZE / _COORDINATOR).

    python ring_worker.py values [--explicit]   the value and gradient checks
    python ring_worker.py jax-distributed ADDR  rank and size from jax.distributed (coordinator ADDR)
    python ring_worker.py single                world size 1 and bad input
    python ring_worker.py mismatch              a rank-dependent logit scale, then bad labels on one rank
    python ring_worker.py killed                the last rank dies; the others must fail
    python ring_worker.py sigmoid               sigmoid_loss(comm=...) checks, then a bias
                                                that differs on one rank

Each check that passes prints "CHECKED <name> <loss bits> <ds bits> [<dt
bits>]" (the parent compares the bits across ranks: flatmem promises identical
loss, ds and dt on every rank); an expected failure prints "FAILED <name> <elapsed s>
<message>". An assertion error exits non-zero. JAX's start-up is slow, so each
process runs a batch of checks."""
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import flatmem_jax
from jax_checks import check_grads, check_loss, check_sigmoid, unit_rows

RUNTIME = (jax.errors.JaxRuntimeError, ValueError)  # as test_jax_errors.py


def bits(x):
    return f"{np.asarray(x, np.float32).reshape(()).view(np.uint32):08x}"


def offsets(sizes):
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int)


def ring_value_and_grad(symmetric, comm):
    if symmetric:
        def loss(q, k, s, labels):
            return flatmem_jax.clip_loss(q, k, s, comm=comm)
    else:
        def loss(q, k, s, labels):
            return flatmem_jax.infonce_loss(q, k, s, labels, comm=comm)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def foreign_labels(seed, row_sizes, col_sizes):
    """Global labels (B,) where each rank's rows point at OTHER ranks'
    columns (with one rank: anywhere)."""
    rng = np.random.default_rng(seed)
    rows, cols = offsets(row_sizes), offsets(col_sizes)
    labels = []
    for r in range(len(row_sizes)):
        others = [j for j in range(cols[-1]) if not cols[r] <= j < cols[r + 1]] or list(range(cols[-1]))
        labels.extend(rng.choice(others, row_sizes[r]))
    return np.asarray(labels, np.int64)


def global_batch(seed, rank, row_sizes, col_sizes, d, dtype, labelled):
    """The global q, k and labels of a case (the same seeds on every rank), and
    this rank's row and column slices of them and its labels."""
    q, k = unit_rows(seed, sum(row_sizes), d, dtype), unit_rows(seed + 1, sum(col_sizes), d, dtype)
    labels = foreign_labels(seed + 2, row_sizes, col_sizes) if labelled else None
    rows, cols = offsets(row_sizes), offsets(col_sizes)
    mine_r, mine_c = slice(rows[rank], rows[rank + 1]), slice(cols[rank], cols[rank + 1])
    my_labels = None if labels is None else jnp.asarray(labels[mine_r])
    return q, k, labels, mine_r, mine_c, my_labels


def check_case(name, comm, symmetric, row_sizes, col_sizes, d, s, dtype, labelled):
    """This rank's shard of a global batch through the ring under
    jit(value_and_grad), against the float64 loss and gradients of the
    concatenated batch."""
    q, k, labels, mine_r, mine_c, my_labels = global_batch(101, comm.rank, row_sizes, col_sizes,
                                                           d, dtype, labelled)
    loss, grads = ring_value_and_grad(symmetric, comm)(q[mine_r], k[mine_c], jnp.float32(s),
                                                       my_labels)
    check_loss(loss, q, k, s, labels, symmetric)
    check_grads(grads, q, k, s, labels, symmetric, rows=mine_r, cols=mine_c)
    print("CHECKED", name, bits(loss), bits(grads[2]), flush=True)


def cases(n):
    """(symmetric, row sizes, column sizes, d, s, labelled) per world size:
    1 row, primes, uneven shards, d = 1, a large scale."""
    uneven = {2: [1, 6], 4: [1, 5, 2, 3]}[n]
    primes = {2: [13, 7], 4: [7, 2, 11, 3]}[n]
    ones = [1] * n
    return {
        "clip-uneven": (True, uneven, uneven, 7, 14.3, False),
        "clip-one-row-each": (True, ones, ones, 4, 14.3, False),
        "clip-primes-s100": (True, primes, primes, 3, 100.0, False),
        "clip-d1": (True, primes, primes, 1, 5.0, False),
        "infonce-foreign-labels": (False, uneven, primes, 5, 20.0, True),
        "infonce-one-row-each": (False, ones, uneven, 6, 20.0, True),
        "infonce-no-labels": (False, uneven, primes, 4, 10.0, False),  # C >= B on every prefix
    }


def values(explicit):
    if explicit:  # initialize()'s arguments instead of the environment
        comm = flatmem_jax.ring.initialize(
            os.environ["FLATMEM_COORDINATOR"], int(os.environ.pop("FLATMEM_RANK")),
            int(os.environ.pop("FLATMEM_WORLD_SIZE")))
        assert "FLATMEM_RANK" not in os.environ, "initialize must restore the environment"
    else:
        comm = flatmem_jax.ring.initialize()
    assert flatmem_jax.ring.initialize() is comm is flatmem_jax.ring.communicator()
    for dtype in (jnp.float32, jnp.bfloat16):
        for name, case in cases(comm.world_size).items():
            check_case(f"{name}-{jnp.dtype(dtype).name}", comm, *case[:5], dtype, case[5])
    # The all-reduce, eagerly and under jit: exact integer-valued sums.
    x = jnp.arange(6, dtype=jnp.float32).reshape(2, 3) * (comm.rank + 1)
    n = comm.world_size
    np.testing.assert_array_equal(jax.jit(comm.all_reduce)(x), np.arange(6).reshape(2, 3) * n * (n + 1) / 2)
    np.testing.assert_array_equal(comm.all_reduce(jnp.int32(comm.rank)), n * (n - 1) // 2)
    comm.barrier()
    flatmem_jax.ring.finalize()
    print("DONE", flush=True)


def sigmoid_cases(n):
    """(row sizes, column sizes, d, s, t, labelled, recompute) per world size:
    uneven shards, labels pointing at other ranks' columns, the diagonal
    default (C >= B on every prefix), one row per rank, s = 100 with t = -10,
    and the recomputing backward."""
    uneven = {2: [1, 6], 4: [1, 5, 2, 3]}[n]
    primes = {2: [13, 7], 4: [7, 2, 11, 3]}[n]
    return {
        "sigmoid-foreign-labels": (uneven, primes, 5, 10.0, -10.0, True, False),
        "sigmoid-no-labels": (uneven, primes, 4, 10.0, -3.0, False, False),
        "sigmoid-one-row-each": ([1] * n, uneven, 6, 10.0, 0.5, True, False),
        "sigmoid-primes-s100": (primes, primes, 3, 100.0, -10.0, False, False),
        "sigmoid-recompute": (uneven, primes, 5, 10.0, -10.0, True, True),
    }


def check_sigmoid_case(name, comm, row_sizes, col_sizes, d, s, t, labelled, recompute, dtype):
    """This rank's shard of a global batch through sigmoid_loss(comm=...) under
    jit(value_and_grad) against the float64 loss and gradients (q, k, s, t)
    of the concatenated batch."""
    q, k, labels, mine_r, mine_c, my_labels = global_batch(201, comm.rank, row_sizes, col_sizes,
                                                           d, dtype, labelled)

    def run(recompute):
        def loss(q, k, s, t):
            return flatmem_jax.sigmoid_loss(q, k, s, t, my_labels, recompute=recompute, comm=comm)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(
            q[mine_r], k[mine_c], jnp.float32(s), jnp.float32(t))

    value, grads = run(recompute)
    check_sigmoid(value, grads, q, k, s, t, labels, rows=mine_r, cols=mine_c)
    if recompute:  # flatmem's backward with dloss = 1: value_and_grad's bits
        saved = run(False)
        assert value == saved[0], (value, saved[0])
        for a, b in zip(grads, saved[1]):
            np.testing.assert_array_equal(a, b)
    print("CHECKED", name, bits(value), bits(grads[2]), bits(grads[3]), flush=True)


def sigmoid():
    comm = flatmem_jax.ring.initialize()
    for dtype in (jnp.float32, jnp.bfloat16):
        for name, case in sigmoid_cases(comm.world_size).items():
            check_sigmoid_case(f"{name}-{jnp.dtype(dtype).name}", comm, *case, dtype)
    # A bias that differs on rank 0: every rank fails, naming logit_bias.
    q, k = unit_rows(1, 3, 4), unit_rows(2, 3, 4)
    f = jax.jit(lambda q, k, t: flatmem_jax.sigmoid_loss(q, k, 10.0, t, comm=comm))
    message = expect_failure("bias", f, q, k, jnp.float32(-1.0 if comm.rank == 0 else -2.0))
    assert "FLATMEM_STATUS_INVALID_ARGUMENT" in message and "logit_bias" in message, message
    print("DONE", flush=True)


def jax_distributed(address):
    """initialize(from_jax_distributed=True): rank and world size are JAX's
    process index and count (the FLATMEM_RANK / _WORLD_SIZE of the launcher
    are removed first, so flatmem cannot have read them)."""
    rank, world = int(os.environ.pop("FLATMEM_RANK")), int(os.environ.pop("FLATMEM_WORLD_SIZE"))
    jax.distributed.initialize(address, num_processes=world, process_id=rank,
                               initialization_timeout=30)
    comm = flatmem_jax.ring.initialize(os.environ["FLATMEM_COORDINATOR"], from_jax_distributed=True)
    assert (comm.rank, comm.world_size) == (jax.process_index(), jax.process_count()) == (rank, world)
    check_case("clip-uneven-float32", comm, *cases(world)["clip-uneven"][:5], jnp.float32, False)
    flatmem_jax.ring.finalize()
    jax.distributed.shutdown()
    print("DONE", flush=True)


def expect_failure(name, f, *args):
    """Runs f(*args) to completion; it must raise XLA's error. Prints it."""
    start = time.monotonic()
    try:
        jax.block_until_ready(f(*args))
    except RUNTIME as e:
        message = " ".join(str(e).split())
        print("FAILED", name, f"{time.monotonic() - start:.2f}", message, flush=True)
        return message
    raise AssertionError(f"{name}: no error")


def mismatch():
    comm = flatmem_jax.ring.initialize()
    r = comm.rank
    q, k = unit_rows(1, 3, 4), unit_rows(2, 3, 4)
    clip = jax.jit(lambda q, k, s: flatmem_jax.clip_loss(q, k, s, comm=comm))
    expect_failure("scale", clip, q, k, jnp.float32(10.0 if r == 0 else 20.0))
    # Labels out of range on the last rank only (every rank has 3 columns: C = 3 n).
    labels = jnp.asarray([0, 1, 3 * comm.world_size if r == comm.world_size - 1 else 2])
    infonce = jax.jit(lambda q, k, s, y: flatmem_jax.infonce_loss(q, k, s, y, comm=comm))
    expect_failure("labels", infonce, q, k, jnp.float32(10.0), labels)
    # A feature dimension that differs on rank 0.
    d = 5 if r == 0 else 4
    expect_failure("d", clip, unit_rows(1, 3, d), unit_rows(2, 3, d), jnp.float32(10.0))
    # precision= (options.fp32_precision) "tf32" on rank 0, "full" elsewhere.
    precision = "tf32" if r == 0 else "full"
    expect_failure("precision", jax.jit(lambda q, k, s: flatmem_jax.clip_loss(
        q, k, s, comm=comm, precision=precision)), q, k, jnp.float32(10.0))
    print("DONE", flush=True)


def killed():
    comm = flatmem_jax.ring.initialize(timeout_ms=5000)
    comm.barrier()
    if comm.rank == comm.world_size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    q, k = unit_rows(1, 3, 4), unit_rows(2, 3, 4)
    clip = jax.jit(lambda q, k, s: flatmem_jax.clip_loss(q, k, s, comm=comm))
    expect_failure("killed-peer", clip, q, k, jnp.float32(10.0))
    # Poisoned: later calls fail at once, with the first error's text.
    expect_failure("after", clip, q, k, jnp.float32(10.0))
    comm.abort()
    print("DONE", flush=True)


def single():
    """World size 1: the ring equals the single-process loss bit for bit
    (flatmem.h), and bad input raises naming the argument."""
    comm = flatmem_jax.ring.initialize()
    assert (comm.rank, comm.world_size) == (0, 1)
    q, k = unit_rows(5, 9, 6), unit_rows(6, 9, 6)
    ring = jax.jit(jax.value_and_grad(lambda q, k, s: flatmem_jax.clip_loss(q, k, s, comm=comm),
                                      argnums=(0, 1, 2)))
    alone = jax.jit(jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2)))
    (l1, g1), (l2, g2) = ring(q, k, 7.0), alone(q, k, 7.0)
    assert l1 == l2, (l1, l2)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)
    labels = jnp.asarray([3, 0, 8, 1, 1, 2, 7, 5, 4])
    y1 = flatmem_jax.infonce_loss(q, k, 7.0, labels, comm=comm)
    assert y1 == flatmem_jax.infonce_loss(q, k, 7.0, labels), y1
    # precision=: the ring handle of each (loss, precision) -- fp32 on the CPU, so the
    # default's bits -- and a value flatmem refuses reaches its options.fp32_precision.
    for precision in ("tf32", "full"):
        ring_p = jax.jit(jax.value_and_grad(
            lambda q, k, s, p=precision: flatmem_jax.clip_loss(q, k, s, comm=comm, precision=p),
            argnums=(0, 1, 2)))
        l3, g3 = ring_p(q, k, 7.0)
        assert l3 == l1, (precision, l3, l1)
        for a, b in zip(g3, g1):
            np.testing.assert_array_equal(a, b)
        assert flatmem_jax.infonce_loss(q, k, 7.0, labels, comm=comm, precision=precision) == y1
        for recompute in (False, True):
            sig = jax.value_and_grad(
                lambda q, k, p=precision, r=recompute: flatmem_jax.sigmoid_loss(
                    q, k, 7.0, -1.0, labels, comm=comm, recompute=r, precision=p), argnums=(0, 1))
            want = jax.value_and_grad(
                lambda q, k, r=recompute: flatmem_jax.sigmoid_loss(q, k, 7.0, -1.0, labels,
                                                                   recompute=r), argnums=(0, 1))
            for a, b in zip(jax.tree_util.tree_leaves(sig(q, k)), jax.tree_util.tree_leaves(want(q, k))):
                np.testing.assert_array_equal(a, b)
    try:
        flatmem_jax.clip_loss(q, k, 7.0, comm=comm, precision="half")
    except ValueError as e:
        assert "precision: 'half' is not one of 'default', 'round_once' ('tf32'), 'full'" in str(e), str(e)
    else:
        raise AssertionError("precision='half': no error")
    for loss in (flatmem_jax._SYMMETRIC, flatmem_jax._INFONCE):
        message = expect_failure("bad-precision", flatmem_jax._forward, loss,
                                 flatmem_jax._Site((0, comm.slot, 7)), q, k, jnp.float32(7.0), None)
        assert "flatmem_contrastive_create" in message and "options.fp32_precision: 7" in message, message
    message = expect_failure("bad-precision", flatmem_jax._sigmoid_call, flatmem_jax._Site((0, comm.slot, 7)),
                             "forward", q, k, jnp.float32(7.0), jnp.float32(-1.0), None)
    assert "options.fp32_precision: 7" in message, message
    # The communicator is unharmed (the create failed before any collective).
    assert flatmem_jax.clip_loss(q, k, 7.0, comm=comm) == l1
    # init_device (the NCCL transport of the ring on XLA:GPU) where JAX sees no GPU: flatmem
    # refuses it -- UNSUPPORTED (no NCCL in this flatmem, or no usable CUDA driver) or
    # INVALID_ARGUMENT (no device 0) -- and the communicator stays healthy and usable.
    if not any(device.platform == "gpu" for device in jax.devices()):
        try:
            comm.init_device(0)
        except flatmem_jax.FlatmemError as e:
            assert e.status in ("FLATMEM_STATUS_UNSUPPORTED", "FLATMEM_STATUS_INVALID_ARGUMENT"), str(e)
        else:
            raise AssertionError("init_device(0) without a GPU: no error")
        comm.health()
        assert flatmem_jax.clip_loss(q, k, 7.0, comm=comm) == l1
    for bad, error, pattern in (
            (dict(comm="rank0"), TypeError, "comm must be a flatmem_jax.RingComm"),
            (dict(comm=comm, logit_cache_bytes=64), ValueError, "logit_cache_bytes must be 0 with comm")):
        try:
            flatmem_jax.clip_loss(q, k, 7.0, **bad)
        except error as e:
            assert pattern in str(e), str(e)
        else:
            raise AssertionError(f"{bad}: no error")
    try:
        comm.all_reduce(jnp.zeros(3, jnp.bfloat16))
    except TypeError as e:
        assert "all_reduce: x has dtype bfloat16" in str(e), str(e)
    else:
        raise AssertionError("bf16 all_reduce: no error")
    try:
        flatmem_jax.RingComm(12345)
    except flatmem_jax.FlatmemError as e:
        assert "no communicator has slot 12345" in str(e) and e.status == "FLATMEM_STATUS_INVALID_ARGUMENT", str(e)
    else:
        raise AssertionError("slot 12345: no error")
    compiled = jax.jit(lambda q, k: flatmem_jax.clip_loss(q, k, 7.0, comm=comm))
    compiled(q, k).block_until_ready()
    flatmem_jax.ring.finalize()
    assert comm.closed
    # A program compiled before the close names the closed slot: refused when it runs.
    message = expect_failure("closed-slot", compiled, q, k)
    assert "was closed" in message, message
    try:
        flatmem_jax.clip_loss(q, k, 7.0, comm=comm)
    except ValueError as e:
        assert "was closed" in str(e), str(e)
    else:
        raise AssertionError("closed comm: no error")
    try:
        flatmem_jax.ring.communicator()
    except RuntimeError as e:
        assert "call flatmem_jax.ring.initialize() first" in str(e)
    else:
        raise AssertionError("communicator() after finalize: no error")
    print("DONE", flush=True)


if __name__ == "__main__":
    scenario = sys.argv[1]
    if scenario == "values":
        values("--explicit" in sys.argv[2:])
    elif scenario == "jax-distributed":
        jax_distributed(sys.argv[2])
    else:
        {"mismatch": mismatch, "killed": killed, "single": single, "sigmoid": sigmoid}[scenario]()
