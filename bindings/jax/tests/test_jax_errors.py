"""Bad input raises with flatmem's own message: at trace time (FlatmemError,
from flatmem's workspace query) for shapes and dtypes, and from XLA at run time
(the handler's error carries flatmem's status and message) for values."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
from jax_checks import unit_rows

# What XLA raises for a failed custom call: JaxRuntimeError, or ValueError when
# the failure surfaces while a result is being read.
RUNTIME = (jax.errors.JaxRuntimeError, ValueError)


def run(f, *args, **kwargs):
    return jax.block_until_ready(f(*args, **kwargs))


@pytest.fixture(params=["eager", "jit"])
def mode(request):
    return request.param


def maybe_jit(f, mode):
    return jax.jit(f) if mode == "jit" else f


# --- run time: values only the computation sees --------------------------------------


def test_labels_out_of_range(mode):
    q, k = unit_rows(1, 4, 3), unit_rows(2, 6, 3)
    f = maybe_jit(flatmem_jax.infonce_loss, mode)
    with pytest.raises(RUNTIME, match=r"INVALID_ARGUMENT: flatmem_contrastive_forward: "
                       r"FLATMEM_STATUS_INVALID_ARGUMENT: labels: labels\[2\] = 6 is outside \[0, c = 6\)"):
        run(f, q, k, 1.0, jnp.array([0, 1, 6, 2]))


def test_negative_label(mode):
    # A negative int32 label reaches flatmem as the same negative int64 (sign-extended).
    q, k = unit_rows(1, 3, 3), unit_rows(2, 3, 3)
    f = maybe_jit(flatmem_jax.infonce_loss, mode)
    with pytest.raises(RUNTIME, match=r"labels\[1\] = -1 is outside \[0, c = 3\)"):
        run(f, q, k, 1.0, jnp.array([0, -1, 2]))


def test_labels_out_of_range_under_grad():
    q, k = unit_rows(1, 2, 3), unit_rows(2, 2, 3)
    g = jax.jit(jax.grad(flatmem_jax.infonce_loss))
    with pytest.raises(RUNTIME, match=r"labels\[0\] = 5 is outside"):
        run(g, q, k, 1.0, jnp.array([5, 0]))


def test_nan_feature(mode):
    q = unit_rows(3, 5, 4).at[2, 1].set(jnp.nan)
    f = maybe_jit(flatmem_jax.clip_loss, mode)
    with pytest.raises(RUNTIME, match=r"FLATMEM_STATUS_NON_FINITE: q: element \(2, 1\) is nan"):
        run(f, q, unit_rows(4, 5, 4), 1.0)


@pytest.mark.parametrize("scale", [0.0, -2.0, np.inf])
def test_bad_logit_scale(scale):
    q = unit_rows(5, 3, 2)
    with pytest.raises(RUNTIME, match=r"FLATMEM_STATUS_INVALID_ARGUMENT: logit_scale: "):
        run(jax.jit(flatmem_jax.clip_loss), q, q, scale)


def test_infonce_without_labels_needs_c_at_least_b():
    with pytest.raises(RUNTIME, match=r"k: 3 rows is fewer than q's b = 5"):
        run(flatmem_jax.infonce_loss, unit_rows(6, 5, 2), unit_rows(7, 3, 2), 1.0)


def test_backward_errors_come_through():
    # The backward refuses a non-finite saved log-sum-exp (default NONFINITE_ERROR policy).
    q, k = unit_rows(8, 4, 3), unit_rows(9, 4, 3)
    row_lse = jnp.full((4,), jnp.inf, jnp.float32)
    col_lse = jnp.zeros((4,), jnp.float32)
    with pytest.raises(RUNTIME, match=r"flatmem_contrastive_backward: FLATMEM_STATUS_"):
        run(flatmem_jax._backward, flatmem_jax._SYMMETRIC, flatmem_jax._Site((0, None, 0)), q, k,
            jnp.float32(1.0), None,
            row_lse, col_lse, jnp.float32(1.0))


# --- trace time: shapes and dtypes (flatmem's workspace query) ---------------------


def test_clip_needs_c_equal_b(mode):
    f = maybe_jit(flatmem_jax.clip_loss, mode)
    with pytest.raises(flatmem_jax.FlatmemError, match=r"FLATMEM_STATUS_INVALID_ARGUMENT: k: 6 rows "
                       r"but the symmetric loss pairs row i of q with row i of k"):
        f(unit_rows(1, 5, 3), unit_rows(2, 6, 3), 1.0)


def test_feature_dimensions_differ():
    with pytest.raises(flatmem_jax.FlatmemError, match=r"k: feature dimension d = 4 .* differs from q's d = 3"):
        flatmem_jax.infonce_loss(unit_rows(1, 5, 3), unit_rows(2, 5, 4), 1.0)


def test_dtypes_differ():
    with pytest.raises(flatmem_jax.FlatmemError, match=r"k: dtype bfloat16 differs from q's float32"):
        flatmem_jax.clip_loss(unit_rows(1, 5, 3), unit_rows(2, 5, 3, jnp.bfloat16), 1.0)


def test_integer_features():
    q = jnp.ones((3, 2), jnp.int32)
    with pytest.raises(flatmem_jax.FlatmemError, match=r"q: dtype .* is not accepted here; expected float32 or bfloat16 or float16"):
        flatmem_jax.clip_loss(q, q, 1.0)


def test_empty_batch():
    q = jnp.ones((0, 3), jnp.float32)
    with pytest.raises(flatmem_jax.FlatmemError, match=r"q: shape \(0, 3\) has an extent < 1"):
        flatmem_jax.clip_loss(q, q, 1.0)


def test_errors_flatmem_jax_raises_itself():
    q = unit_rows(1, 4, 3)
    with pytest.raises(ValueError, match="q must be 2-D"):
        flatmem_jax.clip_loss(q[0], q, 1.0)
    with pytest.raises(ValueError, match="logit_scale must have one element"):
        flatmem_jax.clip_loss(q, q, jnp.ones(2))
    with pytest.raises(TypeError, match="labels must be integers"):
        flatmem_jax.infonce_loss(q, q, 1.0, labels=jnp.zeros(4))
    with pytest.raises(ValueError, match=r"labels must be 1-D"):
        flatmem_jax.infonce_loss(q, q, 1.0, labels=jnp.zeros((4, 1), jnp.int32))
    with pytest.raises(TypeError, match="must be float32, bfloat16 or float16"):
        flatmem_jax.clip_loss(q.astype(bool), q.astype(bool), 1.0)


def test_label_count_is_flatmems_to_check():
    q, k = unit_rows(1, 4, 3), unit_rows(2, 6, 3)
    with pytest.raises(RUNTIME, match=r"labels: shape \(3,\); expected \(4,\)"):
        run(flatmem_jax.infonce_loss, q, k, 1.0, jnp.array([0, 1, 2]))


def test_still_works_after_errors():
    # A failed call leaves nothing behind: the pooled handle and the next call are fine.
    q = unit_rows(1, 4, 3)
    with pytest.raises(RUNTIME):
        run(flatmem_jax.infonce_loss, q, q, 1.0, jnp.array([9, 9, 9, 9]))
    assert np.isfinite(float(flatmem_jax.infonce_loss(q, q, 1.0, jnp.array([0, 1, 2, 3]))))
