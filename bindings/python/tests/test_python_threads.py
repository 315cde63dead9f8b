"""Threads: the GIL is released while the library computes, a handle shared
by threads is serialised, and per-thread handles give identical results."""
import threading
import time

import numpy as np
from python_support import features

import flatmem


def longest_pause_during_call(h, q, k, saved):
    """Runs h.backward on a worker thread while the main thread loops in
    Python; returns (longest main-thread pause inside the call, call time)."""
    done = threading.Event()
    call = []

    def work():
        time.sleep(0.02)  # let the main thread start its loop
        t0 = time.perf_counter()
        h.backward(q, k, 10.0, saved.row_lse, saved.col_lse)
        call.append((t0, time.perf_counter()))
        done.set()

    worker = threading.Thread(target=work)
    pauses = []  # (start, end) of main-thread pauses longer than 1 ms
    last = time.perf_counter()
    worker.start()
    while not done.is_set():
        now = time.perf_counter()
        if now - last > 1e-3:
            pauses.append((last, now))
        last = now
    worker.join()
    t0, t1 = call[0]
    inside = [min(end, t1) - max(start, t0) for start, end in pauses if end > t0 and start < t1]
    return max(inside, default=0.0), t1 - t0


def test_gil_is_released_during_the_long_calls():
    """While a worker thread runs one backward of tens of milliseconds on one
    library thread, the main thread keeps running Python: the longest pause
    it sees inside the call stays well below the call's duration. Were the
    GIL held, one pause would cover the whole call, every time; up to three
    attempts absorb the OS descheduling the main thread on a busy machine."""
    rng = np.random.default_rng(0)
    q = features(rng, 2048, 256, np.float32)
    k = features(rng, 2048, 256, np.float32)
    h = flatmem.Contrastive(num_threads=1)
    saved = h.forward(q, k, 10.0)
    attempts = []
    for _ in range(3):
        longest, duration = longest_pause_during_call(h, q, k, saved)
        assert duration > 0.02, "the call is too short to tell"
        attempts.append((longest, duration))
        if longest < 0.5 * duration:
            return
    raise AssertionError(f"the main thread stalled during every call: (pause, call) = {attempts}")


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
