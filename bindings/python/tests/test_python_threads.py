"""Threads: the GIL is released while the library computes, a handle shared
by threads is serialised, and per-thread handles give identical results."""
import numpy as np
from python_support import assert_main_thread_runs_during, features, run_concurrently

import flatmem


def test_gil_is_released_during_the_long_calls():
    """While a worker thread is inside one backward (b = 2048, d = 256, one
    library thread: tens of millions of FLOPs), the main thread keeps running
    Python bytecode (see assert_main_thread_runs_during)."""
    rng = np.random.default_rng(0)
    q = features(rng, 2048, 256, np.float32)
    k = features(rng, 2048, 256, np.float32)
    h = flatmem.Contrastive(num_threads=1)
    saved = h.forward(q, k, 10.0)
    assert_main_thread_runs_during(lambda: h.backward(q, k, 10.0, saved.row_lse, saved.col_lse))


def test_shared_handle_across_threads():
    rng = np.random.default_rng(1)
    q = features(rng, 64, 32, np.float32)
    k = features(rng, 64, 32, np.float32)
    h = flatmem.Contrastive(num_threads=2, tile_rows=16, tile_cols=16)
    saved = h.forward(q, k, 10.0)
    want = h.backward(q, k, 10.0, saved.row_lse, saved.col_lse)
    results = []

    def work(_):
        for _ in range(5):
            s = h.forward(q, k, 10.0)
            results.append((s.loss, *h.backward(q, k, 10.0, s.row_lse, s.col_lse)))

    run_concurrently(work, 4)
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

    def work(_):
        loss, backward = flatmem.contrastive_loss(q, k, 12.0, num_threads=2)
        return (loss, *backward())

    for loss, dq, dk, ds in run_concurrently(work, 3):
        assert loss == loss0
        np.testing.assert_array_equal(dq, want[0])
        np.testing.assert_array_equal(dk, want[1])
        np.testing.assert_array_equal(ds, want[2])
