"""jax.vmap: the custom calls use vmap_method="sequential", so a batched call is
one flatmem call per element and must equal the unbatched calls bit for bit
(flatmem is deterministic), and match the float64 reference (jax_checks.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
from jax_checks import check_grads, check_loss, scale_grad_reference, unit_rows

N = 3  # batch elements


def stacked(seed, rows, d, dtype=jnp.float32):
    return jnp.stack([unit_rows(seed + 100 * i, rows, d, dtype) for i in range(N)])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda t: jnp.dtype(t).name)
def test_vmap_clip_equals_per_element_calls(dtype):
    qs, ks = stacked(1, 6, 5, dtype), stacked(2, 6, 5, dtype)
    scales = jnp.array([1.0, 10.0, 30.0], jnp.float32)
    batched = jax.jit(jax.vmap(flatmem_jax.clip_loss))(qs, ks, scales)
    assert batched.shape == (N,)
    for i in range(N):
        assert batched[i] == flatmem_jax.clip_loss(qs[i], ks[i], scales[i])
        check_loss(batched[i], qs[i], ks[i], scales[i])


def test_vmap_with_unbatched_operands():
    # Only q batched; k and the scale shared.
    qs, k = stacked(3, 4, 7), unit_rows(4, 4, 7)
    batched = jax.vmap(flatmem_jax.clip_loss, in_axes=(0, None, None))(qs, k, 14.3)
    for i in range(N):
        assert batched[i] == flatmem_jax.clip_loss(qs[i], k, 14.3)


def test_vmap_of_grad_equals_per_element_grads():
    qs, ks = stacked(5, 5, 3), stacked(6, 5, 3)
    grad = jax.grad(flatmem_jax.clip_loss, argnums=(0, 1, 2))
    dq, dk, ds = jax.jit(jax.vmap(grad, in_axes=(0, 0, None)))(qs, ks, 8.0)
    assert dq.shape == qs.shape and dk.shape == ks.shape and ds.shape == (N,)
    for i in range(N):
        eq, ek, es = grad(qs[i], ks[i], 8.0)
        np.testing.assert_array_equal(dq[i], eq)
        np.testing.assert_array_equal(dk[i], ek)
        assert ds[i] == es


def test_vmap_infonce_with_batched_labels_and_grad():
    b, c, d = 4, 9, 6
    qs, ks = stacked(7, b, d), stacked(8, c, d)
    labels = jnp.asarray(np.random.default_rng(9).integers(0, c, (N, b)))

    def loss(q, k, y):
        return flatmem_jax.infonce_loss(q, k, 12.0, labels=y)

    values, (dq, dk) = jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1))))(qs, ks, labels)
    for i in range(N):
        check_loss(values[i], qs[i], ks[i], 12.0, labels[i], symmetric=False)
        eq, ek = jax.grad(loss, argnums=(0, 1))(qs[i], ks[i], labels[i])
        np.testing.assert_array_equal(dq[i], eq)
        np.testing.assert_array_equal(dk[i], ek)


def test_grad_of_vmapped_mean():
    # grad through vmap (the transpose of a batched custom call).
    qs, ks = stacked(10, 5, 4), stacked(11, 5, 4)

    def mean_loss(qs, ks, s):
        return jnp.mean(jax.vmap(flatmem_jax.clip_loss, in_axes=(0, 0, None))(qs, ks, s))

    dq, dk, ds = jax.jit(jax.grad(mean_loss, argnums=(0, 1, 2)))(qs, ks, 6.0)
    # element i's share of the mean: the gradient of L_i / N; ds sums them
    for i in range(N):
        check_grads((dq[i], dk[i]), qs[i], ks[i], 6.0, g=1.0 / N)
    shares = [scale_grad_reference(qs[i], ks[i], 6.0, g=1.0 / N) for i in range(N)]
    want, tau = sum(w for w, _ in shares), sum(t for _, t in shares)
    assert abs(float(ds) - want) <= tau + N * 2.0**-24 * abs(want), (float(ds), want)  # + JAX's fp32 sum
