"""flatmem.contrastive_loss and flatmem.Contrastive against the float64 NumPy
reference: losses, gradients, ds against finite differences, 16-bit inputs,
row strides, DLPack producers and the handle's options."""
import numpy as np
import pytest
from python_support import BFLOAT16, FEATURE_DTYPES, features
from python_reference import contrastive_reference, forward_tolerance, gradient_tolerances, lse_tolerance

import flatmem

# (name, b, c, d, labels?, symmetric): b and c are not multiples of the tile
# extents used below (4 x 3), so partial tiles are exercised on both axes.
CASES = [
    ("symmetric", 7, 7, 12, False, True),
    ("infonce-identity", 7, 7, 12, False, False),
    ("infonce-labels-c>b", 6, 11, 9, True, False),
]


def make_case(rng, b, c, d, with_labels, dtype, scale=1.0):
    q = features(rng, b, d, dtype, scale)
    k = features(rng, c, d, dtype, scale)
    labels = rng.permutation(c)[:b].astype(np.int64) if with_labels else None
    return q, k, labels


def check_gradients(q, k, s, labels, symmetric, dq, dk, ds, dtype, g=1.0):
    """dq, dk (in dtype) and ds (float32, 0-d) against the reference, element-wise
    within the bounds of reference.gradient_tolerances."""
    _, ref_dq, ref_dk, ref_ds, _, _ = contrastive_reference(q, k, s, labels, symmetric)
    assert dq.dtype == dtype and dq.shape == q.shape
    assert dk.dtype == dtype and dk.shape == k.shape
    assert ds.dtype == np.float32 and ds.shape == ()
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q, k, s, labels, symmetric, g, dtype)
    err_dq = np.abs(dq.astype(np.float64) - g * ref_dq)
    err_dk = np.abs(dk.astype(np.float64) - g * ref_dk)
    assert np.all(err_dq <= tau_dq), f"dq off by up to {np.max(err_dq / tau_dq):.3g} x its bound"
    assert np.all(err_dk <= tau_dk), f"dk off by up to {np.max(err_dk / tau_dk):.3g} x its bound"
    assert abs(float(ds) - g * ref_ds) <= tau_ds, (float(ds), g * ref_ds, tau_ds)


def check_loss(q, k, s, labels, symmetric, loss):
    ref_loss = contrastive_reference(q, k, s, labels, symmetric)[0]
    assert abs(float(loss) - ref_loss) <= forward_tolerance(q, k, s, ref_loss), (float(loss), ref_loss)


@pytest.mark.parametrize("dtype_name", list(FEATURE_DTYPES))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_loss_and_gradients_match_reference(case, dtype_name):
    _, b, c, d, with_labels, symmetric = case
    dtype = FEATURE_DTYPES[dtype_name]
    rng = np.random.default_rng(1234)
    q, k, labels = make_case(rng, b, c, d, with_labels, dtype)
    s = 14.0

    loss, backward = flatmem.contrastive_loss(q, k, s, labels=labels, symmetric=symmetric,
                                              tile_rows=4, tile_cols=3, num_threads=2)
    assert isinstance(loss, np.ndarray) and loss.shape == () and loss.dtype == np.float32
    check_loss(q, k, s, labels, symmetric, loss)

    dq, dk, ds = backward()
    check_gradients(q, k, s, labels, symmetric, dq, dk, ds, dtype)
    # The upstream gradient scales everything: dloss = g.
    dq, dk, ds = backward(dloss=-2.5)
    check_gradients(q, k, s, labels, symmetric, dq, dk, ds, dtype, g=-2.5)


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "infonce"])
def test_default_tiles_and_large_scale(symmetric):
    """One 512 x 512 default tile, s = 100 (the running maximum keeps exp finite)."""
    rng = np.random.default_rng(7)
    q, k, _ = make_case(rng, 33, 33, 20, False, np.float32)
    s = 100.0
    loss, backward = flatmem.contrastive_loss(q, k, s, symmetric=symmetric)
    assert np.isfinite(loss)
    check_loss(q, k, s, None, symmetric, loss)
    dq, dk, ds = backward()
    check_gradients(q, k, s, None, symmetric, dq, dk, ds, np.float32)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_scale_gradient_matches_finite_differences(case):
    """dL/ds from the backward against central differences of flatmem's own
    fp32 forward: |fd - ds| <= truncation (measured on the float64 reference
    with the same step) + the forward's error amplified by 1/h + ds's bound."""
    _, b, c, d, with_labels, symmetric = case
    rng = np.random.default_rng(99)
    q, k, labels = make_case(rng, b, c, d, with_labels, np.float32)
    s, h = 8.0, 0.05

    def loss_at(scale):
        return float(flatmem.contrastive_loss(q, k, scale, labels=labels, symmetric=symmetric)[0])

    def ref_at(scale):
        return contrastive_reference(q, k, scale, labels, symmetric)[0]

    _, backward = flatmem.contrastive_loss(q, k, s, labels=labels, symmetric=symmetric)
    ds = float(backward()[2])
    fd = (loss_at(s + h) - loss_at(s - h)) / (2 * h)

    ref_ds = contrastive_reference(q, k, s, labels, symmetric)[3]
    truncation = abs((ref_at(s + h) - ref_at(s - h)) / (2 * h) - ref_ds)
    noise = 2 * forward_tolerance(q, k, s + h, ref_at(s + h)) / (2 * h)
    tau_ds = gradient_tolerances(q, k, s, labels, symmetric)[2]
    assert abs(fd - ds) <= truncation + noise + tau_ds, (fd, ds)
    assert abs(ds) > 1e-3  # not trivially zero


@pytest.mark.parametrize("dtype_name", list(FEATURE_DTYPES))
def test_row_strides(dtype_name):
    """Rows with a stride larger than d (column slices of wider arrays, every
    other row) give the results of the compact copies, and gradients can be
    written into strided output arrays."""
    dtype = FEATURE_DTYPES[dtype_name]
    rng = np.random.default_rng(5)
    b, d = 6, 10
    wide_q = features(rng, b, d + 7, dtype)
    tall_k = features(rng, 2 * b, d, dtype)
    q = wide_q[:, 3:3 + d]  # row stride d + 7, starts 3 elements in
    k = tall_k[::2]  # row stride 2 d
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    s = 9.0

    loss, backward = flatmem.contrastive_loss(q, k, s, tile_rows=4, tile_cols=4)
    loss_c, backward_c = flatmem.contrastive_loss(q.copy(), k.copy(), s, tile_rows=4, tile_cols=4)
    check_loss(q, k, s, None, True, loss)
    check_loss(q, k, s, None, True, loss_c)
    dq, dk, ds = backward()
    check_gradients(q, k, s, None, True, dq, dk, ds, dtype)
    check_gradients(q, k, s, None, True, *backward_c(), dtype)

    # Strided outputs: only the gradient's own elements are written.
    h = flatmem.Contrastive(tile_rows=4, tile_cols=4)
    saved = h.forward(q, k, s)
    dq_buf = np.full((b, d + 5), np.nan, dtype=dtype)
    dk_buf = np.full((2 * b, d), np.nan, dtype=dtype)
    dq_out, dk_out, _ = h.backward(q, k, s, saved.row_lse, saved.col_lse,
                                   dq=dq_buf[:, 2:2 + d], dk=dk_buf[1::2], dlogit_scale=False)
    assert dq_out.base is dq_buf or dq_out.base is dq_buf.base
    np.testing.assert_array_equal(dq_buf[:, 2:2 + d], dq_out)
    assert np.isnan(dq_buf[:, :2].astype(np.float32)).all() and np.isnan(dq_buf[:, 2 + d:].astype(np.float32)).all()
    assert np.isnan(dk_buf[0::2].astype(np.float32)).all()
    check_gradients(q, k, s, None, True, dq_out, dk_buf[1::2], ds, dtype)


class DLPackOnly:
    """An object that is not a NumPy array and offers only the DLPack protocol."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, stream=None):
        return self._array.__dlpack__()

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_dlpack_producer(dtype):
    """A __dlpack__ object (here backed by NumPy, row-strided) gives exactly
    the results of the NumPy array itself, and gradients in its dtype."""
    rng = np.random.default_rng(11)
    q = features(rng, 5, 16, dtype)
    k = features(rng, 9, 8 + 16, dtype)[:, 8:]
    labels = np.array([3, 0, 8, 1, 5], dtype=np.int64)
    loss, backward = flatmem.contrastive_loss(DLPackOnly(q), DLPackOnly(k), 6.0,
                                              labels=DLPackOnly(labels), symmetric=False)
    loss_np, backward_np = flatmem.contrastive_loss(q, k, 6.0, labels=labels, symmetric=False)
    assert float(loss) == float(loss_np)
    for got, want in zip(backward(), backward_np()):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_jax_arrays(dtype_name):
    """jax.Array inputs (CPU) through __dlpack__, bf16 included."""
    jnp = pytest.importorskip("jax.numpy")
    dtype = FEATURE_DTYPES[dtype_name]
    rng = np.random.default_rng(3)
    q = features(rng, 8, 16, dtype)
    k = features(rng, 8, 16, dtype)
    loss, backward = flatmem.contrastive_loss(jnp.asarray(q), jnp.asarray(k), jnp.float32(12.0))
    loss_np, backward_np = flatmem.contrastive_loss(q, k, 12.0)
    assert float(loss) == float(loss_np)
    dq, dk, ds = backward()
    assert isinstance(dq, np.ndarray) and dq.dtype == dtype
    for got, want in zip((dq, dk, ds), backward_np()):
        np.testing.assert_array_equal(got, want)


def test_handle_forward_backward_and_workspace():
    rng = np.random.default_rng(21)
    q, k, _ = make_case(rng, 10, 10, 6, False, BFLOAT16)
    s = np.float32(7.5)
    with flatmem.Contrastive("symmetric", num_threads=2, tile_rows=3, tile_cols=4) as h:
        assert h.symmetric and h.options["tile_rows"] == 3
        fwd_bytes = h.forward_workspace_size(q, k)
        bwd_bytes = h.backward_workspace_size(q, k)
        bwd_bytes_f32 = h.backward_workspace_size(q, k, np.float32)
        assert fwd_bytes > 0 and bwd_bytes > 0
        # 16-bit gradients are accumulated in an fp32 buffer in the workspace
        # ((b + c) * d * 4 bytes, each part aligned to 64 bytes).
        assert (10 + 10) * 6 * 4 <= bwd_bytes - bwd_bytes_f32 <= (10 + 10) * 6 * 4 + 2 * 64

        saved = h.forward(q, k, s)
        assert isinstance(saved, flatmem.ForwardResult)
        check_loss(q, k, float(s), None, True, saved.loss)
        _, ref_dq, _, _, ref_row, ref_col = contrastive_reference(q, k, float(s))
        assert np.all(np.abs(saved.row_lse - ref_row) <= lse_tolerance(q, k, float(s), ref_row, 10))
        assert np.all(np.abs(saved.col_lse - ref_col) <= lse_tolerance(q, k, float(s), ref_col, 10))

        # A caller workspace of exactly the queried size gives the same bits.
        ws = np.empty(max(fwd_bytes, bwd_bytes), np.uint8)
        again = h.forward(q, k, s, workspace=ws[:fwd_bytes])
        assert again.loss == saved.loss
        np.testing.assert_array_equal(again.row_lse, saved.row_lse)

        grads = h.backward(q, k, s, saved.row_lse, saved.col_lse)
        grads_ws = h.backward(q, k, s, saved.row_lse, saved.col_lse, workspace=ws[:bwd_bytes])
        for a, b in zip(grads, grads_ws):
            np.testing.assert_array_equal(a, b)
        assert grads[0].dtype == BFLOAT16

        # fp32 gradients of bf16 inputs; only dq requested.
        dq32, dk32, ds32 = h.backward(q, k, s, saved.row_lse, saved.col_lse, grad_dtype="float32",
                                      dk=False, dlogit_scale=False)
        assert dq32.dtype == np.float32 and dk32 is None and ds32 is None
        tau_dq = gradient_tolerances(q, k, float(s), dtype=np.float32)[0]
        assert np.all(np.abs(dq32 - ref_dq) <= tau_dq)
    with pytest.raises(ValueError, match="closed"):
        h.forward(q, k, s)


def test_infonce_handle_has_no_col_lse_and_shape_1_scale():
    rng = np.random.default_rng(8)
    q, k, labels = make_case(rng, 4, 6, 5, True, np.float32)
    s = np.array([5.0], dtype=np.float32)  # shape (1,) is accepted too
    h = flatmem.Contrastive("infonce")
    saved = h.forward(q, k, s, labels)
    assert saved.col_lse is None
    dq, dk, ds = h.backward(q, k, s, saved.row_lse, None, labels, dloss=np.float32(3.0))
    assert ds.shape == (1,)
    check_gradients(q, k, 5.0, labels, False, dq, dk, ds.reshape(()), np.float32, g=3.0)


def test_results_do_not_depend_on_thread_count():
    """Bitwise identical whatever num_threads (the header's determinism promise)."""
    rng = np.random.default_rng(4)
    q, k, _ = make_case(rng, 40, 40, 16, False, np.float32)
    results = []
    for threads in (1, 2, 3):
        loss, backward = flatmem.contrastive_loss(q, k, 20.0, num_threads=threads, tile_rows=8, tile_cols=8)
        results.append((loss, *backward()))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_nonfinite_propagate():
    rng = np.random.default_rng(2)
    q, k, _ = make_case(rng, 4, 4, 3, False, np.float32)
    q[1, 2] = np.nan
    loss, backward = flatmem.contrastive_loss(q, k, 3.0, nonfinite="propagate")
    assert np.isnan(loss)
    dq, _, _ = backward()
    assert np.isnan(dq).any()
