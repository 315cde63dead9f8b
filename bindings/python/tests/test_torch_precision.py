"""flatmem.torch's precision option (options.fp32_precision): checked by name
in the losses and the open_clip modules, passed through the operators to the
kept handle, no effect where the CPU has none (below avx512bf16, whose bf16
path amx shares; fp32 inputs everywhere), and "tf32" on bf16 inputs within
the bf16-gradient bound."""
import os
import numpy as np
import pytest
import torch

import flatmem
import flatmem.torch as fmt
import torch_reference as ref
from flatmem import capi
from python_reference import SLACK, forward_tolerance, gradient_tolerances
from test_torch_losses import bound_dtype, check_close, leaves, unit_rows

ALLOWED = "is not one of 'default', 'round_once' ('tf32'), 'full'"


@pytest.fixture(autouse=True)
def back_to_default_isa():
    flatmem.set_cpu_isa(None)
    yield
    flatmem.set_cpu_isa(None)


@pytest.mark.parametrize("bad", ["TF32", "half", "", 1, None], ids=repr)
def test_bad_values_are_refused_naming_the_argument_and_the_choices(bad):
    q, k = unit_rows(1, 5, 4), unit_rows(2, 5, 4)
    calls = [lambda: fmt.clip_loss(q, k, 10.0, precision=bad),
             lambda: fmt.infonce_loss(q, k, 10.0, precision=bad),
             lambda: fmt.sigmoid_loss(q, k, 10.0, -1.0, precision=bad),
             lambda: fmt.ClipLoss(precision=bad),
             lambda: fmt.SigLipLoss(precision=bad)]
    for call in calls:
        with pytest.raises(ValueError, match="precision: ") as info:
            call()
        assert ALLOWED in str(info.value)


def test_the_operators_create_handles_with_that_precision(monkeypatch):
    seen = []
    real = capi.Contrastive

    def spy(options, comm):
        seen.append((options.loss, options.fp32_precision))
        return real(options, comm)

    monkeypatch.setattr(capi, "Contrastive", spy)
    q, k = leaves(unit_rows(3, 6, 5), unit_rows(4, 6, 5))[:2]
    with torch.no_grad():
        # a thread count no other test keeps handles for: every call below creates its own
        old = torch.get_num_threads()
        torch.set_num_threads(3)
        try:
            fmt.clip_loss(q, k, 10.0, precision="tf32")
            fmt.infonce_loss(q, k, 10.0, precision="full")
            fmt.sigmoid_loss(q, k, 10.0, -1.0, precision="tf32")
            fmt.SigLipLoss(precision="full")(q, k, 10.0, -1.0)
            fmt.ClipLoss(precision="full")(q, k, 10.0)
        finally:
            torch.set_num_threads(old)
    assert seen == [(capi.CONTRASTIVE_SYMMETRIC, capi.FP32_PRECISION_TF32),
                    (capi.CONTRASTIVE_INFONCE, capi.FP32_PRECISION_FULL),
                    (capi.CONTRASTIVE_SIGMOID, capi.FP32_PRECISION_TF32),
                    (capi.CONTRASTIVE_SIGMOID, capi.FP32_PRECISION_FULL),
                    (capi.CONTRASTIVE_SYMMETRIC, capi.FP32_PRECISION_FULL)]


def _run(loss_fn, q, k, *scalars, **kw):
    leaves_ = leaves(q, k, *scalars)
    loss = loss_fn(*leaves_, **kw)
    (0.5 * loss).backward()
    return [loss.detach()] + [x.grad for x in leaves_]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_cpu_effect_below_avx512bf16(dtype):
    if dtype == torch.bfloat16 and os.environ.get("FLATMEM_TEST_EMULATE_BF16") == "1":
        pytest.skip("a FLATMEM_BF16_EMULATED library runs the bf16 kernels at every ISA level")
    q, k = unit_rows(5, 19, 33, dtype), unit_rows(6, 19, 33, dtype)
    flatmem.set_cpu_isa("baseline")
    for name in ("tf32", "full"):
        for fn, scalars in ((fmt.clip_loss, (10.0,)), (fmt.infonce_loss, (10.0,)), (fmt.sigmoid_loss, (10.0, -2.0))):
            a, b = _run(fn, q, k, *scalars, precision=name), _run(fn, q, k, *scalars)
            for x, y in zip(a, b):
                assert torch.equal(x, y), fn.__name__


def test_tf32_clip_on_bf16_stays_within_the_bf16_gradient_bound():
    """At the process's own level (G rounded once to bf16 at avx512bf16 and amx)."""
    b, d, s = 64, 80, 12.0
    q, k = unit_rows(7, b, d, torch.bfloat16), unit_rows(8, b, d, torch.bfloat16)
    loss, dq, dk, ds = _run(fmt.clip_loss, q, k, s, precision="tf32")
    want = ref.clip(q, k, s)
    q64, k64 = ref.widened(q), ref.widened(k)
    check_close("loss", loss, want[0], forward_tolerance(q64, k64, np.float32(s), want[0]))
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q64, k64, np.float32(s), None, True, 0.5, bound_dtype(torch.bfloat16))
    x = s * q64 @ k64.T
    P = np.exp(x - x.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    Q = np.exp(x - x.max(axis=0, keepdims=True))
    Q /= Q.sum(axis=0, keepdims=True)
    W = 0.5 * (P + Q + 2 * np.eye(b)) / (2 * b)  # >= |G| for the upstream gradient 0.5
    extra_dq = SLACK * 2.0**-8 * s * (W @ np.abs(k64))
    extra_dk = SLACK * 2.0**-8 * s * (W.T @ np.abs(q64))
    check_close("dq", dq, 0.5 * want[1], tau_dq + extra_dq)
    check_close("dk", dk, 0.5 * want[2], tau_dk + extra_dk)
    check_close("ds", ds, 0.5 * want[3], tau_ds)
