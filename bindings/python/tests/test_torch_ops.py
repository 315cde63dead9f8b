"""flatmem.torch's operators as torch sees them: torch.library.opcheck (schema, fake tensors,
autograd registration, AOT dispatch with dynamic shapes), and a model compiled with torch.compile
(fullgraph=True: a graph break fails) whose results equal the eager ones."""
import pytest
import torch

import flatmem.torch as fmt
from flatmem import capi
from test_torch_losses import unit_rows

PROPAGATE = capi.NONFINITE_PROPAGATE  # options.nonfinite as the operators take it


def _leaf(x):
    return x.clone().requires_grad_()


def _args(kind, dtype=torch.float32, b=13, c=13, d=7, labels=False):
    q, k = _leaf(unit_rows(1, b, d, dtype)), _leaf(unit_rows(2, c, d, dtype))
    s, t = torch.tensor(10.0, requires_grad=True), torch.tensor(-10.0, requires_grad=True)
    y = torch.arange(b) % c if labels else None
    if kind == "contrastive_forward":
        return (q, k, s, y, not labels, 0, -1, PROPAGATE, 1.0, 0)
    if kind == "contrastive_backward":
        row = torch.zeros(b)
        col = torch.zeros(c) if not labels else torch.zeros(0)
        return (q.detach(), k.detach(), s.detach(), y, row, col, torch.tensor(1.0), not labels, True, True, 0, -1,
                PROPAGATE, 1)
    if kind in ("sigmoid_forward", "sigmoid_value_and_grad"):
        return (q, k, s, t, y, -1, PROPAGATE, 1.0, 2)
    if kind == "sigmoid_backward":
        return (q.detach(), k.detach(), s.detach(), t.detach(), y, torch.tensor(1.0), True, False, -1, PROPAGATE, 0)
    raise AssertionError(kind)


OPS = ["contrastive_forward", "contrastive_backward", "sigmoid_forward", "sigmoid_value_and_grad", "sigmoid_backward"]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("labels", [False, True])
def test_opcheck(name, dtype, labels):
    op = getattr(torch.ops.flatmem, name)
    torch.library.opcheck(op, _args(name, dtype, b=13, c=17 if labels else 13, labels=labels))


class TwoTower(torch.nn.Module):
    """Two linear towers and a loss, as a CLIP model's head is."""

    def __init__(self, loss):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.image = torch.nn.Linear(12, 9)
        self.text = torch.nn.Linear(10, 9)
        for p in self.parameters():
            torch.nn.init.normal_(p, generator=g)
        self.log_scale = torch.nn.Parameter(torch.tensor(2.3))
        self.bias = torch.nn.Parameter(torch.tensor(-3.0))
        self.loss = loss

    def forward(self, x, y):
        q = torch.nn.functional.normalize(self.image(x), dim=-1)
        k = torch.nn.functional.normalize(self.text(y), dim=-1)
        if self.loss == "clip":
            return fmt.clip_loss(q, k, self.log_scale.exp())
        if self.loss == "infonce":
            return fmt.infonce_loss(q, k, self.log_scale.exp(), torch.arange(q.shape[0]))
        return fmt.sigmoid_loss(q, k, self.log_scale.exp(), self.bias)


@pytest.mark.parametrize("loss", ["clip", "infonce", "sigmoid"])
def test_a_compiled_model_gives_the_eager_results_without_graph_breaks(loss):
    torch._dynamo.reset()
    x, y = torch.randn(37, 12, generator=torch.Generator().manual_seed(1)), torch.randn(
        37, 10, generator=torch.Generator().manual_seed(2))
    eager, compiled = TwoTower(loss), TwoTower(loss)
    step = torch.compile(compiled, fullgraph=True, backend="aot_eager")
    for model, run in ((eager, eager), (compiled, step)):
        out = run(x, y)
        out.backward()
        model.result = (out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert torch.equal(eager.result[0], compiled.result[0])
    assert len(eager.result[1]) == len(compiled.result[1]) > 0
    for a, b in zip(eager.result[1], compiled.result[1]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_inductor_compiles_a_model_around_the_loss():
    torch._dynamo.reset()
    x, y = torch.randn(29, 12, generator=torch.Generator().manual_seed(3)), torch.randn(
        29, 10, generator=torch.Generator().manual_seed(4))
    eager, compiled = TwoTower("clip"), TwoTower("clip")
    step = torch.compile(compiled, fullgraph=True)
    a, b = eager(x, y), step(x, y)
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(eager.log_scale.grad, compiled.log_scale.grad, rtol=1e-4, atol=1e-6)
