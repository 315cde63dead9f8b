"""flatmem.torch.ClipLoss / SigLipLoss as drop-ins for open_clip's (open-clip-torch from PyPI):
the same call signature and return forms, and the same loss and gradients on the same fp32
inputs. open_clip materialises the logits in fp32, flatmem tiles them in fp32: both are within
their error bounds of the exact value, so they agree within the sum of the two. flatmem's bound
is python_reference's; open_clip's (a fp32 GEMM of the same d, fp32 softmax / log-sigmoid over
b terms) is of the same form, so twice flatmem's bound covers both."""
import inspect

import numpy as np
import open_clip.loss as oc
import pytest
import torch

import flatmem.torch as fmt
import torch_reference as ref
from python_reference import forward_tolerance, gradient_tolerances
from python_sigmoid_reference import sigmoid_tolerances
from test_torch_losses import check_close, unit_rows


def run(loss_fn, q, k, *scalars, output_dict=False):
    leaves = [q.clone().requires_grad_(), k.clone().requires_grad_()]
    leaves += [torch.tensor(v, requires_grad=True) for v in scalars]
    out = loss_fn(*leaves, output_dict=output_dict)
    loss = out["contrastive_loss"] if output_dict else out
    loss.backward()
    return loss.detach(), [x.grad for x in leaves]


def test_the_signatures_are_open_clips():
    for ours, theirs in ((fmt.ClipLoss, oc.ClipLoss), (fmt.SigLipLoss, oc.SigLipLoss)):
        for method in ("__init__", "forward"):
            a = inspect.signature(getattr(ours, method)).parameters
            b = inspect.signature(getattr(theirs, method)).parameters
            assert list(b) == [name for name in a if a[name].kind != inspect.Parameter.KEYWORD_ONLY]
            for name in b:
                assert a[name].default == b[name].default, (ours.__name__, method, name)


@pytest.mark.parametrize("b,d", [(1, 3), (53, 64), (257, 96)])
@pytest.mark.parametrize("output_dict", [False, True])
def test_clip_loss_equals_open_clips(b, d, output_dict):
    q, k = unit_rows(b, b, d), unit_rows(7 + b, b, d)
    s = 14.3
    ours = run(fmt.ClipLoss(), q, k, s, output_dict=output_dict)
    theirs = run(oc.ClipLoss(), q, k, s, output_dict=output_dict)
    q64, k64 = ref.widened(q), ref.widened(k)
    want = ref.clip(q, k, s)
    tau_dq, tau_dk, tau_ds = gradient_tolerances(q64, k64, np.float32(s))
    check_close("loss", ours[0], theirs[0].double().numpy(), 2 * forward_tolerance(q64, k64, s, want[0]))
    for name, a, b_, tau in (("dq", ours[1][0], theirs[1][0], tau_dq), ("dk", ours[1][1], theirs[1][1], tau_dk),
                             ("ds", ours[1][2], theirs[1][2], tau_ds)):
        check_close(name, a, b_.double().numpy(), 2 * tau)


@pytest.mark.parametrize("b,d", [(1, 3), (53, 64), (257, 96)])
def test_sigmoid_loss_equals_open_clips(b, d):
    q, k = unit_rows(b, b, d), unit_rows(11 + b, b, d)
    ours = run(fmt.SigLipLoss(), q, k, 10.0, -10.0)
    theirs = run(oc.SigLipLoss(), q, k, 10.0, -10.0)
    tau = sigmoid_tolerances(ref.widened(q), ref.widened(k), np.float32(10.0), np.float32(-10.0))
    check_close("loss", ours[0], theirs[0].double().numpy(), 2 * tau["loss"])
    for name, a, b_ in zip(("dq", "dk", "ds", "dt"), ours[1], theirs[1]):
        check_close(name, a, b_.double().numpy(), 2 * tau[name])


def test_a_logit_bias_given_to_clip_loss_changes_nothing():
    q, k = unit_rows(1, 40, 8), unit_rows(2, 40, 8)
    bias = torch.tensor(-3.0, requires_grad=True)
    a = fmt.ClipLoss()(q, k, 10.0)
    b = fmt.ClipLoss()(q, k, 10.0, bias)
    theirs = oc.ClipLoss()(q, k, 10.0, bias)
    assert torch.equal(a, b)
    check_close("loss with bias", a, theirs.double().detach().numpy(),
                2 * forward_tolerance(ref.widened(q), ref.widened(k), 10.0, float(a)) + 1e-6)
    b.backward()
    assert bias.grad is not None and bias.grad.item() == 0.0  # a gradient, exactly 0, as open_clip's


def test_horovod_and_a_wrong_world_size_are_refused():
    with pytest.raises(ValueError, match="use_horovod"):
        fmt.ClipLoss(use_horovod=True)
    import flatmem

    comms = flatmem.Communicator.create_local(1)
    with pytest.raises(ValueError, match="world_size=2"):
        fmt.ClipLoss(world_size=2, comm=comms[0])(unit_rows(1, 4, 3), unit_rows(2, 4, 3), 10.0)
    comms[0].close()
