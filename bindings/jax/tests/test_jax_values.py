"""Values and gradients (q, k, logit_scale) of flatmem_jax's losses against the
float64 NumPy reference, eagerly, under jit and grad, within the worst-case
error bounds of jax_checks.py (the derivation is tests/support/tolerance.hpp's;
a wiring mistake -- an operand or result swapped, a missing factor of the
upstream gradient, the wrong loss -- is off by orders of magnitude more)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
from jax_checks import check_grads, check_loss, check_scale_grad, fp32, unit_rows

CLIP_SHAPES = [(1, 4), (2, 1), (7, 13), (31, 5), (64, 32), (97, 3), (521, 7)]
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


@pytest.mark.parametrize("b,d", CLIP_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
def test_clip_value_and_grad_under_jit(b, d, dtype):
    q, k = unit_rows(1, b, d, dtype), unit_rows(2, b, d, dtype)
    s = jnp.float32(14.3)
    f = jax.jit(jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2)))
    loss, grads = f(q, k, s)
    check_loss(loss, q, k, s)
    check_grads(grads, q, k, s)


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

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, s)
    check_loss(value, q, k, s, labels, symmetric=False)
    check_grads(grads, q, k, s, labels, symmetric=False)


def test_labels_under_jit_are_traced_not_baked_in():
    b, c, d = 6, 9, 5
    q, k = unit_rows(6, b, d), unit_rows(7, c, d)
    f = jax.jit(flatmem_jax.infonce_loss)
    for seed in range(3):
        labels = jnp.asarray(np.random.default_rng(seed).integers(0, c, b))
        check_loss(f(q, k, 10.0, labels), q, k, 10.0, labels, symmetric=False)


def test_eager_calls_match_jit_bitwise():
    q, k = unit_rows(8, 11, 9), unit_rows(9, 11, 9)
    assert flatmem_jax.clip_loss(q, k, 5.0) == jax.jit(flatmem_jax.clip_loss)(q, k, 5.0)
    eager = jax.grad(flatmem_jax.infonce_loss, argnums=(0, 1, 2))(q, k, 5.0)
    jitted = jax.jit(jax.grad(flatmem_jax.infonce_loss, argnums=(0, 1, 2)))(q, k, 5.0)
    for a, b in zip(eager, jitted):
        np.testing.assert_array_equal(a, b)


def test_upstream_gradient_is_applied():
    # grad of (g L) is g grad L: the backward's dloss operand is wired. Each is
    # checked against the reference with its own bound (scaling G by g in fp32
    # rounds differently from scaling the result, so g3 == 3 g1 need not hold).
    q, k = unit_rows(10, 8, 4), unit_rows(11, 8, 4)
    for g in (1.0, 3.0, -0.5):
        grads = jax.grad(lambda q, k, s: g * flatmem_jax.clip_loss(q, k, s), argnums=(0, 1, 2))(q, k, 7.0)
        check_grads(grads, q, k, 7.0, g=g)


def test_large_scale_is_stable():
    # s = 100 on unit rows: logits up to 100, exp would overflow without the max shift.
    b, d, s = 40, 16, 100.0
    q, k = unit_rows(12, b, d), unit_rows(13, b, d)
    loss, grads = jax.value_and_grad(flatmem_jax.clip_loss, argnums=(0, 1, 2))(q, k, s)
    check_loss(loss, q, k, s)
    check_grads(grads, q, k, s)


def test_learned_log_scale_through_exp():
    # A framework that learns t = log s gets dL/dt = s dL/ds through jnp.exp.
    q, k = unit_rows(14, 9, 6), unit_rows(15, 9, 6)
    t = jnp.log(jnp.float32(14.3))
    got = jax.grad(lambda t: flatmem_jax.clip_loss(q, k, jnp.exp(t)))(t)
    s = jnp.exp(t)  # the scale flatmem saw
    check_scale_grad(got, q, k, s, factor=fp32(s))


# Matched pairs: the exact loss is 0 (b = 1) or within e^-60 of it, and every
# term lse_i - x_ii is >= 0 by construction; flatmem computes x_ii by the very
# arithmetic that fed lse_i, so rounding cannot push the loss below 0
# (check_loss asserts loss >= 0 on every call; these are the cases that broke it).
@pytest.mark.parametrize("b,d,s,noise", [(1, 4, 14.3, 0.0), (1, 512, 100.0, 0.0), (2, 3, 100.0, 0.0),
                                         (600, 129, 100.0, 0.01), (600, 129, 100.0, 0.0)])
@pytest.mark.parametrize("symmetric", [True, False], ids=["clip", "infonce"])
def test_loss_of_matched_pairs_is_not_negative(b, d, s, noise, symmetric):
    q = unit_rows(21, b, d)
    k = q + noise * unit_rows(22, b, d)
    k = k / jnp.linalg.norm(k, axis=1, keepdims=True)
    f = flatmem_jax.clip_loss if symmetric else flatmem_jax.infonce_loss
    loss, grads = jax.value_and_grad(f, argnums=(0, 1, 2))(q, k, s)
    check_loss(loss, q, k, s, symmetric=symmetric)
    check_grads(grads, q, k, s, symmetric=symmetric)


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
