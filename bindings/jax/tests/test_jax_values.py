"""Values and gradients (q, k, logit_scale) of flatmem_jax's losses against the
plain-JAX materialised losses of jax_reference.py, eagerly, under jit and grad.

Tolerances. Features are random unit rows, so |<q_i, k_j>| <= 1 and a logit
is at most s. Both sides round each logit with an error of about s * d * u
(u = 2^-24, fp32 dot products) and each log-sum-exp with about (b + c) * u;
softmax and LSE pass a logit error on with a factor <= 1. So
    delta = 8 u (s d + b + c)        (factor 8: both sides, first order x 2, slack 2)
bounds the loss error and, relative to their largest element, the gradient
errors. 16-bit gradients are also rounded once to bf16 (2^-8 relative) or fp16
(2^-11). A wiring mistake (an operand or result swapped, a missing factor of
the upstream gradient, the wrong loss) is off by orders of magnitude more.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
import jax_reference as reference

U = 2.0**-24
ROUNDING = {jnp.float32: 0.0, jnp.bfloat16: 2.0**-8, jnp.float16: 2.0**-11}


def unit_rows(seed, rows, d, dtype=jnp.float32):
    x = np.random.default_rng(seed).standard_normal((rows, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return jnp.asarray(x, jnp.float32).astype(dtype)


def delta(s, b, c, d):
    return 8 * U * (s * d + b + c)


def assert_loss(got, want, s, b, c, d):
    assert got.dtype == jnp.float32 and got.shape == ()
    err = abs(float(got) - float(want))
    assert err <= delta(s, b, c, d) * (1 + abs(float(want))), (float(got), float(want))


def assert_grad(got, want, s, b, c, d, dtype, name):
    want = np.asarray(want, np.float64)
    got_np = np.asarray(got.astype(jnp.float32), np.float64)
    assert got.shape == want.shape, name
    tol = delta(s, b, c, d) * (np.max(np.abs(want)) + 1e-30) + ROUNDING[dtype] * np.abs(want)
    excess = np.abs(got_np - want) - tol
    worst = np.unravel_index(np.argmax(excess), excess.shape) if excess.size else ()
    assert np.all(excess <= 0), (
        f"{name}: worst at {worst}: got {got_np[worst]}, want {want[worst]}, tol {tol[worst]}")


def assert_scale_grad(got, want, s, b, c, d):
    assert got.dtype == jnp.float32 and got.shape == ()
    err = abs(float(got) - float(want))
    assert err <= delta(s, b, c, d) * (2 + abs(float(want))), (float(got), float(want))


CLIP_SHAPES = [(1, 4), (2, 1), (7, 13), (31, 5), (64, 32), (97, 3), (521, 7)]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


@pytest.mark.parametrize("b,d", CLIP_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
def test_clip_value_and_grad_under_jit(b, d, dtype):
    q, k = unit_rows(1, b, d, dtype), unit_rows(2, b, d, dtype)
    s = jnp.float32(14.3)
    f = jax.jit(jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2)))
    loss, (dq, dk, ds) = f(q, k, s)
    want, (wq, wk, ws) = reference.clip_value_and_grad(
        q.astype(jnp.float32), k.astype(jnp.float32), s)
    assert_loss(loss, want, 14.3, b, b, d)
    assert dq.dtype == dtype and dk.dtype == dtype
    assert_grad(dq, wq, 14.3, b, b, d, dtype, "dq")
    assert_grad(dk, wk, 14.3, b, b, d, dtype, "dk")
    assert_scale_grad(ds, ws, 14.3, b, b, d)


# (b, c, d, with labels): c > b with labels, primes, b = 1, c = b without labels,
# c > b without labels (row i's positive is column i), more than one 512-row tile.
INFONCE_SHAPES = [(1, 1, 4, False), (1, 6, 3, True), (3, 7, 5, True), (13, 13, 7, False),
                  (13, 29, 11, True), (17, 40, 6, False), (520, 1031, 4, True)]


@pytest.mark.parametrize("b,c,d,with_labels", INFONCE_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
def test_infonce_value_and_grad_under_jit(b, c, d, with_labels, dtype):
    q, k = unit_rows(3, b, d, dtype), unit_rows(4, c, d, dtype)
    labels = jnp.asarray(np.random.default_rng(5).integers(0, c, b)) if with_labels else None
    s = jnp.float32(20.0)

    def loss(q, k, s):
        return flatmem_jax.infonce_loss(q, k, s, labels=labels)

    value, (dq, dk, ds) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, s)
    want, (wq, wk, ws) = reference.infonce_value_and_grad(
        q.astype(jnp.float32), k.astype(jnp.float32), s, labels)
    assert_loss(value, want, 20.0, b, c, d)
    assert dq.shape == (b, d) and dk.shape == (c, d)
    assert_grad(dq, wq, 20.0, b, c, d, dtype, "dq")
    assert_grad(dk, wk, 20.0, b, c, d, dtype, "dk")
    assert_scale_grad(ds, ws, 20.0, b, c, d)


def test_labels_under_jit_are_traced_not_baked_in():
    b, c, d = 6, 9, 5
    q, k = unit_rows(6, b, d), unit_rows(7, c, d)
    f = jax.jit(flatmem_jax.infonce_loss)
    for seed in range(3):
        labels = jnp.asarray(np.random.default_rng(seed).integers(0, c, b))
        want, _ = reference.infonce_value_and_grad(q, k, 10.0, labels)
        assert_loss(f(q, k, 10.0, labels), want, 10.0, b, c, d)


def test_eager_calls_match_jit_bitwise():
    q, k = unit_rows(8, 11, 9), unit_rows(9, 11, 9)
    assert flatmem_jax.clip_loss(q, k, 5.0) == jax.jit(flatmem_jax.clip_loss)(q, k, 5.0)
    eager = jax.grad(flatmem_jax.infonce_loss, argnums=(0, 1, 2))(q, k, 5.0)
    jitted = jax.jit(jax.grad(flatmem_jax.infonce_loss, argnums=(0, 1, 2)))(q, k, 5.0)
    for a, b in zip(eager, jitted):
        np.testing.assert_array_equal(a, b)


def test_upstream_gradient_is_applied():
    # d/dq of (3 * L) is 3 dL/dq: the backward's dloss operand is wired.
    q, k = unit_rows(10, 8, 4), unit_rows(11, 8, 4)
    g1 = jax.grad(flatmem_jax.clip_loss)(q, k, 7.0)
    g3 = jax.grad(lambda q: 3.0 * flatmem_jax.clip_loss(q, k, 7.0))(q)
    np.testing.assert_allclose(g3, 3.0 * g1, rtol=1e-6, atol=1e-9)


def test_large_scale_is_stable():
    # s = 100 on unit rows: logits up to 100, exp would overflow without the max shift.
    b, d, s = 40, 16, 100.0
    q, k = unit_rows(12, b, d), unit_rows(13, b, d)
    loss, grads = jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2))(q, k, s)
    want, wgrads = reference.clip_value_and_grad(q, k, s)
    assert_loss(loss, want, s, b, b, d)
    for got, ref, name in zip(grads[:2], wgrads[:2], ("dq", "dk")):
        assert_grad(got, ref, s, b, b, d, jnp.float32, name)
    assert_scale_grad(grads[2], wgrads[2], s, b, b, d)


def test_learned_log_scale_through_exp():
    # A framework that learns t = log s gets dL/dt = s dL/ds through jnp.exp.
    q, k = unit_rows(14, 9, 6), unit_rows(15, 9, 6)
    t = jnp.log(jnp.float32(14.3))
    got = jax.grad(lambda t: flatmem_jax.clip_loss(q, k, jnp.exp(t)))(t)
    want = jax.jit(jax.grad(lambda t: reference.clip_loss(q, k, jnp.exp(t))))(t)
    assert_scale_grad(got, want, 14.3, 9, 9, 6)


def test_scale_shapes_and_python_floats():
    q, k = unit_rows(16, 5, 3), unit_rows(17, 5, 3)
    a = flatmem_jax.clip_loss(q, k, 2.5)
    b = flatmem_jax.clip_loss(q, k, jnp.array([2.5], jnp.float32))
    c = flatmem_jax.clip_loss(q, k, jnp.array(2.5, jnp.bfloat16))
    assert a == b == c
    ds = jax.grad(flatmem_jax.clip_loss, argnums=2)(q, k, jnp.array([2.5], jnp.float32))
    assert ds.shape == (1,) and ds.dtype == jnp.float32


def test_int64_labels_with_x64():
    b, c, d = 4, 7, 3
    q, k = unit_rows(18, b, d), unit_rows(19, c, d)
    labels = np.array([6, 0, 3, 5])
    want = flatmem_jax.infonce_loss(q, k, 3.0, labels)
    with jax.enable_x64(True):
        got = flatmem_jax.infonce_loss(q, k, 3.0, jnp.asarray(labels, jnp.int64))
    assert got == want


def test_forward_mode_and_second_order_are_refused():
    # Documented: reverse mode, first order only (custom_vjp over FFI calls).
    q = unit_rows(20, 3, 2)
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jvp(lambda q: flatmem_jax.clip_loss(q, q, 1.0), (q,), (q,))
    with pytest.raises(ValueError, match="cannot be differentiated"):
        jax.grad(lambda s: jax.grad(flatmem_jax.clip_loss, argnums=2)(q, q, s))(1.0)
