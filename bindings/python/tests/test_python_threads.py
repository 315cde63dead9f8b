"""Threads: the GIL is released while the library computes, a handle shared
by threads is serialised, and per-thread handles give identical results."""
import threading

import numpy as np
from python_support import features

import flatmem


def main_thread_steps_during_call(h, q, k, saved):
    """Runs h.backward on a worker thread while the main thread counts loop
    steps in Python; returns how many steps the main thread made while the
    worker was inside the call (no clocks involved)."""
    steps = [0]
    started = threading.Event()
    inside = {}

    def work():
        started.wait()
        inside["before"] = steps[0]
        h.backward(q, k, 10.0, saved.row_lse, saved.col_lse)
        inside["after"] = steps[0]

    worker = threading.Thread(target=work)
    worker.start()
    started.set()
    while worker.is_alive():
        steps[0] += 1
    worker.join()
    return inside["after"] - inside["before"]


def test_gil_is_released_during_the_long_calls():
    """While a worker thread is inside one backward (b = 2048, d = 256, one
    library thread: tens of millions of FLOPs), the main thread keeps running
    Python bytecode. Were the GIL held for the call, the main thread could
    only step between the worker's own bytecodes: a few steps at most, not the
    hundreds of thousands a released GIL allows. No clock is read; up to three
    attempts absorb the OS not scheduling the main thread at all."""
    rng = np.random.default_rng(0)
    q = features(rng, 2048, 256, np.float32)
    k = features(rng, 2048, 256, np.float32)
    h = flatmem.Contrastive(num_threads=1)
    saved = h.forward(q, k, 10.0)
    attempts = []
    for _ in range(3):
        steps = main_thread_steps_during_call(h, q, k, saved)
        attempts.append(steps)
        if steps > 10_000:
            return
    raise AssertionError(f"the main thread made almost no progress during the calls: {attempts}")


def test_shared_handle_across_threads():
    rng = np.random.default_rng(1)
    q = features(rng, 64, 32, np.float32)
    k = features(rng, 64, 32, np.float32)
    h = flatmem.Contrastive(num_threads=2, tile_rows=16, tile_cols=16)
    saved = h.forward(q, k, 10.0)
    want = h.backward(q, k, 10.0, saved.row_lse, saved.col_lse)
    results, errors = [], []

    def work():
        try:
            for _ in range(5):
                s = h.forward(q, k, 10.0)
                results.append((s.loss, *h.backward(q, k, 10.0, s.row_lse, s.col_lse)))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 20
    for loss, dq, dk, ds in results:
        assert loss == saved.loss
        np.testing.assert_array_equal(dq, want[0])
        np.testing.assert_array_equal(dk, want[1])
        np.testing.assert_array_equal(ds, want[2])


def test_contrastive_loss_from_several_threads():
    rng = np.random.default_rng(2)
    q = features(rng, 50, 24, np.float32)
    k = features(rng, 50, 24, np.float32)
    loss0, backward0 = flatmem.contrastive_loss(q, k, 12.0, num_threads=2)
    want = backward0()
    out = [None] * 3

    def work(i):
        loss, backward = flatmem.contrastive_loss(q, k, 12.0, num_threads=2)
        out[i] = (loss, *backward())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for loss, dq, dk, ds in out:
        assert loss == loss0
        np.testing.assert_array_equal(dq, want[0])
        np.testing.assert_array_equal(dk, want[1])
        np.testing.assert_array_equal(ds, want[2])
