"""The precision option (options.fp32_precision, flatmem_fp32_precision) of
flatmem.Contrastive and the functional API: names checked in Python, the value
reaching the C options and the kept handles' keys, results unchanged where it
has no CPU effect (every ISA level below avx512bf16; fp32 and fp16 inputs
everywhere), and "tf32" on bf16 inputs within the bf16-gradient bound
flatmem.h gives for the bf16 path of avx512bf16 and amx (and so on every
machine)."""
import os
import re

import numpy as np
import pytest
from python_support import BFLOAT16, FEATURE_DTYPES, features
from python_reference import SLACK, contrastive_reference, forward_tolerance, gradient_tolerances
from python_sigmoid_reference import sigmoid_reference, sigmoid_tolerances

import flatmem
from flatmem import capi

PRECISIONS = {"default": capi.FP32_PRECISION_DEFAULT, "round_once": capi.FP32_PRECISION_ROUND_ONCE,
              "tf32": capi.FP32_PRECISION_TF32, "full": capi.FP32_PRECISION_FULL}
ALLOWED = "is not one of 'default', 'round_once' ('tf32'), 'full'"
BAD = ["TF32", "fp32", "", "bf16", 1, None, 2.0]


@pytest.fixture(autouse=True)
def back_to_default_isa():
    flatmem.set_cpu_isa(None)
    yield
    flatmem.set_cpu_isa(None)


@pytest.fixture
def created(monkeypatch):
    """The fp32_precision of every flatmem_contrastive_t created meanwhile."""
    seen = []
    real = capi.Contrastive

    def spy(options, comm):
        seen.append(options.fp32_precision)
        return real(options, comm)

    monkeypatch.setattr(capi, "Contrastive", spy)
    return seen


def _qk(dtype, b=9, c=9, d=40, seed=7):
    rng = np.random.default_rng(seed)
    return features(rng, b, d, dtype), features(rng, c, d, dtype)


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_bad_values_are_refused_naming_the_argument_and_the_choices(bad):
    q, k = _qk(np.float32)
    calls = [
        lambda: flatmem.Contrastive(precision=bad),
        lambda: flatmem.Contrastive("sigmoid", precision=bad),
        lambda: flatmem.contrastive_loss(q, k, 10.0, precision=bad),
        lambda: flatmem.contrastive_loss(q, k, 10.0, symmetric=False, precision=bad),
        lambda: flatmem.sigmoid_loss(q, k, 10.0, -1.0, precision=bad),
        lambda: flatmem.sigmoid_value_and_grad(q, k, 10.0, -1.0, precision=bad),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="precision: ") as info:
            call()
        assert ALLOWED in str(info.value) and repr(bad) in str(info.value)


@pytest.mark.parametrize("name", PRECISIONS)
def test_the_value_reaches_the_c_options(name, created):
    h = flatmem.Contrastive(precision=name)
    assert created == [PRECISIONS[name]]
    canonical = h.options["precision"]  # "tf32" is "round_once"'s other name: one value, one name
    assert PRECISIONS[canonical] == PRECISIONS[name] and f"'precision': '{canonical}'" in repr(h)
    h.close()
    assert flatmem.Contrastive().options["precision"] == "default"
    assert created[-1] == capi.FP32_PRECISION_DEFAULT


def test_the_functional_calls_keep_one_handle_per_precision(created):
    """The thread's kept handles are keyed by precision too: a new value makes a
    handle with that fp32_precision, a value seen before reuses its handle."""
    q, k = _qk(np.float32)
    tiles = dict(tile_rows=5, tile_cols=3)  # an option set no other test keeps
    for name in ("tf32", "full", "default", "tf32"):
        flatmem.contrastive_loss(q, k, 10.0, precision=name, **tiles)
    flatmem.sigmoid_loss(q, k, 10.0, -1.0, precision="tf32", **tiles)
    flatmem.sigmoid_value_and_grad(q, k, 10.0, -1.0, precision="tf32", **tiles)
    flatmem.sigmoid_value_and_grad(q, k, 10.0, -1.0, **tiles)
    assert created == [capi.FP32_PRECISION_TF32, capi.FP32_PRECISION_FULL, capi.FP32_PRECISION_DEFAULT,
                       capi.FP32_PRECISION_TF32, capi.FP32_PRECISION_DEFAULT]
    from flatmem.contrastive import _handle_for
    for name in PRECISIONS:
        h = _handle_for(None, "infonce", 0, 5, 3, "error", 0, name)
        assert PRECISIONS[h.options["precision"]] == PRECISIONS[name] and h.options["loss"] == "infonce"
        assert _handle_for(None, "infonce", 0, 5, 3, "error", 0, name) is h
    # kept by value: the two names of one value share a handle
    assert _handle_for(None, "infonce", 0, 5, 3, "error", 0, "tf32") is \
        _handle_for(None, "infonce", 0, 5, 3, "error", 0, "round_once")
    with pytest.raises(ValueError, match=re.escape(ALLOWED)):
        _handle_for(None, "infonce", 0, 5, 3, "error", 0, "half")


def _softmax_results(q, k, precision, symmetric=True, labels=None):
    loss, backward = flatmem.contrastive_loss(q, k, 12.0, labels=labels, symmetric=symmetric, tile_rows=4,
                                              tile_cols=3, num_threads=2, precision=precision)
    return [np.asarray(x) for x in (loss, *backward(dloss=0.5))]


def _sigmoid_results(q, k, precision):
    r = flatmem.sigmoid_value_and_grad(q, k, 12.0, -2.0, tile_rows=4, tile_cols=3, num_threads=2,
                                       precision=precision)
    return [np.asarray(x) for x in r]


def _same_bits(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("dtype_name", list(FEATURE_DTYPES))
def test_no_cpu_effect_below_avx512bf16(dtype_name):
    """Below avx512bf16 (and for fp32 / fp16 at any level) the CPU multiplies
    in fp32 whatever the precision: bitwise the default's results. Run at
    the baseline level (every machine has it) and, for fp32 and fp16, at the
    process's own level too."""
    if dtype_name in ("bf16", "bfloat16") and os.environ.get("FLATMEM_TEST_EMULATE_BF16") == "1":
        pytest.skip("a FLATMEM_BF16_EMULATED library runs the bf16 kernels at every ISA level")
    dtype = FEATURE_DTYPES[dtype_name]
    q, k = _qk(dtype, b=13, c=17, d=37)
    k_sym = k[:13]
    labels = np.arange(13, dtype=np.int64) * 5 % 17
    levels = ["baseline"] if dtype == BFLOAT16 else ["baseline", None]
    for level in levels:
        flatmem.set_cpu_isa(level)
        for name in ("tf32", "full"):
            _same_bits(_softmax_results(q, k_sym, name), _softmax_results(q, k_sym, "default"))
            _same_bits(_softmax_results(q, k, name, False, labels), _softmax_results(q, k, "default", False, labels))
            _same_bits(_sigmoid_results(q, k, name), _sigmoid_results(q, k, "default"))


def _tf32_extra(s, G_abs, ka, qa, g=1.0):
    """flatmem.h's extra error of "tf32" on the bf16 path: G rounded once to
    bf16, 2^-8 s sum_j |G_ij| |k_jt| (dq) and 2^-8 s sum_i |G_ij| |q_it| (dk)."""
    return (SLACK * 2.0**-8 * s * abs(g) * (G_abs @ ka), SLACK * 2.0**-8 * s * abs(g) * (G_abs.T @ qa))


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric", "infonce"])
def test_tf32_on_bf16_stays_within_the_bf16_gradient_bound(symmetric):
    """At the process's own level (avx512bf16 or amx where the CPU has it: G
    rounded once to bf16) the loss keeps its fp32 bound and dq, dk stay
    within the default bound plus 2^-8 s |G| |k| (|G|^T |q|)."""
    q, k = _qk(BFLOAT16, b=70, c=70 if symmetric else 83, d=96, seed=11)
    labels = None if symmetric else np.random.default_rng(3).permutation(83)[:70].astype(np.int64)
    s, g = 12.0, 0.5
    loss, dq, dk, ds = _softmax_results(q, k, "tf32", symmetric, labels)
    ref_loss, ref_dq, ref_dk, ref_ds, _, _ = contrastive_reference(q, k, s, labels, symmetric)
    assert abs(float(loss) - ref_loss) <= forward_tolerance(q, k, s, ref_loss)
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q, k, s, labels, symmetric, g, BFLOAT16)
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    x = s * q64 @ k64.T
    P = np.exp(x - x.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    # |G| <= (P (+ Q) + positives) / N: the extra term is bounded with that sum
    if symmetric:
        Q = np.exp(x - x.max(axis=0, keepdims=True))
        Q /= Q.sum(axis=0, keepdims=True)
        W = (P + Q + 2 * np.eye(70)) / 140
    else:
        pos = np.zeros_like(P)
        pos[np.arange(70), labels] = 1
        W = (P + pos) / 70
    extra_dq, extra_dk = _tf32_extra(s, W, np.abs(k64), np.abs(q64), g)
    assert dq.dtype == BFLOAT16 and dk.dtype == BFLOAT16
    err_dq = np.abs(dq.astype(np.float64) - g * ref_dq)
    err_dk = np.abs(dk.astype(np.float64) - g * ref_dk)
    assert np.all(err_dq <= tau_dq + extra_dq), np.max(err_dq / (tau_dq + extra_dq))
    assert np.all(err_dk <= tau_dk + extra_dk), np.max(err_dk / (tau_dk + extra_dk))
    assert abs(float(ds) - g * ref_ds) <= tau_ds  # ds is formed from fp32 G: unchanged bound


def test_tf32_sigmoid_on_bf16_stays_within_the_bf16_gradient_bound():
    q, k = _qk(BFLOAT16, b=50, c=61, d=72, seed=5)
    s, t = 12.0, -2.0
    loss, dq, dk, ds, dt = _sigmoid_results(q, k, "tf32")
    ref = sigmoid_reference(q.astype(np.float64), k.astype(np.float64), s, t)
    tau = sigmoid_tolerances(q, k, s, t, dtype=BFLOAT16)
    G_abs = np.abs(ref["G"])
    extra_dq, extra_dk = _tf32_extra(s, G_abs, np.abs(k.astype(np.float64)), np.abs(q.astype(np.float64)))
    assert abs(float(loss) - ref["loss"]) <= tau["loss"]
    assert np.all(np.abs(dq.astype(np.float64) - ref["dq"]) <= tau["dq"] + extra_dq)
    assert np.all(np.abs(dk.astype(np.float64) - ref["dk"]) <= tau["dk"] + extra_dk)
    assert abs(float(ds) - ref["ds"]) <= tau["ds"]
    assert abs(float(dt) - ref["dt"]) <= tau["dt"]
