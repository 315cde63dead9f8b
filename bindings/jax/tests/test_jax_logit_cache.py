"""logit_cache_bytes of clip_loss and infonce_loss: values and gradients
under jax.jit(jax.value_and_grad) are bitwise those without the cache, for
b = 1, primes and more than one 512-row tile, CLIP and InfoNCE with labels,
float32 and bfloat16, budgets covering every tile, a third of them or none;
the backward gets the handle its forward used (the pool's counters); calls
with different budgets get different handles; eager calls, vmap and two
interleaved losses stay exact; bad budgets are refused at trace time."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
from jax_checks import unit_rows

SHAPES = [(1, 4), (7, 13), (31, 5), (521, 7)]  # (b, d)
DTYPES = [jnp.float32, jnp.bfloat16]
EXTRA_COLUMNS = 6  # InfoNCE: c = b + 6 (hard negatives)


def problem(b, d, dtype, infonce, seed=0):
    c = b + EXTRA_COLUMNS if infonce else b
    q, k = unit_rows(seed + 1, b, d, dtype), unit_rows(seed + 2, c, d, dtype)
    labels = jnp.asarray(np.random.default_rng(seed + 3).integers(0, c, size=b)) if infonce else None
    return q, k, labels


def value_and_grad(infonce, budget, labels):
    """jit(value_and_grad) in q, k and the scale, with this budget."""
    if infonce:
        def loss(q, k, s):
            return flatmem_jax.infonce_loss(q, k, s, labels, logit_cache_bytes=budget)
    else:
        def loss(q, k, s):
            return flatmem_jax.clip_loss(q, k, s, logit_cache_bytes=budget)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def as_bytes(tree):
    return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


def counters():
    handles, backwards, on_forward_handle = flatmem_jax._pool_stats()
    return handles, backwards, on_forward_handle


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
@pytest.mark.parametrize("infonce", [False, True], ids=["clip", "infonce"])
@pytest.mark.parametrize("b, d", SHAPES)
def test_jit_value_and_grad_bitwise_equal(b, d, infonce, dtype):
    q, k, labels = problem(b, d, dtype, infonce, seed=b)
    s = jnp.float32(12.5)
    c = k.shape[0]
    reference = value_and_grad(infonce, 0, labels)(q, k, s)
    assert all(np.isfinite(np.asarray(x, np.float32)).all()
               for x in jax.tree_util.tree_leaves(reference))
    for budget in (4 * b * c, max(4, 4 * b * c // 3), 1):
        fn = value_and_grad(infonce, budget, labels)
        fn(q, k, s)  # compiles (and traces the workspace queries) outside the counted call
        before = counters()
        got = fn(q, k, s)
        jax.block_until_ready(got)
        after = counters()
        assert as_bytes(got) == as_bytes(reference), budget
        assert got[1][0].dtype == dtype and got[1][1].dtype == dtype
        # one cached backward, and it got the handle its forward used
        assert after[1] - before[1] == 1 and after[2] - before[2] == 1, (before, after)


def test_eager_calls_hit_and_agree():
    q, k, _ = problem(40, 16, jnp.float32, False, seed=7)
    s = jnp.float32(9.0)
    grad = jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2))
    want = grad(q, k, s)
    cached = jax.value_and_grad(
        lambda q, k, s: flatmem_jax.clip_loss(q, k, s, logit_cache_bytes=4 * 40 * 40),
        argnums=(0, 1, 2))
    before = counters()
    got = cached(q, k, s)
    after = counters()
    assert as_bytes(got) == as_bytes(want)
    assert after[1] - before[1] == 1 and after[2] - before[2] == 1, (before, after)


def test_two_interleaved_losses_stay_exact():
    """Two cached losses in one step (forwards F1 F2, backwards B2 B1 on the
    one pooled handle): the second backward finds the other forward's tiles
    and recomputes; the results are the uncached ones all the same."""
    q, k, _ = problem(33, 8, jnp.float32, False, seed=11)
    k2 = unit_rows(99, 33, 8)
    s = jnp.float32(6.0)

    def step(budget):
        def loss(q, k, k2, s):
            return (flatmem_jax.clip_loss(q, k, s, logit_cache_bytes=budget)
                    + 0.5 * flatmem_jax.clip_loss(q, k2, s, logit_cache_bytes=budget))
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))

    assert as_bytes(step(4 * 33 * 33)(q, k, k2, s)) == as_bytes(step(0)(q, k, k2, s))


def test_vmap_stays_exact():
    qs = jnp.stack([unit_rows(i, 19, 5) for i in range(3)])
    ks = jnp.stack([unit_rows(10 + i, 19, 5) for i in range(3)])
    s = jnp.float32(4.0)

    def fn(budget):
        def loss(q, k):
            return flatmem_jax.clip_loss(q, k, s, logit_cache_bytes=budget)
        return jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1))))

    assert as_bytes(fn(4 * 19 * 19)(qs, ks)) == as_bytes(fn(0)(qs, ks))


def test_budgets_do_not_share_handles():
    """A budget not used before makes a handle of its own (its first forward
    cannot borrow one of another budget); the next call of that budget reuses
    it; a call without a budget counts no cached backward."""
    q, k, labels = problem(12, 4, jnp.float32, True, seed=5)
    s = jnp.float32(3.0)
    fresh = value_and_grad(True, 4 * 12 * 18 + 977, labels)  # a budget no other test uses
    fresh(q, k, s)
    first = counters()
    fresh(q, k, s)
    second = counters()
    assert second[0] == first[0], (first, second)  # reused, not made again
    other = value_and_grad(True, 4 * 12 * 18 + 978, labels)
    other(q, k, s)
    third = counters()
    assert third[0] >= second[0] + 1, (second, third)
    value_and_grad(True, 0, labels)(q, k, s)
    assert counters()[1:] == third[1:]


def test_any_size_t_budget():
    q, k, _ = problem(9, 3, jnp.float32, False, seed=2)
    s = jnp.float32(2.0)
    want = value_and_grad(False, 0, None)(q, k, s)
    for budget in (2**63 - 1, np.uint64(4 * 81), np.int32(7)):
        assert as_bytes(value_and_grad(False, budget, None)(q, k, s)) == as_bytes(want)


def test_lowering_carries_the_attribute():
    q = unit_rows(1, 6, 5)
    f = jax.grad(lambda q: flatmem_jax.clip_loss(q, q, 1.0, logit_cache_bytes=123456))
    text = jax.jit(f).trace(q).lower(lowering_platforms=("cpu",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @flatmem_clip_" in line]
    assert len(calls) == 2, calls
    assert all("logit_cache_bytes = 123456 : ui64" in line for line in calls), calls


@pytest.mark.parametrize("bad, error, text", [
    (-1, ValueError, "logit_cache_bytes: -1; expected bytes in [0, 2**63)"),
    (2**63, ValueError, "logit_cache_bytes: 9223372036854775808"),
    (1.5, TypeError, "must be a static Python integer"),
    ("1M", TypeError, "must be a static Python integer"),
    (None, TypeError, "must be a static Python integer"),
])
def test_bad_budget_refused_at_trace_time(bad, error, text):
    q, k, labels = problem(4, 3, jnp.float32, True)
    with pytest.raises(error) as info:
        flatmem_jax.clip_loss(q, q, 1.0, logit_cache_bytes=bad)
    assert text in str(info.value)
    with pytest.raises(error) as info:
        flatmem_jax.infonce_loss(q, k, 1.0, labels, logit_cache_bytes=bad)
    assert text in str(info.value)


def test_traced_budget_refused():
    q = unit_rows(3, 4, 3)
    with pytest.raises(TypeError, match="must be a static Python integer"):
        jax.jit(lambda n: flatmem_jax.clip_loss(q, q, 1.0, logit_cache_bytes=n))(64)


def test_keyword_only_and_named_as_the_benchmark_expects():
    # bench/jax_peer_bench.py's flatmem-jax-cache variant looks the keyword up by name.
    for fn in (flatmem_jax.clip_loss, flatmem_jax.infonce_loss):
        p = inspect.signature(fn).parameters["logit_cache_bytes"]
        assert p.kind == p.KEYWORD_ONLY and p.default == 0
    flatmem = pytest.importorskip("flatmem.jax", reason="the SWIG package flatmem is not installed")
    assert flatmem.clip_loss is flatmem_jax.clip_loss and flatmem.infonce_loss is flatmem_jax.infonce_loss
