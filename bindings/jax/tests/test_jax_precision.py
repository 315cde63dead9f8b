"""precision= of flatmem_jax's losses (clip_loss, infonce_loss, sigmoid_loss;
options.fp32_precision, flatmem_fp32_precision), as flatmem's Python and torch
bindings take it: names checked at trace time with flatmem.contrastive's
wording; the value carried by every custom call (single process and ring,
CPU and CUDA lowerings) as the fp32_precision attribute and reaching the
pooled handle's options (a value flatmem refuses fails in
flatmem_contrastive_create naming options.fp32_precision; each precision has
handles of its own); results bitwise the default's where it has no CPU effect
(fp32 and fp16 inputs everywhere, bf16 below avx512bf16, whose bf16 tile
products amx shares); "tf32" on bf16
inputs within the float64 reference's bound plus flatmem.h's extra
2^-8 s sum |G| |k| (|G|^T |q|) for dq (dk), which holds at every ISA level.
test_jax_ring.py runs the ring ones across processes (ring_worker.py)."""
import ctypes
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import flatmem_jax
from jax_checks import check_loss, check_scale_grad, fp32, unit_rows, widened
from python_reference import SLACK, contrastive_reference, gradient_tolerances
from sigmoid_reference import scaled_tolerance, sigmoid_reference, sigmoid_tolerances

PRECISIONS = {"default": 0, "tf32": 1, "full": 2}
ALLOWED = "is not one of 'default', 'round_once' ('tf32'), 'full'"
BAD = ["TF32", "fp32", "", "bf16", 1, None, 2.0]
RUNTIME = (jax.errors.JaxRuntimeError, ValueError)  # as test_jax_errors.py
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


def fake_comm(slot):
    """A RingComm naming registry slot `slot` with no communicator behind it
    (as test_jax_library.py's): tracing and lowering only read the slot."""
    comm = object.__new__(flatmem_jax.RingComm)
    comm._slot, comm._closed, comm._rank, comm._world_size = slot, False, 0, 1
    return comm


def losses(precision, comm=None, recompute=False, labels=(2, 0, 1, 5, 3, 4)):
    """name -> (a function of q, k, s, t, its jax.grad argnums) for every loss
    entry point: clip_loss (of q and k's first b rows), infonce_loss and
    sigmoid_loss (with labels, b of them)."""
    labels = jnp.asarray(labels)
    return {
        "clip": (lambda q, k, s, t: flatmem_jax.clip_loss(q, k[:q.shape[0]], s, comm=comm,
                                                          precision=precision), (0, 1, 2)),
        "infonce": (lambda q, k, s, t: flatmem_jax.infonce_loss(q, k, s, labels, comm=comm,
                                                                 precision=precision), (0, 1, 2)),
        "sigmoid": (lambda q, k, s, t: flatmem_jax.sigmoid_loss(q, k, s, t, labels, comm=comm,
                                                                 recompute=recompute,
                                                                 precision=precision),
                    (0, 1, 2, 3)),
    }


def operands(dtype=jnp.float32):
    """q (6, 5), k (8, 5), s, t."""
    return unit_rows(1, 6, 5, dtype), unit_rows(2, 8, 5, dtype), jnp.float32(9.0), jnp.float32(-2.0)


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_bad_values_are_refused_naming_the_argument_and_the_choices(bad):
    q, k, s, t = operands()
    calls = [lambda: flatmem_jax.clip_loss(q, k[:6], s, precision=bad),
             lambda: flatmem_jax.infonce_loss(q, k, s, precision=bad),
             lambda: flatmem_jax.sigmoid_loss(q, k, s, t, precision=bad),
             lambda: flatmem_jax.sigmoid_loss(q, k, s, t, recompute=True, precision=bad),
             lambda: jax.jit(lambda q: flatmem_jax.clip_loss(q, q, s, precision=bad))(q),
             lambda: jax.grad(lambda q: flatmem_jax.infonce_loss(q, k, s, precision=bad))(q)]
    # the ring losses check it too (before anything touches the communicator)
    comm = fake_comm(12345)
    calls += [lambda f=f: f(q, k, s, t) for f, _ in losses(bad, comm).values()]
    for call in calls:
        with pytest.raises(ValueError, match="precision: ") as info:
            call()
        assert ALLOWED in str(info.value) and repr(bad) in str(info.value), str(info.value)


def lowered(f, argnums, platform, *args):
    grad = jax.value_and_grad(f, argnums=argnums)
    return jax.jit(grad).trace(*args).lower(lowering_platforms=(platform,)).as_text()


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
@pytest.mark.parametrize("ring", [False, True], ids=["single", "ring"])
@pytest.mark.parametrize("name", PRECISIONS)
def test_every_custom_call_carries_the_precision(name, ring, platform):
    if platform == "cuda" and not flatmem_jax.has_cuda:
        pytest.skip("libflatmem_jax.so built without nvcc")
    comm = fake_comm(3) if ring else None
    seen = set()
    for recompute in (False, True):
        for loss, (f, argnums) in losses(name, comm, recompute).items():
            text = lowered(f, argnums, platform, *operands())
            calls = re.findall(r"custom_call @(flatmem_\w+)\((.*)", text)
            assert calls, text
            for target, call in calls:
                assert f"fp32_precision = {PRECISIONS[name]} : i64" in call, (target, call)
                assert ("comm = 3 : i64" in call) == ring, call
                seen.add(target)
    prefix = "flatmem_ring_" if ring else "flatmem_"
    assert seen == {prefix + n for n in ("clip_forward", "clip_backward", "infonce_forward",
                                         "infonce_backward", "sigmoid_value_and_grad",
                                         "sigmoid_forward", "sigmoid_backward")}, seen


def run(f, *args):
    return jax.block_until_ready(f(*args))


def test_a_value_flatmem_refuses_reaches_flatmem_contrastive_create():
    """Every handler hands its attribute to options.fp32_precision of the
    handle it creates: 7 (past the Python check) is flatmem's
    INVALID_ARGUMENT, from the forward, the backward and each sigmoid call."""
    q, k, s, t = operands()
    site = flatmem_jax._Site((0, None, 7))
    b = q.shape[0]
    lse, g = jnp.zeros((b,), jnp.float32), jnp.float32(1.0)
    calls = {
        "clip_forward": lambda: flatmem_jax._forward(flatmem_jax._SYMMETRIC, site, q, k[:b], s, None),
        "clip_backward": lambda: flatmem_jax._backward(flatmem_jax._SYMMETRIC, site, q, k[:b], s, None,
                                                       lse, lse, g),
        "infonce_forward": lambda: flatmem_jax._forward(flatmem_jax._INFONCE, site, q, k, s, None),
        "infonce_backward": lambda: flatmem_jax._backward(flatmem_jax._INFONCE, site, q, k, s, None,
                                                          lse, None, g),
    }
    for stage in ("forward", "value_and_grad", "backward"):
        calls["sigmoid_" + stage] = (
            lambda stage=stage: flatmem_jax._sigmoid_call(site, stage, q, k, s, t, None, g))
    for name, call in calls.items():
        with pytest.raises(RUNTIME) as info:
            run(call)
        message = str(info.value)
        assert "flatmem_contrastive_create: FLATMEM_STATUS_INVALID_ARGUMENT" in message, (name, message)
        assert "options.fp32_precision: 7" in message, (name, message)


def test_each_precision_has_pooled_handles_of_its_own():
    """The pool keys handles by precision too: the first call of a precision
    makes a handle (created with that options.fp32_precision), a precision
    seen before reuses its handle. A budget no other test uses keeps these
    calls' handles apart from the rest of the process's."""
    q, k, s, _ = operands()
    budget = 4 * 6 * 6 + 12345

    def call(name):
        jax.block_until_ready(flatmem_jax.clip_loss(q, k[:6], s, logit_cache_bytes=budget,
                                                    precision=name))
        return flatmem_jax._pool_stats()[0]

    jax.block_until_ready(flatmem_jax.clip_loss(q, k[:6], s))  # the workspace query's handle
    before = flatmem_jax._pool_stats()[0]
    made = [call(name) - before for name in ("tf32", "tf32", "full", "default", "full", "tf32")]
    assert made == [1, 1, 2, 3, 3, 3], made


#: flatmem_cpu_isa's first level with bf16 tile products (FLATMEM_CPU_ISA_AVX512BF16);
#: every level above it (amx, 5) has them too.
AVX512BF16 = 4


def cpu_isa():
    """flatmem's CPU instruction set in use (flatmem_cpu_isa: 1 baseline, 2
    avx2, 3 avx512, 4 avx512bf16, 5 amx), from the libflatmem libflatmem_jax
    loaded."""
    in_use = ctypes.c_int(0)
    assert flatmem_jax._lib.flatmem_cpu_isa_get(ctypes.byref(in_use), None) == 0
    return in_use.value


def no_cpu_effect(dtype):
    """True where precision changes nothing on the CPU: fp32 and fp16 inputs,
    and bf16 below avx512bf16 (at avx512bf16 and amx the bf16 tile products
    see the precision; a FLATMEM_BF16_EMULATED library, as
    FLATMEM_TEST_EMULATE_BF16=1 says, runs the bf16 kernels at every level)."""
    if np.dtype(dtype) != np.dtype(jnp.bfloat16):
        return True
    return cpu_isa() < AVX512BF16 and os.environ.get("FLATMEM_TEST_EMULATE_BF16") != "1"


def as_bytes(tree):
    return [np.asarray(x).tobytes() for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: jnp.dtype(t).name)
def test_same_bits_as_the_default_where_it_has_no_cpu_effect(dtype):
    if not no_cpu_effect(dtype):
        pytest.skip("bf16 at avx512bf16 or amx: the precisions differ (test_tf32_on_bf16_* bounds them)")
    b, c = 13, 17
    q, k = unit_rows(11, b, 37, dtype), unit_rows(12, c, 37, dtype)
    s, t = jnp.float32(12.0), jnp.float32(-2.0)
    labels = tuple(int(i) * 5 % c for i in range(b))

    def results(name, recompute):
        return [jax.jit(jax.value_and_grad(f, argnums=argnums))(q, k, s, t)
                for f, argnums in losses(name, None, recompute, labels).values()]

    for recompute in (False, True):
        default = as_bytes(results("default", recompute))
        for name in ("tf32", "full"):
            assert as_bytes(results(name, recompute)) == default, (name, recompute)


def _tf32_extra(s, w, ka, qa, g):
    """flatmem.h's extra error of "tf32" on the bf16 path (G rounded once to
    bf16): 2^-8 s |g| sum_j W_ij |k_jt| for dq, 2^-8 s |g| sum_i W_ij |q_it|
    for dk, W >= |G| / |g|."""
    return (SLACK * 2.0**-8 * s * abs(g) * (w @ ka), SLACK * 2.0**-8 * s * abs(g) * (w.T @ qa))


def _assert_within(name, got, want, tau):
    err = np.abs(widened(got) - want)
    worst = np.unravel_index(np.argmax(err / tau), err.shape)
    assert np.all(err <= tau), (f"{name}: worst at {worst}: got {widened(got)[worst]!r}, "
                                f"reference {want[worst]!r}, bound {tau[worst]:.3g}")


@pytest.mark.parametrize("symmetric", [True, False], ids=["clip", "infonce"])
def test_tf32_on_bf16_stays_within_the_bf16_gradient_bound(symmetric):
    """At this process's level (avx512bf16 or amx where the CPU has it: G
    rounded once to bf16) the loss keeps its fp32 bound and dq, dk stay
    within the default bound plus 2^-8 s |G| |k| (|G|^T |q|); ds is formed
    from the fp32 G."""
    b, c, d, g = 70, (70 if symmetric else 83), 96, 0.5
    q, k = unit_rows(21, b, d, jnp.bfloat16), unit_rows(22, c, d, jnp.bfloat16)
    labels = None if symmetric else np.random.default_rng(3).permutation(c)[:b].astype(np.int64)
    s = jnp.float32(12.0)
    if symmetric:
        f = lambda q, k, s: g * flatmem_jax.clip_loss(q, k, s, precision="tf32")
    else:
        f = lambda q, k, s: g * flatmem_jax.infonce_loss(q, k, s, jnp.asarray(labels), precision="tf32")
    loss, (dq, dk, ds) = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, s)
    check_loss(loss / g, q, k, s, labels, symmetric)
    check_scale_grad(ds, q, k, s, labels, symmetric, g)
    q64, k64, s64 = widened(q), widened(k), fp32(s)
    _, ref_dq, ref_dk, _, _, _ = contrastive_reference(q64, k64, s64, labels, symmetric)
    tau_dq, tau_dk, _ = gradient_tolerances(q64, k64, s64, labels, symmetric, g, np.dtype(jnp.bfloat16))
    x = s64 * q64 @ k64.T
    P = np.exp(x - x.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    if symmetric:  # |G| <= (P + Q + 2 I) / (2 b)
        Q = np.exp(x - x.max(axis=0, keepdims=True))
        Q /= Q.sum(axis=0, keepdims=True)
        w = (P + Q + 2 * np.eye(b)) / (2 * b)
    else:  # |G| <= (P + positives) / b
        pos = np.zeros_like(P)
        pos[np.arange(b), labels] = 1
        w = (P + pos) / b
    extra_dq, extra_dk = _tf32_extra(s64, w, np.abs(k64), np.abs(q64), g)
    assert dq.dtype == jnp.bfloat16 and dk.dtype == jnp.bfloat16
    _assert_within("dq", dq, g * ref_dq, tau_dq + extra_dq)
    _assert_within("dk", dk, g * ref_dk, tau_dk + extra_dk)


@pytest.mark.parametrize("recompute", [False, True], ids=["saved", "recompute"])
def test_tf32_sigmoid_on_bf16_stays_within_the_bf16_gradient_bound(recompute):
    b, c, d, g = 50, 61, 72, 0.5
    q, k = unit_rows(31, b, d, jnp.bfloat16), unit_rows(32, c, d, jnp.bfloat16)
    s, t = jnp.float32(12.0), jnp.float32(-2.0)
    f = lambda q, k, s, t: g * flatmem_jax.sigmoid_loss(q, k, s, t, recompute=recompute,
                                                         precision="tf32")
    loss, (dq, dk, ds, dt) = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2, 3)))(q, k, s, t)
    q64, k64, s64, t64 = widened(q), widened(k), fp32(s), fp32(t)
    want = sigmoid_reference(q64, k64, s64, t64)
    tau = sigmoid_tolerances(q64, k64, s64, t64, None, np.dtype(jnp.bfloat16))
    assert abs(float(loss) / g - want[0]) <= tau[0], (float(loss) / g, want[0], tau[0])
    extra_dq, extra_dk = _tf32_extra(s64, np.abs(want[5]), np.abs(k64), np.abs(q64), g)
    for name, got, ref, bound, extra in (("dq", dq, want[1], tau[1], extra_dq),
                                         ("dk", dk, want[2], tau[2], extra_dk)):
        assert got.dtype == jnp.bfloat16
        _assert_within(name, got, g * ref,
                       scaled_tolerance(bound, ref, g, np.dtype(jnp.bfloat16)) + extra)
    for name, got, ref, bound in (("ds", ds, want[3], tau[3]), ("dt", dt, want[4], tau[4])):
        bound = scaled_tolerance(bound, ref, g)
        assert abs(float(got) - g * ref) <= bound, (name, float(got), g * ref, bound)
