"""The sigmoid (SigLIP) loss: flatmem.sigmoid_loss, flatmem.sigmoid_value_and_grad
and Contrastive("sigmoid") against the float64 NumPy reference
(python_sigmoid_reference): the loss and all four gradients within the
derived bounds, ds and dt against central differences of the reference,
backward(g) against value_and_grad, 16-bit inputs, the handle's workspace
and options, and refused inputs with flatmem's messages."""
import numpy as np
import pytest
from python_sigmoid_reference import finite_difference, sigmoid_reference, sigmoid_tolerances
from python_support import FEATURE_DTYPES, features, raises_flatmem

import flatmem
from flatmem import capi

INVALID = capi.STATUS_INVALID_ARGUMENT

# (id, b, c, d, labels?, s, t). Tiles of 4 x 3 below: b and c are not
# multiples of them, so partial tiles occur on both axes.
CASES = [
    ("one", 1, 1, 1, False, 10.0, -10.0),
    ("primes", 7, 11, 13, False, 10.0, -10.0),
    ("square-s100-t-10", 13, 13, 5, False, 100.0, -10.0),
    ("labels-c>b", 5, 17, 7, True, 3.0, 0.5),
    ("labels-b>c", 11, 3, 2, True, 100.0, -10.0),
]


def make_case(rng, b, c, d, with_labels, dtype):
    q = features(rng, b, d, dtype)
    k = features(rng, c, d, dtype)
    labels = rng.integers(0, c, size=b).astype(np.int64) if with_labels else None
    return q, k, labels


def check_outputs(q, k, s, t, labels, got, dtype, g=1.0):
    """got: a dict with any of loss, dq, dk, ds, dt (the gradients of g L)
    against the reference, within the bounds of sigmoid_tolerances."""
    ref = sigmoid_reference(q, k, s, t, labels, g)
    tol = sigmoid_tolerances(q, k, s, t, labels, g, dtype)
    if "loss" in got:
        assert got["loss"].dtype == np.float32 and got["loss"].shape == ()
        loss_ref = sigmoid_reference(q, k, s, t, labels)["loss"]
        assert abs(float(got["loss"]) - loss_ref) <= tol["loss"], (float(got["loss"]), loss_ref, tol["loss"])
    for name, like in (("dq", q), ("dk", k)):
        if name in got:
            a = got[name]
            assert a.dtype == dtype and a.shape == like.shape, (name, a.dtype, a.shape)
            err = np.abs(a.astype(np.float64) - ref[name])
            assert np.all(err <= tol[name]), f"{name} off by up to {np.max(err / tol[name]):.3g} x its bound"
    for name in ("ds", "dt"):
        if name in got:
            assert got[name].dtype == np.float32
            assert abs(float(got[name]) - ref[name]) <= tol[name], (name, float(got[name]), ref[name], tol[name])


def as_dict(result):
    """A SigmoidResult / SigmoidGrads as check_outputs' dict (Nones left out)."""
    names = {"loss": "loss", "dq": "dq", "dk": "dk", "dlogit_scale": "ds", "dlogit_bias": "dt"}
    return {names[f]: v for f, v in result._asdict().items() if v is not None}


@pytest.mark.parametrize("dtype_name", list(FEATURE_DTYPES))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_all_outputs_match_reference(case, dtype_name):
    """sigmoid_loss's loss and backward(), sigmoid_value_and_grad's five
    outputs, with the upstream gradient g scaling every gradient."""
    _, b, c, d, with_labels, s, t = case
    dtype = FEATURE_DTYPES[dtype_name]
    q, k, labels = make_case(np.random.default_rng(1234), b, c, d, with_labels, dtype)
    options = dict(tile_rows=4, tile_cols=3, num_threads=2)

    loss, backward = flatmem.sigmoid_loss(q, k, s, t, labels, **options)
    check_outputs(q, k, s, t, labels, {"loss": loss}, dtype)
    grads = backward()
    assert isinstance(grads, flatmem.SigmoidGrads)
    check_outputs(q, k, s, t, labels, as_dict(grads), dtype)
    check_outputs(q, k, s, t, labels, as_dict(backward(dloss=-1.7)), dtype, g=-1.7)

    result = flatmem.sigmoid_value_and_grad(q, k, s, t, labels, **options)
    assert isinstance(result, flatmem.SigmoidResult)
    assert all(v is not None for v in result)
    check_outputs(q, k, s, t, labels, as_dict(result), dtype)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_backward_is_dloss_times_value_and_grad(case):
    """backward(g) == g * value_and_grad: bitwise for powers of two (g scales
    G_ij = g (-z) sigmoid(v) / b exactly, and everything after is linear), and
    fp32 gradients of 16-bit inputs as well."""
    _, b, c, d, with_labels, s, t = case
    q, k, labels = make_case(np.random.default_rng(5), b, c, d, with_labels, FEATURE_DTYPES["bfloat16"])
    with flatmem.Contrastive("sigmoid", tile_rows=4, tile_cols=3) as h:
        full = h.sigmoid_value_and_grad(q, k, s, t, labels, grad_dtype="float32")
        for g in (1.0, -2.0, 0.25):
            grads = h.sigmoid_backward(q, k, s, t, labels, g, grad_dtype=np.float32)
            for got, want in zip(grads, full[1:]):
                assert got.dtype == np.float32
                np.testing.assert_array_equal(got, np.float32(g) * want)
        check_outputs(q, k, s, t, labels, as_dict(full), np.float32)


@pytest.mark.parametrize("case", CASES[1:], ids=[c[0] for c in CASES[1:]])
def test_scale_and_bias_gradients_match_finite_differences(case):
    """dL/ds and dL/dt of the library against central differences of the
    float64 reference loss: |fd - library| <= the FD error bound + the
    library's bound. (The reference's analytic ds, dt are checked the same
    way, with no library term.)"""
    _, b, c, d, with_labels, s, t = case
    q, k, labels = make_case(np.random.default_rng(99), b, c, d, with_labels, np.float32)
    result = flatmem.sigmoid_value_and_grad(q, k, s, t, labels)
    ref = sigmoid_reference(q, k, s, t, labels)
    tol = sigmoid_tolerances(q, k, s, t, labels)
    for wrt, got, name in (("s", result.dlogit_scale, "ds"), ("t", result.dlogit_bias, "dt")):
        fd, fd_error = finite_difference(q, k, s, t, labels, wrt, h=1e-4)
        assert abs(fd - ref[name]) <= fd_error, (wrt, fd, ref[name], fd_error)
        assert abs(fd - float(got)) <= fd_error + tol[name], (wrt, fd, float(got), fd_error + tol[name])
        assert abs(fd) > 1e-3  # not trivially zero


def test_handle_forward_workspace_and_options():
    rng = np.random.default_rng(21)
    dtype = FEATURE_DTYPES["float16"]
    q, k, labels = make_case(rng, 9, 14, 6, True, dtype)
    s, t = np.array([7.5], np.float32), np.array([-3.0], np.float32)  # shape (1,) accepted
    with flatmem.Contrastive("siglip", num_threads=2, tile_rows=3, tile_cols=4) as h:
        assert h.options["loss"] == "sigmoid" and not h.symmetric
        fwd_bytes = h.sigmoid_workspace_size(q, k)
        grad_bytes = h.sigmoid_workspace_size(q, k, dq=True, dk=True)
        grad_bytes_f32 = h.sigmoid_workspace_size(q, k, np.float32, dq=True, dk=True)
        # 16-bit gradients are accumulated in fp32 in the workspace: (b + c) d 4 bytes (+ alignment).
        assert (9 + 14) * 6 * 4 <= grad_bytes - grad_bytes_f32 <= (9 + 14) * 6 * 4 + 2 * 64
        assert fwd_bytes > 0

        loss = h.sigmoid_forward(q, k, s, t, labels)
        check_outputs(q, k, 7.5, -3.0, labels, {"loss": loss}, dtype)
        ws = np.empty(max(fwd_bytes, grad_bytes), np.uint8)
        assert h.sigmoid_forward(q, k, s, t, labels, workspace=ws[:fwd_bytes]) == loss
        full = h.sigmoid_value_and_grad(q, k, s, t, labels)
        assert full.dlogit_scale.shape == (1,) and full.dlogit_bias.shape == (1,)
        again = h.sigmoid_value_and_grad(q, k, s, t, labels, workspace=ws[:grad_bytes])
        for a, b in zip(full, again):
            np.testing.assert_array_equal(a, b)
        check_outputs(q, k, 7.5, -3.0, labels,
                      as_dict(full._replace(dlogit_scale=full.dlogit_scale[0], dlogit_bias=full.dlogit_bias[0])),
                      dtype)
        # Only some outputs; caller-provided (strided) dq.
        dq_buf = np.full((9, 10), np.nan, np.float32)
        part = h.sigmoid_backward(q, k, s, t, labels, dq=dq_buf[:, 2:8], dk=False, dlogit_scale=False,
                                  grad_dtype="float32")
        assert part.dk is None and part.dlogit_scale is None and part.dlogit_bias.shape == (1,)
        assert np.isnan(dq_buf[:, :2]).all() and np.isnan(dq_buf[:, 8:]).all()
        check_outputs(q, k, 7.5, -3.0, labels, {"dq": dq_buf[:, 2:8]}, np.float32)
        only_loss = h.sigmoid_value_and_grad(q, k, s, t, labels, dq=False, dk=False, dlogit_scale=False,
                                             dlogit_bias=False)
        assert only_loss.loss is not None and only_loss[1:] == (None,) * 4
    with pytest.raises(ValueError, match="closed"):
        h.sigmoid_forward(q, k, s, t, labels)


def test_results_do_not_depend_on_thread_count():
    """Bitwise identical whatever num_threads (flatmem.h's determinism promise)."""
    q, k, _ = make_case(np.random.default_rng(4), 40, 40, 16, False, np.float32)
    runs = [flatmem.sigmoid_value_and_grad(q, k, 20.0, -5.0, num_threads=n, tile_rows=8, tile_cols=8)
            for n in (1, 2, 3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def test_nonfinite_propagate():
    q, k, _ = make_case(np.random.default_rng(2), 4, 4, 3, False, np.float32)
    q[1, 2] = np.nan
    loss, backward = flatmem.sigmoid_loss(q, k, 3.0, 1.0, nonfinite="propagate")
    assert np.isnan(loss)
    assert np.isnan(backward().dq).any()


# ---------------------------------------------------------------------------
# refused inputs: flatmem's exception classes and messages
# ---------------------------------------------------------------------------

@pytest.fixture
def qk():
    rng = np.random.default_rng(0)
    return features(rng, 4, 8, np.float32), features(rng, 4, 8, np.float32)


@pytest.mark.parametrize("change,text", [
    (lambda q, k: (q.astype(np.float64), k), "q: dtype float64 is not accepted here"),
    (lambda q, k: (q, k.astype(np.float16)), "k: dtype float16 differs from q's float32"),
    (lambda q, k: (q, k[:, :6]), "k: feature dimension d = 6 (shape (4, 6)) differs from q's d = 8"),
    (lambda q, k: (q, k[:3]), "k: 3 rows is fewer than q's b = 4; without labels row i's positive is column i"),
    (lambda q, k: (q[0], k), "q: ndim is 1 with shape (8,); expected 2"),
], ids=["float64", "mixed-dtypes", "d-mismatch", "c<b-without-labels", "ndim"])
def test_bad_features(qk, change, text):
    q, k = change(*qk)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, text) as info:
        flatmem.sigmoid_loss(q, k, 10.0, -10.0)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("labels,text", [
    (np.array([0, 1, 99, 2]), "labels[2] = 99 is outside [0, c = 4)"),
    (np.array([0, 1, -1, 2]), "labels[2] = -1 is outside [0, c = 4)"),
    (np.arange(3), "labels: shape (3,); expected (4,)"),
    (np.arange(4, dtype=np.int32), "labels: dtype int32 is not accepted here; expected int64"),
], ids=["above", "negative", "shape", "int32"])
def test_bad_labels(qk, labels, text):
    q, k = qk
    for call in (lambda: flatmem.sigmoid_loss(q, k, 10.0, -10.0, labels),
                 lambda: flatmem.sigmoid_value_and_grad(q, k, 10.0, -10.0, labels)):
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID, text):
            call()


@pytest.mark.parametrize("scale,bias,text", [
    (10.0, np.nan, "logit_bias: nan; expected a finite value"),
    (10.0, np.inf, "logit_bias: inf; expected a finite value"),
    (10.0, -np.inf, "logit_bias: -inf; expected a finite value"),
    (10.0, np.ones(2), "logit_bias: shape (2,); expected one element"),
    (0.0, 1.0, "logit_scale: 0; expected a finite value > 0"),
    (np.nan, 1.0, "logit_scale: nan"),
], ids=["bias-nan", "bias-inf", "bias-minus-inf", "bias-two-elements", "scale-zero", "scale-nan"])
def test_bad_scale_and_bias(qk, scale, bias, text):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, text):
        flatmem.sigmoid_value_and_grad(q, k, scale, bias)


@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_features_with_nonfinite_error(qk, where):
    q, k = (a.copy() for a in qk)
    (q if where == "q" else k)[1, 2] = np.nan
    with raises_flatmem(flatmem.NonFiniteError, capi.STATUS_NON_FINITE, f"{where}: element (1, 2) is nan",
                        "FLATMEM_NONFINITE_ERROR") as info:
        flatmem.sigmoid_loss(q, k, 10.0, -10.0)
    assert isinstance(info.value, FloatingPointError)


def test_bad_dloss(qk):
    q, k = qk
    _, backward = flatmem.sigmoid_loss(q, k, 10.0, -10.0)
    with raises_flatmem(flatmem.NonFiniteError, capi.STATUS_NON_FINITE, "dloss: inf; expected a finite upstream"):
        backward(dloss=np.inf)


@pytest.mark.parametrize("loss", ["symmetric", "infonce"])
def test_softmax_handle_given_to_the_sigmoid_calls(qk, loss):
    q, k = qk
    h = flatmem.Contrastive(loss)
    for name, call in (("forward", lambda: h.sigmoid_forward(q, k, 10.0, 1.0)),
                       ("value_and_grad", lambda: h.sigmoid_value_and_grad(q, k, 10.0, 1.0)),
                       ("backward", lambda: h.sigmoid_backward(q, k, 10.0, 1.0))):
        with raises_flatmem(flatmem.InvalidArgumentError, INVALID,
                            f"handle: flatmem_contrastive_sigmoid_{name} needs a handle created with loss = "
                            "FLATMEM_CONTRASTIVE_SIGMOID"):
            call()


def test_sigmoid_handle_given_to_the_softmax_calls(qk):
    q, k = qk
    h = flatmem.Contrastive("sigmoid")
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID,
                        "created with loss = FLATMEM_CONTRASTIVE_SIGMOID, which flatmem_contrastive_forward "
                        "does not compute"):
        h.forward(q, k, 10.0)


def test_bad_outputs_workspace_and_options(qk):
    q, k = qk
    h = flatmem.Contrastive("sigmoid")
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "all NULL; request at least one output"):
        h.sigmoid_value_and_grad(q, k, 10.0, 1.0, loss=False, dq=False, dk=False, dlogit_scale=False,
                                 dlogit_bias=False)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "dq: dtype float64"):
        h.sigmoid_backward(q, k, 10.0, 1.0, grad_dtype=np.float64)
    needed = h.sigmoid_workspace_size(q, k)
    with raises_flatmem(flatmem.WorkspaceTooSmallError, capi.STATUS_WORKSPACE_TOO_SMALL,
                        f"workspace: {needed - 1} bytes given; {needed} bytes needed"):
        h.sigmoid_forward(q, k, 10.0, 1.0, workspace=np.empty(needed - 1, np.uint8))
    with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED,
                        "options.logit_cache_bytes: 100; the sigmoid loss keeps no logit tiles"):
        flatmem.Contrastive("sigmoid", logit_cache_bytes=100)
