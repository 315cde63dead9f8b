"""The logit cache (logit_cache_bytes, flatmem_contrastive_options): a handle
with a budget gives bitwise the results of one without, through Contrastive and
contrastive_loss, for every budget (none, part of the tiles, all of them),
both losses and the feature dtypes; a backward on other inputs than the last
forward's recomputes; the budget is held by the handle; bad budgets are
refused by the binding before the library sees them."""
import os

import numpy as np
import pytest
from python_support import BFLOAT16, features

import flatmem
from flatmem import capi

# b = 1, primes, and more than one 512-row tile.
SHAPES = [(1, 1, 5), (7, 7, 3), (13, 13, 8), (600, 600, 4)]
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": BFLOAT16}


def budgets(b, c):
    """Every tile cached, about a third of them, and a budget below one logit."""
    full = 4 * b * c
    return [full, max(4, full // 3), 1]


def run(handle, q, k, s, labels, twice=False):
    """forward + backward on one handle: every output, as bytes."""
    saved = handle.forward(q, k, s, labels)
    grads = handle.backward(q, k, s, saved.row_lse, saved.col_lse, labels)
    if twice:  # a second backward on the same tiles
        again = handle.backward(q, k, s, saved.row_lse, saved.col_lse, labels)
        assert all(np.asarray(a).tobytes() == np.asarray(g).tobytes() for a, g in zip(again, grads))
    outs = list(saved) + list(grads)
    return [None if x is None else np.asarray(x).tobytes() for x in outs]


def problem(b, c, d, dtype, infonce, seed=0):
    rng = np.random.default_rng(seed + 97 * b + c)
    q, k = features(rng, b, d, dtype, 3.0), features(rng, c, d, dtype, 3.0)
    labels = rng.integers(0, c, size=b, dtype=np.int64) if infonce else None
    return q, k, labels


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", ["symmetric", "infonce"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bitwise_equal_to_no_cache(shape, loss, dtype):
    b, c, d = shape
    infonce = loss == "infonce"
    if infonce:
        c = c + 3  # extra columns (hard negatives)
    q, k, labels = problem(b, c, d, DTYPES[dtype], infonce)
    s = np.float32(7.5)
    reference = run(flatmem.Contrastive(loss), q, k, s, labels)
    for budget in budgets(b, c):
        with flatmem.Contrastive(loss, logit_cache_bytes=budget) as h:
            assert h.options["logit_cache_bytes"] == budget
            assert run(h, q, k, s, labels, twice=True) == reference, budget


@pytest.mark.parametrize("loss", ["symmetric", "infonce"])
def test_small_tiles_partial_budget(loss):
    """Many tiles (4 x 4 on 30 x 30), a budget covering some: the cached and the
    recomputed tiles meet in one backward."""
    q, k, labels = problem(30, 30, 6, np.float32, loss == "infonce", seed=3)
    s = np.float32(4.0)
    reference = run(flatmem.Contrastive(loss, tile_rows=4, tile_cols=4), q, k, s, labels)
    for budget in (4 * 16 * 5 + 8, 4 * 30 * 30):
        h = flatmem.Contrastive(loss, tile_rows=4, tile_cols=4, logit_cache_bytes=budget)
        assert run(h, q, k, s, labels) == reference, budget


@pytest.mark.parametrize("symmetric", [True, False])
def test_contrastive_loss_keyword(symmetric):
    q, k, labels = problem(37, 37, 8, np.float32, not symmetric, seed=5)
    out = {}
    for budget in (0, 4 * 37 * 37):
        loss, backward = flatmem.contrastive_loss(q, k, 3.0, labels, symmetric,
                                                  logit_cache_bytes=budget)
        out[budget] = [np.asarray(x).tobytes() for x in (loss, *backward(), *backward(2.0))]
    assert out[0] == out[4 * 37 * 37]


def test_backward_on_other_inputs_recomputes():
    """Forward on (q1, k), forward on (q2, k), then the backward of q1: the
    tiles are q2's, so the backward recomputes and still gets q1's gradients;
    q1 changed in place after its forward is noticed as well."""
    q1, k, _ = problem(40, 40, 8, np.float32, False, seed=11)
    q2, _, _ = problem(40, 40, 8, np.float32, False, seed=12)
    s = np.float32(5.0)
    plain = flatmem.Contrastive()
    want = plain.backward(q1, k, s, *plain.forward(q1, k, s)[1:])
    cached = flatmem.Contrastive(logit_cache_bytes=4 * 40 * 40)
    saved1 = cached.forward(q1, k, s)
    cached.forward(q2, k, s)
    got = cached.backward(q1, k, s, saved1.row_lse, saved1.col_lse)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))

    # same shapes and dtype as the cached forward's, one element of q changed
    saved1 = cached.forward(q1, k, s)
    q3 = q1.copy()
    q3[17, 3] += np.float32(0.25)
    want3 = plain.backward(q3, k, s, saved1.row_lse, saved1.col_lse)
    got3 = cached.backward(q3, k, s, saved1.row_lse, saved1.col_lse)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got3, want3))


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_handle_holds_the_cache():
    """The first forward of a handle with a budget of 4 b c bytes (and a
    workspace of the caller's) grows the process by about that much, the
    same forward without a budget does not: the option reaches the library."""
    b, d = 2048, 8
    q, k, _ = problem(b, b, d, np.float32, False, seed=21)
    s = np.float32(2.0)
    budget = 4 * b * b  # 16 MiB
    growth = {}
    for bytes_ in (0, budget):
        with flatmem.Contrastive(num_threads=2, logit_cache_bytes=bytes_) as h:
            workspace = np.ones(h.forward_workspace_size(q, k), np.uint8)  # resident
            before = _rss_bytes()
            h.forward(q, k, s, workspace=workspace)
            growth[bytes_] = _rss_bytes() - before
    extra = growth[budget] - growth[0]
    assert 0.8 * budget <= extra <= 1.25 * budget, growth


@pytest.mark.parametrize("bad, error, text", [
    (-1, ValueError, "logit_cache_bytes: -1; expected bytes in [0, 2**64)"),
    (2**64, ValueError, "logit_cache_bytes: 18446744073709551616"),
    (1.5, TypeError, "logit_cache_bytes: 1.5 is not an integer"),
    ("64M", TypeError, "is not an integer"),
])
def test_bad_budget_refused(bad, error, text):
    q, k, _ = problem(4, 4, 3, np.float32, False)
    with pytest.raises(error) as info:
        flatmem.Contrastive(logit_cache_bytes=bad)
    assert text in str(info.value)
    with pytest.raises(error) as info:
        flatmem.contrastive_loss(q, k, 1.0, logit_cache_bytes=bad)
    assert text in str(info.value)
    assert not isinstance(info.value, flatmem.Error)  # the binding's check, not the library's


def test_options_field_in_capi():
    """ContrastiveOptions exposes the field: 0 by default, any size_t, negative
    values refused by SWIG's conversion."""
    options = capi.ContrastiveOptions()
    assert options.logit_cache_bytes == 0
    options.logit_cache_bytes = 2**64 - 1
    assert options.logit_cache_bytes == 2**64 - 1
    with pytest.raises((OverflowError, TypeError, ValueError)):
        options.logit_cache_bytes = -1
    options.logit_cache_bytes = 4096
    handle = capi.Contrastive(options)  # a budget larger than any tile set is fine
    del handle


def test_numpy_integer_budget():
    q, k, _ = problem(9, 9, 4, np.float32, False)
    h = flatmem.Contrastive(logit_cache_bytes=np.int64(4 * 81))
    assert h.options["logit_cache_bytes"] == 4 * 81
    assert run(h, q, k, np.float32(2.0), None) == run(flatmem.Contrastive(), q, k, np.float32(2.0), None)
