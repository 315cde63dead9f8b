"""jax.vmap: the custom calls use vmap_method="sequential", so a batched call is
one flatmem call per element and must equal the unbatched calls bit for bit
(flatmem is deterministic), and match the materialised reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
import jax_reference as reference
from test_jax_values import assert_grad, assert_loss, assert_scale_grad, unit_rows

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
        want, _ = reference.clip_value_and_grad(
            qs[i].astype(jnp.float32), ks[i].astype(jnp.float32), scales[i])
        assert_loss(batched[i], want, float(scales[i]), 6, 6, 5)


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
        want, (wq, wk, _) = reference.infonce_value_and_grad(qs[i], ks[i], 12.0, labels[i])
        assert_loss(values[i], want, 12.0, b, c, d)
        eq, ek = jax.grad(loss, argnums=(0, 1))(qs[i], ks[i], labels[i])
        np.testing.assert_array_equal(dq[i], eq)
        np.testing.assert_array_equal(dk[i], ek)


def test_grad_of_vmapped_mean():
    # grad through vmap (the transpose of a batched custom call).
    qs, ks = stacked(10, 5, 4), stacked(11, 5, 4)

    def mean_loss(qs, ks, s):
        return jnp.mean(jax.vmap(flatmem_jax.clip_loss, in_axes=(0, 0, None))(qs, ks, s))

    def mean_ref(qs, ks, s):
        return jnp.mean(jax.vmap(reference.clip_loss, in_axes=(0, 0, None))(qs, ks, s))

    got = jax.jit(jax.grad(mean_loss, argnums=(0, 1, 2)))(qs, ks, 6.0)
    want = jax.jit(jax.grad(mean_ref, argnums=(0, 1, 2)))(qs, ks, 6.0)
    assert_grad(got[0], want[0], 6.0, 5, 5, 4, jnp.float32, "dq")
    assert_grad(got[1], want[1], 6.0, 5, 5, 4, jnp.float32, "dk")
    assert_scale_grad(got[2], want[2], 6.0, 5, 5, 4)
