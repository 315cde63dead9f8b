"""flatmem.Communicator, the ring loss (contrastive_loss / Contrastive with
comm=) and the Cyclic runtime, across 2, 3 and 4 processes over UCX (TCP on
loopback) and inside one process (Communicator.create_local, one thread per
rank), against float64 references of the whole (concatenated) batch.

Every subprocess and every thread has a hard deadline: python_ranks.py kills
ranks that overrun and fails the test; the communicators' own timeouts bound
every wait."""
import os
import threading
import time

import numpy as np
import pytest
from python_ranks import launch, run
from python_rank_worker import (cyclic_targets, global_batch, job_cyclic, job_messages, job_ring_loss,
                                job_sigmoid_ring, shard_bounds)
from python_reference import U32, contrastive_reference, forward_tolerance, gradient_tolerances
from python_sigmoid_reference import sigmoid_reference, sigmoid_tolerances
from python_support import raises_flatmem

import flatmem
from flatmem import capi

U64 = 2.0**-53  # fp64 unit roundoff


def gamma_u(n, u):
    """gamma_n = n u / (1 - n u) for unit roundoff u."""
    return n * u / (1 - n * u)


def run_threads(comms, job, params=None, deadline_s=30):
    """job(comm, params) on a thread per rank of an in-process group; returns
    the results (re-raises the first exception). Each collective is bounded by
    the group's timeout_ms, the whole by deadline_s."""
    results = [None] * len(comms)
    errors = [None] * len(comms)

    def target(r):
        try:
            results[r] = job(comms[r], params)
        except BaseException as e:  # noqa: B902 - handed to the test
            errors[r] = e

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(len(comms))]
    for t in threads:
        t.start()
    end = time.monotonic() + deadline_s
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"ranks still running after {deadline_s} s"
    for e in errors:
        if e is not None:
            raise e
    return results


@pytest.fixture
def local_group(request):
    """A factory of in-process groups, closed after the test."""
    made = []

    def make(world_size, timeout_ms=10000):
        comms = flatmem.Communicator.create_local(world_size, timeout_ms=timeout_ms)
        made.extend(comms)
        return comms

    yield make
    for c in made:
        for h in list(c._contrastive.values()):
            h.close()
        if not c.closed and c._raw.users() == 0:
            c.abort()


# ---------------------------------------------------------------------------
# messages, all-reduce, ring shift, barrier
# ---------------------------------------------------------------------------

def check_messages(results):
    n = len(results)
    for r, res in enumerate(results):
        sent = np.random.default_rng(100 + (r - 1) % n).standard_normal((5, 3)).astype(np.float32)
        assert np.array_equal(res["got"], sent)
        assert np.array_equal(res["self"], np.arange(4) + r)
        np.testing.assert_array_equal(res["inplace"], np.full(3, n * (n + 1) / 2))
        left = (r - 1) % n
        assert res["shifted"].tolist() == [left, 10 * left]
    for dtype in ("float32", "float64", "int32", "int64"):
        inputs = [res["sums"][dtype][0] for res in results]
        outputs = [res["sums"][dtype][1] for res in results]
        for out in outputs[1:]:  # bitwise the same on every rank
            assert out.dtype == outputs[0].dtype and out.tobytes() == outputs[0].tobytes()
        if dtype.startswith("int"):
            exact = np.sum([x.astype(np.int64) for x in inputs], axis=0)
            np.testing.assert_array_equal(outputs[0], exact.astype(dtype))
        else:
            # The reference: x86 long double (64-bit significand), so its own
            # error is at most (n - 1) 2^-64 sum_r |x_r|. The library makes
            # n - 1 additions in the element type, in some fixed order: each
            # partial sum is rounded once, so |error| <= gamma_(n-1) sum_r |x_r|.
            wide = [x.astype(np.longdouble) for x in inputs]
            exact = np.sum(wide, axis=0)
            magnitude = np.sum(np.abs(wide), axis=0)
            u = U32 if dtype == "float32" else U64
            bound = (gamma_u(n - 1, u) + (n - 1) * 2.0**-64) * magnitude
            assert np.all(np.abs(outputs[0].astype(np.longdouble) - exact) <= bound)


@pytest.mark.parametrize("mode, world_size", [("env", 2), ("env", 3), ("env", 4), ("uid", 2), ("uid", 3)])
def test_processes_bootstrap_and_messages(tmp_path, mode, world_size):
    """Ranks in separate processes, bootstrapped from the environment or from
    rank 0's UniqueId (sent as bytes through a file): point-to-point messages,
    all-reduce (bitwise equal on all ranks, the float64 sum within rounding),
    ring shift and barrier."""
    check_messages(run(tmp_path, "messages", world_size, {"count": 1001}, mode=mode))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_local_group_messages(local_group, world_size):
    check_messages(run_threads(local_group(world_size), job_messages, {"count": 33}))


# ---------------------------------------------------------------------------
# the ring loss vs the single-process float64 loss of the concatenated batch
# ---------------------------------------------------------------------------

# (id, shards [(b_r, c_r) per rank], d, symmetric, global labels?, api)
RING_CASES = [
    ("sym-2-one-row", [(1, 1), (4, 4)], 8, True, False, "function"),
    ("infonce-3-labels-uneven", [(2, 5), (3, 1), (1, 3)], 7, False, True, "function"),
    ("sym-4-primes-handle", [(3, 3), (5, 5), (1, 1), (2, 2)], 11, True, False, "handle"),
    ("infonce-3-identity", [(2, 3), (2, 2), (1, 2)], 5, False, False, "handle"),
]


def check_ring(params, results):
    q, k, labels = global_batch(params)
    s, symmetric = params["s"], params["symmetric"]
    ref_loss, _, _, ref_ds, _, _ = contrastive_reference(q, k, s, labels, symmetric)
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q, k, s, labels, symmetric)
    _, ref_dq, ref_dk, _, _, _ = contrastive_reference(q, k, s, labels, symmetric)
    # The loss and ds are one all-reduce each: identical bits on every rank.
    assert len({res["loss"] for res in results}) == 1
    assert len({res["ds"] for res in results}) == 1
    # The ring changes only the order of fp32 sums: the single-process
    # worst-case bounds of python_reference (derived for any order) hold.
    assert abs(results[0]["loss"] - ref_loss) <= forward_tolerance(q, k, s, ref_loss)
    assert abs(results[0]["ds"] - ref_ds) <= tau_ds
    for rank, res in enumerate(results):
        r0, r1, c0, c1 = shard_bounds(params["shards"], rank)
        assert res["dq"].shape == (r1 - r0, q.shape[1]) and res["dk"].shape == (c1 - c0, k.shape[1])
        assert np.all(np.abs(res["dq"] - ref_dq[r0:r1]) <= tau_dq[r0:r1]), rank
        assert np.all(np.abs(res["dk"] - ref_dk[c0:c1]) <= tau_dk[c0:c1]), rank


def ring_params(case, seed):
    _, shards, d, symmetric, labels, api = case
    return {"seed": seed, "shards": shards, "d": d, "symmetric": symmetric, "labels": labels,
            "api": api, "s": 12.0}


@pytest.mark.parametrize("case", RING_CASES, ids=[c[0] for c in RING_CASES])
def test_processes_ring_loss_matches_concatenated_batch(tmp_path, case):
    """Value, dq, dk and dlogit_scale of each rank's shard equal those of the
    whole batch in one process (exact gradients of the GLOBAL mean)."""
    params = ring_params(case, 7)
    check_ring(params, run(tmp_path, "ring_loss", len(params["shards"]), params))


LOCAL_RING_CASES = RING_CASES + [
    ("sym-1-rank", [(6, 6)], 4, True, False, "function"),
    ("infonce-2-labels-far", [(1, 6), (5, 1)], 9, False, True, "function"),
    ("sym-3-uneven", [(7, 7), (2, 2), (5, 5)], 13, True, False, "function"),
]


@pytest.mark.parametrize("case", LOCAL_RING_CASES, ids=[c[0] for c in LOCAL_RING_CASES])
def test_local_group_ring_loss_matches_concatenated_batch(local_group, case):
    params = ring_params(case, 11)
    check_ring(params, run_threads(local_group(len(params["shards"])), job_ring_loss, params))


# ---------------------------------------------------------------------------
# the sigmoid (SigLIP) ring loss vs the single-process float64 loss of the
# concatenated batch
# ---------------------------------------------------------------------------

# (id, shards [(b_r, c_r) per rank], d, global labels?, api, s, t). Labels are
# drawn over all C global columns: most point at other ranks' columns.
SIGMOID_RING_CASES = [
    ("2-uneven-labels", [(1, 4), (5, 2)], 7, True, "function", 10.0, -10.0),
    ("2-identity-handle", [(3, 4), (2, 2)], 5, False, "handle", 100.0, -10.0),
    ("4-primes-labels-handle", [(3, 2), (5, 7), (1, 1), (2, 3)], 11, True, "handle", 100.0, -10.0),
    ("4-uneven-identity", [(2, 3), (1, 1), (4, 5), (1, 2)], 3, False, "function", 10.0, 0.5),
]


def sigmoid_ring_params(case, seed):
    _, shards, d, labels, api, s, t = case
    return {"seed": seed, "shards": shards, "d": d, "labels": labels, "api": api, "s": s, "t": t, "g": -2.0}


def check_sigmoid_ring(params, results):
    """Every rank's loss, dlogit_scale and dlogit_bias are the same bits; the
    values and each rank's slices of dq, dk are those of the whole batch in
    one process, within the single-process bounds (derived for any summation
    order); backward(g) is g * value_and_grad (g = -2: exact scaling)."""
    q, k, labels = global_batch(params)
    s, t, g = params["s"], params["t"], params["g"]
    ref = sigmoid_reference(q, k, s, t, labels)
    tol = sigmoid_tolerances(q, k, s, t, labels)
    for name, pick in (("loss", lambda r: r["loss"]), ("vg loss", lambda r: r["result"][0]),
                       ("ds", lambda r: r["result"][3]), ("dt", lambda r: r["result"][4])):
        assert len({float(pick(r)) for r in results}) == 1, name
    first = results[0]
    assert abs(float(first["loss"]) - ref["loss"]) <= tol["loss"], (float(first["loss"]), ref["loss"])
    assert abs(float(first["result"][0]) - ref["loss"]) <= tol["loss"]
    assert abs(float(first["result"][3]) - ref["ds"]) <= tol["ds"], (float(first["result"][3]), ref["ds"])
    assert abs(float(first["result"][4]) - ref["dt"]) <= tol["dt"], (float(first["result"][4]), ref["dt"])
    for rank, res in enumerate(results):
        r0, r1, c0, c1 = shard_bounds(params["shards"], rank)
        _, dq, dk, _, _ = res["result"]
        assert dq.shape == (r1 - r0, q.shape[1]) and dk.shape == (c1 - c0, k.shape[1])
        assert np.all(np.abs(dq - ref["dq"][r0:r1]) <= tol["dq"][r0:r1]), rank
        assert np.all(np.abs(dk - ref["dk"][c0:c1]) <= tol["dk"][c0:c1]), rank
        for got, want in zip(res["grads"], res["result"][1:]):
            np.testing.assert_array_equal(got, np.float32(g) * want)


@pytest.mark.parametrize("case", SIGMOID_RING_CASES, ids=[c[0] for c in SIGMOID_RING_CASES])
def test_processes_sigmoid_ring_matches_concatenated_batch(tmp_path, case):
    """2 and 4 processes, uneven shards, labels pointing at other ranks' columns."""
    params = sigmoid_ring_params(case, 17)
    check_sigmoid_ring(params, run(tmp_path, "sigmoid_ring", len(params["shards"]), params))


LOCAL_SIGMOID_RING_CASES = SIGMOID_RING_CASES + [
    ("1-rank", [(6, 7)], 4, False, "function", 10.0, -10.0),
    ("3-labels-far", [(1, 6), (5, 1), (2, 2)], 9, True, "handle", 10.0, -10.0),
]


@pytest.mark.parametrize("case", LOCAL_SIGMOID_RING_CASES, ids=[c[0] for c in LOCAL_SIGMOID_RING_CASES])
def test_local_group_sigmoid_ring_matches_concatenated_batch(local_group, case):
    params = sigmoid_ring_params(case, 19)
    check_sigmoid_ring(params, run_threads(local_group(len(params["shards"])), job_sigmoid_ring, params))


def test_sigmoid_ring_bias_that_differs_between_ranks_is_named(local_group):
    """Every rank must pass the same logit bias: each rank raises (nothing hangs)."""
    comms = local_group(2, timeout_ms=5000)
    q = np.eye(2, 3, dtype=np.float32)

    def job(comm, _):
        with pytest.raises(flatmem.InvalidArgumentError, match="logit_bias"):
            flatmem.sigmoid_loss(q, q, 10.0, -1.0 * (comm.rank + 1), comm=comm)

    run_threads(comms, job)


def test_sigmoid_ring_workspace_is_refused_and_queried_as_zero(local_group):
    """The ring keeps its own buffers: the query says 0 bytes and a workspace
    is refused on every rank, naming it (nothing hangs)."""
    comms = local_group(2, timeout_ms=5000)
    q = np.eye(2, 3, dtype=np.float32)

    def job(comm, _):
        with flatmem.Contrastive("sigmoid", comm=comm) as h:
            assert h.sigmoid_workspace_size(q, q, dq=True, dk=True) == 0
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                                "workspace: must be NULL (and workspace_bytes 0) for a handle with a communicator"):
                h.sigmoid_value_and_grad(q, q, 10.0, -1.0, workspace=np.empty(64, np.uint8))

    run_threads(comms, job)


# ---------------------------------------------------------------------------
# the cyclic runtime vs plain SGD
# ---------------------------------------------------------------------------

def sgd_reference(params, world_size, delay):
    """SGD on the average over ranks of the gradients w_j - t_r[s, j], where
    step s computes its gradient with the parameters after the averages of
    steps 0 .. s - 1 - delay were applied (SYNC: delay 0; DELAY1: 1).
    Returns (final w, {(step, stage): w used})."""
    t = [cyclic_targets(params, r) for r in range(world_size)]
    L, m, lr, steps = params["stages"], params["m"], params["lr"], params["steps"]
    w = np.zeros((L, m))
    averages, used = [], {}
    applied = 0
    for s in range(steps):
        while applied < s - delay:
            w = w - lr * averages[applied]
            applied += 1
        for j in range(L):
            used[(s, j)] = w[j].copy()
        averages.append(np.mean([w - t[r][s] for r in range(world_size)], axis=0))
    for avg in averages[applied:]:
        w = w - lr * avg
    return w, used


def check_cyclic(params, results, delay):
    ref_w, ref_used = sgd_reference(params, len(results), delay)
    # float64 throughout; the runtime sums the N gradients in its own order and
    # scales by 1/N: each step adds a few roundings of O(1) values (2^-53
    # relative), at most steps * (N + 3) of them per parameter: 1e-12 is
    # 100x that, while one gradient applied late or twice moves w by lr * O(1).
    for res in results:
        np.testing.assert_allclose(np.array(res["w"]), ref_w, rtol=0, atol=1e-12)
        assert set(res["used"]) == set(ref_used)
        for key, w in res["used"].items():
            np.testing.assert_allclose(w, ref_used[key], rtol=0, atol=1e-12)


CYCLIC_CASES = [("sync", 2, 0), ("sync", 3, 0), ("delay1", 3, 1)]


@pytest.mark.parametrize("rule, world_size, delay", CYCLIC_CASES)
def test_processes_cyclic_equals_sgd(tmp_path, rule, world_size, delay):
    """SYNC is plain data-parallel SGD; DELAY1 is SGD with one step of delay."""
    params = {"seed": 3, "stages": 2, "steps": 4, "m": 5, "lr": 0.3, "rule": rule}
    check_cyclic(params, run(tmp_path, "cyclic", world_size, params), delay)


@pytest.mark.parametrize("rule, world_size, delay", [("sync", 4, 0), ("delay1", 4, 1), ("delay1", 1, 1)])
def test_local_group_cyclic_equals_sgd(local_group, rule, world_size, delay):
    params = {"seed": 5, "stages": 3, "steps": 3, "m": 4, "lr": 0.25, "rule": rule}
    check_cyclic(params, run_threads(local_group(world_size), job_cyclic, params), delay)


# ---------------------------------------------------------------------------
# a killed rank
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("world_size, victim", [(3, 1), (4, 0)])
def test_killed_rank_raises_on_the_others(tmp_path, world_size, victim):
    """SIGKILL of one rank while the others wait in a barrier: each of them
    raises PeerFailureError (a ConnectionError) or CommTimeoutError within the
    timeout, naming the dead rank; the next call raises CommPoisonedError."""
    timeout_ms = 8000
    ranks = launch(tmp_path, "killed", world_size, {"victim": victim, "timeout_ms": timeout_ms})
    ranks.wait_ready(range(world_size), 30)
    time.sleep(0.2)  # let the others enter the barrier
    ranks.kill(victim)
    results = ranks.results(30, expect_killed=(victim,))
    for rank, res in enumerate(results):
        if rank == victim:
            continue
        name, message, builtin = res["first"]
        assert name in ("PeerFailureError", "CommTimeoutError") and builtin, res
        assert f"rank {victim}" in message, message
        assert res["elapsed"] < timeout_ms / 1000 + 1.0
        assert res["later"][0] == "CommPoisonedError" and f"rank {victim}" in res["later"][1]


def test_local_group_abort_fails_the_peer(local_group):
    """abort() of one rank makes the other's wait raise PeerFailureError
    naming it (not a timeout)."""
    c0, c1 = local_group(2, timeout_ms=5000)
    start = time.monotonic()

    def rank1(comm, _):
        time.sleep(0.2)
        comm.abort()

    def rank0(comm, _):
        with pytest.raises(flatmem.PeerFailureError, match="rank 1"):
            comm.barrier()

    run_threads([c0, c1], lambda comm, p: (rank0 if comm is c0 else rank1)(comm, p))
    assert time.monotonic() - start < 4.0
    with pytest.raises(flatmem.CommPoisonedError) as info:
        c0.barrier()
    assert isinstance(info.value, ConnectionError)


# ---------------------------------------------------------------------------
# the GIL is released while a rank waits
# ---------------------------------------------------------------------------

def assert_waits_without_gil(blocking, unblock):
    """blocking() runs in a thread and cannot return before unblock() is
    called by this thread. If blocking() held the GIL while it waits, this
    thread could not run Python code until blocking() gave up (its timeout):
    we count loop iterations while it is blocked."""
    done = threading.Event()
    errors = []

    def target():
        try:
            blocking()
        except BaseException as e:  # noqa: B902
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    iterations = 0
    end = time.monotonic() + 0.3
    while time.monotonic() < end:
        iterations += 1
    assert not done.is_set(), f"the blocking call returned early: {errors}"
    unblock()
    thread.join(10)
    assert not thread.is_alive() and not errors, errors
    assert iterations > 1000


GIL_TIMEOUT_MS = 3000


def test_barrier_wait_all_reduce_release_the_gil(local_group):
    c0, c1 = local_group(2, timeout_ms=GIL_TIMEOUT_MS)
    assert_waits_without_gil(c0.barrier, c1.barrier)
    got = np.zeros(3)
    request = c0.irecv(got, 1, tag=5)
    assert_waits_without_gil(request.wait, lambda: c1.send(np.ones(3), 0, tag=5))
    assert got.tolist() == [1, 1, 1]
    x0, x1 = np.ones(4), np.full(4, 2.0)
    assert_waits_without_gil(lambda: c0.all_reduce(x0, x0), lambda: c1.all_reduce(x1, x1))
    assert x0.tolist() == [3.0] * 4


def test_ring_forward_and_cyclic_next_release_the_gil(local_group):
    c0, c1 = local_group(2, timeout_ms=GIL_TIMEOUT_MS)
    q = np.eye(3, 4, dtype=np.float32)
    out = {}
    assert_waits_without_gil(lambda: out.setdefault(0, flatmem.contrastive_loss(q, q, 5.0, comm=c0)),
                             lambda: out.setdefault(1, flatmem.contrastive_loss(q, q, 5.0, comm=c1)))
    assert float(out[0][0]) == float(out[1][0])
    handles = run_threads([c0, c1], lambda c, _: flatmem.Cyclic(c, stages=1, steps=1, rule="sync",
                                                                timeout_ms=GIL_TIMEOUT_MS))
    grads = [np.ones(2), np.full(2, 3.0)]

    def one_step(r):
        h = handles[r]
        assert h.next().kind == "forward" and h.next().kind == "backward"
        h.reduce(0, grads[r])
        a = h.next()  # waits for the average of both ranks
        assert (a.update_stage, a.update_step) == (0, 0)

    assert_waits_without_gil(lambda: one_step(0), lambda: one_step(1))
    assert grads[0].tolist() == grads[1].tolist() == [2.0, 2.0]
    for h in handles:
        assert h.next().kind == "done"
        h.close()


# ---------------------------------------------------------------------------
# lifetime and bad input
# ---------------------------------------------------------------------------

def test_close_is_refused_while_a_contrastive_or_cyclic_uses_it(local_group):
    c0, c1 = local_group(2)
    h = flatmem.Contrastive(comm=c0)
    assert h.comm is c0 and c0._raw.users() == 1
    with raises_binding(flatmem.InvalidArgumentError, "Communicator.close: still used by 1 handle(s)"):
        c0.close()
    with raises_binding(flatmem.InvalidArgumentError, "Communicator.abort: still used"):
        c0.abort()
    assert not c0.closed
    h.close()
    assert c0._raw.users() == 0
    cyclics = run_threads([c0, c1], lambda c, _: flatmem.Cyclic(c, stages=1, steps=1))
    with pytest.raises(flatmem.InvalidArgumentError, match="still used by 1 handle"):
        c1.close()
    for cyc in cyclics:
        cyc.close()  # nothing in flight: local and quick
    c0.close()
    c1.close()
    assert c0.closed and c1.closed
    c0.close()  # closing twice is a no-op


def test_a_dropped_communicator_proxy_is_kept_alive_by_its_users():
    """At the SWIG level (what a garbage collector of any language sees): the
    Communicator proxy may be finalised before the Contrastive using it; the
    C handle lives on until its last user is destroyed."""
    from flatmem._tensors import as_arg, output
    group = capi.CommLocalGroup(2, 10000)
    raw = [group.take(0), group.take(1)]
    handles = [capi.Contrastive(None, c) for c in raw]
    del raw, group  # the proxies go; the handles still use their communicators
    x = as_arg(np.eye(2, 3, dtype=np.float32), "x")
    s = as_arg(np.float32(3.0), "s")

    def forward(rank, _):
        loss, loss_t = output((), np.float32, "loss")
        rows, rows_t = output((2,), np.float32, "row_lse")
        cols, cols_t = output((2,), np.float32, "col_lse")
        handles[rank].forward(x.tensor, x.tensor, None, s.tensor, loss_t.tensor, rows_t.tensor, cols_t.tensor)
        return float(loss)

    losses = run_threads([0, 1], forward)
    assert losses[0] == losses[1] > 0
    handles.clear()  # the last users: the communicators are destroyed now


def raises_binding(error_class, *fragments):
    """An error found by the binding itself (not flatmem_last_error): its
    class and message fragments."""
    return pytest.raises(error_class, match=".*".join(map(re_escape, fragments)))


def re_escape(text):
    import re
    return re.escape(text)


def test_contrastive_loss_handles_are_closed_with_the_communicator(local_group):
    c0, c1 = local_group(2)
    x = np.eye(2, 3, dtype=np.float32)
    out = run_threads([c0, c1], lambda c, _: flatmem.contrastive_loss(x, x, 3.0, comm=c))
    c0.close()  # closes the handle contrastive_loss kept for c0
    with pytest.raises(ValueError, match="the handle is closed"):
        out[0][1]()


def test_calls_on_a_closed_communicator_name_it(local_group):
    c0, c1 = local_group(2)
    request = c0.irecv(np.zeros(2), 1)
    c0.close()  # cancels the request
    for call, name in [(lambda: c0.barrier(), "Communicator.barrier"),
                       (lambda: c0.all_reduce(np.ones(2)), "Communicator.all_reduce"),
                       (lambda: c0.isend(np.ones(2), 1), "Communicator.isend"),
                       (lambda: c0.check_health(), "Communicator.check_health"),
                       (request.wait, "CommRequest.wait"),
                       (lambda: flatmem.Contrastive(comm=c0), "Contrastive: comm"),
                       (lambda: flatmem.Cyclic(c0, stages=1, steps=1), "Cyclic")]:
        with raises_binding(flatmem.InvalidArgumentError, name, "(rank 0 of 2) is closed"):
            call()


def test_bad_arguments_give_clear_errors(local_group):
    c0, c1 = local_group(2)
    assert c0.health() is None and (c0.rank, c0.world_size) == (0, 2)
    with pytest.raises(TypeError, match="buffer: expected a NumPy array, not list"):
        c0.isend([1.0, 2.0], 1)
    with pytest.raises(ValueError, match="buffer: the array must be C-contiguous"):
        c0.isend(np.ones((3, 4))[:, ::2], 1)
    with pytest.raises(ValueError, match="output array is read-only"):
        ro = np.ones(2)
        ro.flags.writeable = False
        c0.irecv(ro, 1)
    with pytest.raises(TypeError, match="peer: expected an int, not str"):
        c0.isend(np.ones(2), "1")
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "5"):
        c0.isend(np.ones(2), 5)
    with pytest.raises(ValueError, match="tag"):
        c0.isend(np.ones(2), 1, tag=-1)
    with pytest.raises(TypeError, match="timeout_ms: expected an int"):
        c0.barrier(timeout_ms=1.5)
    with pytest.raises(TypeError, match="comm: expected a flatmem.Communicator, not str"):
        flatmem.Contrastive(comm="comm")
    with pytest.raises(TypeError, match="comm: expected a flatmem.Communicator, not NoneType"):
        flatmem.Cyclic(None, stages=1, steps=1)
    with pytest.raises(ValueError, match="activation_bytes: shape"):
        flatmem.Cyclic(c0, stages=2, steps=1, activation_bytes=[1])
    with pytest.raises(ValueError, match="logit_cache_bytes"):
        flatmem.contrastive_loss(np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32), 1.0,
                                 comm=c0, logit_cache_bytes=64)
    with pytest.raises(TypeError, match="unique_id: expected a flatmem.UniqueId"):
        flatmem.Communicator(0, 2, 1234)
    with raises_binding(flatmem.InvalidArgumentError, "3 characters; expected 256 hex digits"):
        flatmem.UniqueId.from_hex("abc")
    with raises_binding(flatmem.InvalidArgumentError, "character 0 ('g') is not a hex digit"):
        flatmem.UniqueId.from_hex("g" * 256)
    with pytest.raises(ValueError, match="a unique id has 128"):
        flatmem.UniqueId.from_bytes(b"\0" * 5)
    with pytest.raises(flatmem.InvalidArgumentError, match="take: rank 3 is out of range"):
        capi.CommLocalGroup(2).take(3)
    # a receive of the wrong size fails cleanly and the communicator stays healthy
    small = c1.irecv(np.zeros(2, np.float32), 0, tag=3)
    c0.send(np.zeros(3, np.float32), 1, tag=3, timeout_ms=2000)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "8", "12"):
        small.wait(2000)
    with raises_binding(flatmem.InvalidArgumentError, "CommRequest.wait: the request was already waited for"):
        small.wait()
    assert c1.health() is None


def test_unique_id_round_trips_as_hex_and_bytes():
    uid = flatmem.UniqueId("127.0.0.1:0")
    assert len(uid.hex()) == 256 and len(bytes(uid)) == 128
    assert flatmem.UniqueId.from_bytes(bytes(uid)).hex() == uid.hex()
    assert flatmem.UniqueId.from_hex(uid.hex().upper()).hex() == uid.hex()


def test_timeout_is_a_timeout_error_naming_the_peer(local_group):
    c0, _ = local_group(2, timeout_ms=10000)
    with pytest.raises(flatmem.CommTimeoutError, match="rank 1") as info:
        c0.barrier(timeout_ms=150)
    assert isinstance(info.value, TimeoutError) and info.value.status == capi.STATUS_TIMEOUT
    assert isinstance(c0.health(), flatmem.CommTimeoutError)
    with pytest.raises(flatmem.CommPoisonedError, match="timed out"):
        c0.barrier()


@pytest.mark.skipif(os.environ.get("FLATMEM_COORDINATOR") is not None, reason="set by a launcher")
def test_from_env_names_the_missing_variable(monkeypatch):
    for name in ("FLATMEM_COORDINATOR", "FLATMEM_RANK", "FLATMEM_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "FLATMEM_COORDINATOR"):
        flatmem.Communicator.from_env()


def test_ring_loss_arguments_that_differ_between_ranks_are_named(local_group):
    """Every rank must pass the same logit scale: each rank raises
    InvalidArgumentError naming both ranks' values, and nothing hangs."""
    comms = local_group(2, timeout_ms=5000)
    q = np.eye(2, 3, dtype=np.float32)

    def job(comm, _):
        with pytest.raises(flatmem.InvalidArgumentError, match="logit_scale: rank 0 has 10, rank 1 has 20"):
            flatmem.contrastive_loss(q, q, 10.0 * (comm.rank + 1), comm=comm)

    run_threads(comms, job)


def test_cyclic_non_finite_gradient_fails_every_rank(local_group):
    """A NaN handed to reduce() raises NonFiniteError on its rank (naming the
    stage) and, on the other, PeerFailureError or CommPoisonedError (both
    ConnectionErrors) naming that rank, well within the timeout."""
    comms = local_group(2, timeout_ms=5000)

    def job(comm, _):
        with flatmem.Cyclic(comm, stages=1, steps=2, rule="sync", timeout_ms=5000) as cyc:
            assert cyc.next().kind == "forward" and cyc.next().kind == "backward"
            g = np.full(3, np.nan if comm.rank == 0 else 1.0)
            if comm.rank == 0:
                with pytest.raises(flatmem.NonFiniteError, match="stage 0"):
                    cyc.reduce(0, g)
                return "nan"
            with pytest.raises(ConnectionError, match="rank 0") as info:
                cyc.reduce(0, g)  # fails here if rank 0's notice came first,
                cyc.next()        # else here, waiting for the average
            assert isinstance(info.value, (flatmem.PeerFailureError, flatmem.CommPoisonedError))
            return "peer"

    start = time.monotonic()
    assert run_threads(comms, job) == ["nan", "peer"]
    assert time.monotonic() - start < 5.0


def test_cyclic_reduce_refuses_what_it_cannot_own(local_group):
    comms = local_group(1)
    with flatmem.Cyclic(comms[0], stages=1, steps=1) as cyc:
        cyc.next(), cyc.next()
        with pytest.raises(TypeError, match="gradient: expected a NumPy array or an object with __dlpack__, not list"):
            cyc.reduce(0, [1.0])
        with pytest.raises(ValueError, match="gradient: expected a writable C-contiguous"):
            cyc.reduce(0, np.ones((2, 2))[:, 0])
        with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "gradient"):
            cyc.reduce(0, np.ones(2, np.int32))
        g = np.ones(2)
        cyc.reduce(0, g)
        assert list(cyc._held.values()) == [g]  # the handle keeps the array it owns
        for _ in range(10):  # DELAY1: the update comes in a drain time step
            assert cyc._held
            a = cyc.next()
            if a.update_stage is not None:
                break
        assert (a.update_stage, a.update_step) == (0, 0) and not cyc._held
        assert g.tolist() == [1.0, 1.0]  # the average over one rank
