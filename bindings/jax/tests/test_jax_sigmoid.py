"""flatmem_jax.sigmoid_loss (SigLIP) against the float64 NumPy reference of
sigmoid_reference.py within its derived bounds (jax_checks.check_sigmoid):
values and the gradients of q, k, s and t under jit and value_and_grad, both
custom-VJP paths (the saved gradients of one value_and_grad call, and
recompute=True), which C function each path runs, errors, vmap."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
from jax_checks import check_sigmoid, fp32, unit_rows, widened
from sigmoid_reference import scaled_tolerance, sigmoid_reference, sigmoid_tolerances

DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]
RUNTIME = (jax.errors.JaxRuntimeError, ValueError)  # as test_jax_errors.py


def problem(b, c, d, with_labels, dtype=jnp.float32, seed=0):
    q, k = unit_rows(seed + 1, b, d, dtype), unit_rows(seed + 2, c, d, dtype)
    labels = jnp.asarray(np.random.default_rng(seed + 3).integers(0, c, b)) if with_labels else None
    return q, k, labels


def value_and_grads(labels, recompute=False, g=1.0):
    def loss(q, k, s, t):
        return g * flatmem_jax.sigmoid_loss(q, k, s, t, labels, recompute=recompute)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))


# (b, c, d, with labels): 1, primes, c > b with labels (and without: y_i = i),
# d = 1, more than one 512-row tile with c > b and labels.
SHAPES = [(1, 1, 1, False), (1, 1, 4, False), (1, 6, 3, True), (3, 7, 5, True), (2, 2, 1, False),
          (13, 13, 7, False), (17, 40, 6, False), (29, 31, 13, True), (520, 1031, 4, True)]


@pytest.mark.parametrize("b,c,d,with_labels", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
def test_value_and_grad_under_jit(b, c, d, with_labels, dtype):
    q, k, labels = problem(b, c, d, with_labels, dtype)
    s, t = jnp.float32(10.0), jnp.float32(-3.5)
    loss, grads = value_and_grads(labels)(q, k, s, t)
    check_sigmoid(loss, grads, q, k, s, t, labels)


@pytest.mark.parametrize("with_labels", [False, True], ids=["diagonal", "labels"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
def test_scale_100_and_bias_minus_10(with_labels, dtype):
    # SigLIP's range: s = 100 on unit rows puts logits in [-110, 90]; softplus
    # and sigmoid must neither overflow nor cancel.
    q, k, labels = problem(40, 47 if with_labels else 40, 16, with_labels, dtype, seed=10)
    k = k.at[:5].set(q[:5])  # a few perfectly matched pairs: their terms are e^-90 small
    loss, grads = value_and_grads(labels)(q, k, 100.0, -10.0)
    check_sigmoid(loss, grads, q, k, 100.0, -10.0, labels)
    assert all(np.all(np.isfinite(np.asarray(x, np.float32))) for x in (loss, *grads))


@pytest.mark.parametrize("b,c,d,with_labels", [(1, 1, 4, False), (13, 29, 11, True), (520, 1031, 4, True)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
def test_recompute_gives_the_same_bits(b, c, d, with_labels, dtype):
    # With cotangent 1 the saved gradients are flatmem's value_and_grad ones and the
    # recomputed ones its backward's with dloss = 1: one tile walk each, the same bits.
    q, k, labels = problem(b, c, d, with_labels, dtype, seed=20)
    saved = value_and_grads(labels)(q, k, 7.0, -2.0)
    recomputed = value_and_grads(labels, recompute=True)(q, k, 7.0, -2.0)
    check_sigmoid(recomputed[0], recomputed[1], q, k, 7.0, -2.0, labels)
    assert saved[0] == recomputed[0]
    for a, b_ in zip(saved[1], recomputed[1]):
        np.testing.assert_array_equal(a, b_)


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=lambda t: jnp.dtype(t).name)
def test_upstream_gradient_is_applied(recompute, dtype):
    # grad of g L is g grad L on both paths (the saved gradients scaled by the
    # cotangent, or the cotangent passed to flatmem's backward as dloss).
    q, k, labels = problem(9, 14, 5, True, dtype, seed=30)
    for g in (3.0, -0.5):
        value, grads = value_and_grads(labels, recompute, g)(q, k, 6.0, 1.5)
        check_sigmoid(None, grads, q, k, 6.0, 1.5, labels, g=g)


def test_learned_log_scale_and_bias_by_the_chain_rule():
    # SigLIP learns t' = log s and the bias b: d/dt' = s dL/ds, d/db = dL/dt.
    q, k, labels = problem(11, 11, 6, False, seed=40)
    log_s, bias = jnp.log(jnp.float32(10.0)), jnp.float32(-10.0)

    def loss(log_s, bias):
        return flatmem_jax.sigmoid_loss(q, k, jnp.exp(log_s), bias)

    dlog_s, dbias = jax.jit(jax.grad(loss, argnums=(0, 1)))(log_s, bias)
    s = jnp.exp(log_s)  # the scale flatmem saw
    # s ds in fp32: the bound on ds scaled by s, plus that product's rounding.
    ref = sigmoid_reference(widened(q), widened(k), fp32(s), fp32(bias))
    tau = sigmoid_tolerances(widened(q), widened(k), fp32(s), fp32(bias))
    want = fp32(s) * ref[3]
    bound = scaled_tolerance(tau[3], ref[3], fp32(s))
    assert abs(float(dlog_s) - want) <= bound, (float(dlog_s), want, bound)
    assert abs(float(dbias) - ref[4]) <= tau[4], (float(dbias), ref[4], tau[4])


def custom_calls(f, *args, platform="cpu"):
    """The flatmem custom-call targets of f's lowering for `platform`, and of
    the module XLA:CPU compiled (after its optimisations)."""
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=(platform,))
    text = lowered.as_text()
    calls = sorted(re.findall(r"custom_call @(flatmem_\w+)\(", text))
    if platform != "cpu":
        return calls, text
    compiled = lowered.compile().as_text()
    return calls, sorted(set(re.findall(r'custom_call_target="(flatmem_\w+)"', compiled)))


def test_each_path_calls_the_c_function_it_documents():
    q, k, labels = problem(6, 8, 5, True)
    args = (q, k, 2.0, -1.0)

    def loss(recompute):
        return lambda q, k, s, t: flatmem_jax.sigmoid_loss(q, k, s, t, labels, recompute=recompute)

    for recompute in (False, True):
        # The value alone: the plain forward, no gradient products.
        assert custom_calls(loss(recompute), *args) == (["flatmem_sigmoid_forward"],) * 2
    # Differentiated: one value_and_grad call, nothing in the backward but a product.
    vag = jax.value_and_grad(loss(False), argnums=(0, 1, 2, 3))
    assert custom_calls(vag, *args) == (["flatmem_sigmoid_value_and_grad"],) * 2
    grad = jax.grad(loss(False), argnums=(0, 1, 2, 3))
    assert custom_calls(grad, *args) == (["flatmem_sigmoid_value_and_grad"],) * 2
    # recompute=True: the forward, then flatmem's backward; under jax.grad JAX
    # drops the forward, whose value nothing reads (6 b c d FLOPs in all).
    vag = jax.value_and_grad(loss(True), argnums=(0, 1, 2, 3))
    pair = ["flatmem_sigmoid_backward", "flatmem_sigmoid_forward"]
    assert custom_calls(vag, *args) == (pair, pair)
    grad = jax.grad(loss(True), argnums=(0, 1, 2, 3))
    assert custom_calls(grad, *args) == (["flatmem_sigmoid_backward"],) * 2


def test_each_path_runs_the_c_function_it_documents():
    # At run time: flatmem's error text names the C function that refused the
    # call (labels out of range are seen only there). jax.grad of the recompute
    # path runs flatmem's backward alone: JAX drops the forward, whose value is unused.
    q, k, _ = problem(4, 5, 3, False)
    labels = jnp.asarray([0, 1, 9, 2])

    def loss(q, k, recompute=False):
        return flatmem_jax.sigmoid_loss(q, k, 2.0, -1.0, labels, recompute=recompute)

    for f, function in ((jax.jit(loss), "flatmem_contrastive_sigmoid_forward"),
                        (jax.jit(jax.grad(loss)), "flatmem_contrastive_sigmoid_value_and_grad"),
                        (jax.jit(jax.grad(lambda q, k: loss(q, k, True))),
                         "flatmem_contrastive_sigmoid_backward")):
        with pytest.raises(RUNTIME) as error:
            jax.block_until_ready(f(q, k))
        message = str(error.value)
        assert f"{function}: FLATMEM_STATUS_INVALID_ARGUMENT: labels" in message, message
        assert "9" in message and "[0, c = 5)" in message, message


@pytest.mark.skipif(not flatmem_jax.has_cuda, reason="libflatmem_jax.so built without nvcc")
def test_cuda_lowering_uses_the_same_targets_without_workspace_result():
    q, k, labels = problem(6, 8, 5, True)
    vag = jax.value_and_grad(lambda q, k, s, t: flatmem_jax.sigmoid_loss(q, k, s, t, labels),
                             argnums=(0, 1, 2, 3))
    calls, text = custom_calls(vag, q, k, 2.0, -1.0, platform="cuda")
    assert calls == ["flatmem_sigmoid_value_and_grad"] and "ui8" not in text
    recompute = jax.value_and_grad(
        lambda q, k: flatmem_jax.sigmoid_loss(q, k, 2.0, -1.0, recompute=True))
    calls, text = custom_calls(recompute, q, k, platform="cuda")
    assert calls == ["flatmem_sigmoid_backward", "flatmem_sigmoid_forward"] and "ui8" not in text


def test_cpu_lowering_has_a_workspace_result_of_the_queried_size():
    q, k, _ = problem(6, 8, 5, False, jnp.bfloat16)
    vag = jax.value_and_grad(lambda q, k: flatmem_jax.sigmoid_loss(q, k, 2.0, -1.0), argnums=(0, 1))
    text = jax.jit(vag).trace(q, k).lower(lowering_platforms=("cpu",)).as_text()
    size = flatmem_jax._workspace_bytes(3, True, q.dtype, q.shape, k.dtype, k.shape)
    call = re.search(r"custom_call @flatmem_sigmoid_value_and_grad\(.*", text).group(0)
    assert call.endswith(f"-> (tensor<f32>, tensor<6x5xbf16>, tensor<8x5xbf16>, tensor<f32>, "
                         f"tensor<f32>, tensor<{size}xui8>)"), call
    assert size > 0  # bf16 gradients accumulate in fp32 in the workspace


def test_errors_name_the_argument():
    q, k, _ = problem(4, 5, 3, False)
    with pytest.raises(flatmem_jax.FlatmemError, match="FLATMEM_STATUS_INVALID_ARGUMENT") as e:
        flatmem_jax.sigmoid_loss(q, unit_rows(1, 5, 4), 2.0, 0.0)
    assert "k" in str(e.value)
    with pytest.raises(flatmem_jax.FlatmemError, match="dtype"):
        flatmem_jax.sigmoid_loss(q, k.astype(jnp.bfloat16), 2.0, 0.0)
    with pytest.raises(ValueError, match="logit_bias must have one element"):
        flatmem_jax.sigmoid_loss(q, k, 2.0, jnp.zeros(2))
    with pytest.raises(TypeError, match="recompute must be a static Python bool"):
        flatmem_jax.sigmoid_loss(q, k, 2.0, 0.0, recompute="yes")
    with pytest.raises(TypeError, match="labels must be integers"):
        flatmem_jax.sigmoid_loss(q, k, 2.0, 0.0, jnp.zeros(4))
    for s, t, name in ((0.0, 0.0, "logit_scale"), (-1.0, 0.0, "logit_scale"),
                       (2.0, float("inf"), "logit_bias"), (2.0, float("nan"), "logit_bias")):
        with pytest.raises(RUNTIME) as error:
            jax.block_until_ready(jax.jit(flatmem_jax.sigmoid_loss)(q, k, s, t))
        message = str(error.value)
        assert "flatmem_contrastive_sigmoid_forward: FLATMEM_STATUS_INVALID_ARGUMENT" in message, message
        assert name in message, message
    # c < b without labels: row 4 has no column 4.
    with pytest.raises((flatmem_jax.FlatmemError, *RUNTIME)) as error:
        jax.block_until_ready(flatmem_jax.sigmoid_loss(unit_rows(1, 6, 3), k, 2.0, 0.0))
    assert "FLATMEM_STATUS_INVALID_ARGUMENT" in str(error.value), str(error.value)
    q_nan = q.at[1, 2].set(jnp.nan)
    with pytest.raises(RUNTIME, match="FLATMEM_STATUS_"):
        jax.block_until_ready(jax.grad(flatmem_jax.sigmoid_loss)(q_nan, k, 2.0, 0.0))


def test_vmap_equals_per_element_calls():
    n, b, c, d = 3, 5, 7, 4
    qs = jnp.stack([unit_rows(50 + i, b, d) for i in range(n)])
    ks = jnp.stack([unit_rows(60 + i, c, d) for i in range(n)])
    labels = jnp.asarray(np.random.default_rng(70).integers(0, c, (n, b)))
    biases = jnp.array([-10.0, 0.0, 2.5], jnp.float32)

    def loss(q, k, t, y):
        return flatmem_jax.sigmoid_loss(q, k, 10.0, t, y)

    vag = jax.value_and_grad(loss, argnums=(0, 1, 2))
    values, grads = jax.jit(jax.vmap(vag))(qs, ks, biases, labels)
    for i in range(n):
        value, expected = vag(qs[i], ks[i], biases[i], labels[i])
        assert values[i] == value
        for a, b_ in zip(grads, expected):
            np.testing.assert_array_equal(a[i], b_)
        check_sigmoid(values[i], (grads[0][i], grads[1][i]), qs[i], ks[i], 10.0, biases[i], labels[i])

