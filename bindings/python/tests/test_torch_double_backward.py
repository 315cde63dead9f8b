"""flatmem.torch's gradients are first order: under create_graph=True they are the ordinary ones,
a second backward THROUGH them raises a RuntimeError naming flatmem and "double backward" (rather
than the silent zeros of a backward operator torch cannot differentiate), and a second backward
that does not pass through them (a gradient penalty on another term) works."""
import pytest
import torch

import flatmem.torch as fmt
from flatmem.torch import _bridge
from test_torch_losses import unit_rows

B, C, D = 11, 13, 6


def _inputs(seed=0, c=B):
    q = unit_rows(seed + 1, B, D).requires_grad_()
    k = unit_rows(seed + 2, c, D).requires_grad_()
    s = torch.tensor(8.0, requires_grad=True)
    t = torch.tensor(-4.0, requires_grad=True)
    return q, k, s, t


# name -> (loss of (q, k, s, t), columns, the operator the error names)
LOSSES = {
    "clip_loss": (lambda q, k, s, t: fmt.clip_loss(q, k, s), B, "flatmem::contrastive_forward"),
    "infonce_loss": (lambda q, k, s, t: fmt.infonce_loss(q, k, s, torch.arange(B) % C), C,
                     "flatmem::contrastive_forward"),
    "sigmoid_loss": (lambda q, k, s, t: fmt.sigmoid_loss(q, k, s, t), C, "flatmem::sigmoid_value_and_grad"),
    "sigmoid_loss-recompute": (lambda q, k, s, t: fmt.sigmoid_loss(q, k, s, t, recompute=True), C,
                               "flatmem::sigmoid_forward"),
    "ClipLoss": (lambda q, k, s, t: fmt.ClipLoss()(q, k, s), B, "flatmem::contrastive_forward"),
    "SigLipLoss": (lambda q, k, s, t: fmt.SigLipLoss()(q, k, s, t), C, "flatmem::sigmoid_value_and_grad"),
    "SigLipLoss-recompute": (lambda q, k, s, t: fmt.SigLipLoss(recompute=True)(q, k, s, t), C,
                             "flatmem::sigmoid_forward"),
}


SOFTMAX = ("clip_loss", "infonce_loss", "ClipLoss")


def _differentiated(name, q, k, s, t):
    """The inputs whose gradients the loss has (the softmax losses ignore t)."""
    return (q, k, s) if name in SOFTMAX else (q, k, s, t)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("g", [1.0, 2.5])  # 1: the sigmoid path hands its saved dq on as it is
def test_first_order_gradients_under_create_graph_are_the_ordinary_ones(name, g):
    fn, c, _ = LOSSES[name]
    plain = _inputs(c=c)
    wrt = _differentiated(name, *plain)
    want = torch.autograd.grad(g * fn(*plain), wrt)
    graphed = _inputs(c=c)
    got = torch.autograd.grad(g * fn(*graphed), _differentiated(name, *graphed), create_graph=True)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.detach(), b)
        assert a.requires_grad  # part of a graph, as create_graph=True asks; its backward raises


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")  # the .grad cycle: dropped below
@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("g", [1.0, 2.5])
def test_a_second_backward_through_the_gradients_raises(name, g):
    fn, c, op = LOSSES[name]
    q, k, s, t = inputs = _inputs(c=c)
    wrt = _differentiated(name, *inputs)
    grads = torch.autograd.grad(g * fn(*inputs), wrt, create_graph=True)
    # Each gradient, differentiated w.r.t. its own input and w.r.t. another one (a cross term).
    for i, (grad, leaf) in enumerate(zip(grads, wrt)):
        for other in (leaf, wrt[(i + 1) % len(wrt)]):
            with pytest.raises(RuntimeError, match="double backward") as info:
                torch.autograd.grad(grad.square().sum(), other)
            message = str(info.value)
            assert message.startswith("flatmem.torch: ") and op in message
    # loss.backward(create_graph=True), then a backward of a function of q.grad: the same.
    loss = fn(*inputs)
    loss.backward(create_graph=True)
    with pytest.raises(RuntimeError, match=r"flatmem.*double backward"):
        q.grad.square().sum().backward()
    for x in inputs:
        x.grad = None


def test_the_saved_sigmoid_gradients_pass_no_second_order_term_silently():
    # sigmoid_value_and_grad's backward multiplies the dq, dk, ds, dt its forward saved; under
    # create_graph those are the node's own outputs, so a second backward through them would
    # reach the node as output gradients it ignores: part of the truth, silently. It raises.
    q, k, s, t = _inputs(c=C)
    loss = fmt.sigmoid_loss(q, k, s, t)
    assert "flatmem_sigmoid_value_and_grad" in loss.grad_fn.name()
    dq, ds = torch.autograd.grad(loss * 3.0, (q, s), create_graph=True)
    for out, wrt in ((dq.sum(), q), (dq.sum(), k), (dq.sum(), s), (ds, s), (ds, t)):
        with pytest.raises(RuntimeError, match="flatmem::sigmoid_value_and_grad is differentiable once"):
            torch.autograd.grad(out, wrt)
    # The same through a layer in front of the loss (the penalty of a parameter's gradient).
    w = torch.eye(D, requires_grad=True)
    dw, = torch.autograd.grad(fmt.sigmoid_loss(q @ w, k, s, t), w, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(dw.square().sum(), w)


@pytest.mark.parametrize("name", LOSSES)
def test_a_second_backward_that_does_not_pass_through_flatmem_works(name):
    fn, c, _ = LOSSES[name]
    q, k, s, t = inputs = _inputs(c=c)
    plain = _inputs(c=c)
    want_dq, = torch.autograd.grad(fn(*plain), plain[0])

    # 1. A gradient penalty on a critic (WGAN-GP style) added to the flatmem loss: the penalty's
    #    own create_graph backward never meets flatmem, and total.backward() is first order.
    g = torch.Generator().manual_seed(5)
    w = torch.randn(D, 3, generator=g).requires_grad_()
    y = torch.randn(7, D, generator=g).requires_grad_()
    gy, = torch.autograd.grad(torch.tanh(y @ w).sum(), y, create_graph=True)
    penalty = gy.square().sum()
    (fn(*inputs) + penalty).backward()
    assert torch.equal(q.grad, want_dq)
    want_dw, = torch.autograd.grad(torch.autograd.grad(torch.tanh(y @ w).sum(), y, create_graph=True)[0]
                                   .square().sum(), w)
    torch.testing.assert_close(w.grad, want_dw, rtol=0, atol=0)

    # 2. One create_graph backward of (flatmem loss + another term) for both; the second backward
    #    differentiates only the other term's gradient: d/dx of d(x^3)/dx = 6x.
    q2, k2, s2, t2 = _inputs(c=c)
    x = torch.linspace(-1.0, 1.0, 5, requires_grad=True)
    gq, gx = torch.autograd.grad(fn(q2, k2, s2, t2) + (x ** 3).sum(), (q2, x), create_graph=True)
    assert torch.equal(gq.detach(), want_dq)
    hx, = torch.autograd.grad(gx.sum(), x)
    torch.testing.assert_close(hx, 6.0 * x.detach())


def test_first_order_only_costs_nothing_outside_create_graph():
    a, b = torch.randn(3, 2, requires_grad=True), torch.randn(())
    with torch.no_grad():  # how a plain loss.backward() runs its formulas
        out = _bridge.first_order_only("flatmem::x", a, None, b)
    assert out[0] is a and out[1] is None and out[2] is b
    out = _bridge.first_order_only("flatmem::x", a, None, b)  # grad mode on: create_graph=True
    assert out[1] is None
    assert out[0].data_ptr() == a.data_ptr() and out[2].data_ptr() == b.data_ptr()  # aliases, no copies
    assert torch.equal(out[0], a) and torch.equal(out[2], b)
    with pytest.raises(RuntimeError, match=r"^flatmem.torch: flatmem::x is differentiable once: .*double backward"):
        out[0].sum().backward()


@pytest.mark.parametrize("loss", ["clip", "sigmoid"])
def test_a_compiled_backward_is_traced_without_the_guard(monkeypatch, loss):
    # AOTAutograd traces the backward formulas with grad mode off (no create_graph): the guard's
    # node stays out of the compiled graph, which test_torch_ops checks against eager.
    from test_torch_ops import TwoTower

    calls = []
    apply = _bridge._FirstOrderOnly.apply
    monkeypatch.setattr(_bridge._FirstOrderOnly, "apply", lambda *a: calls.append(a[0]) or apply(*a))
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(9, 12, generator=g), torch.randn(9, 10, generator=g)
    model = TwoTower(loss)
    torch.compile(model, fullgraph=True, backend="aot_eager")(x, y).backward()
    assert calls == [] and model.log_scale.grad is not None
