"""Features of two different dtypes (a bf16 image tower next to an fp32 text tower) are promoted as
torch promotes them (torch.promote_types: what open_clip computes such a pair in), each gradient
comes back in its own input's dtype, equal dtypes reach the operator as they are (no copy), and
dtypes flatmem does not take reach the library, whose message names the argument."""
import pytest
import torch

import flatmem
import flatmem.torch as fmt
from test_torch_losses import unit_rows

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
B, C, D = 23, 29, 10

LOSSES = {
    "clip": (lambda q, k, s, t: fmt.clip_loss(q, k, s), B),
    "infonce": (lambda q, k, s, t: fmt.infonce_loss(q, k, s, (torch.arange(B) * 5) % C), C),
    "sigmoid": (lambda q, k, s, t: fmt.sigmoid_loss(q, k, s, t), C),
    "sigmoid-recompute": (lambda q, k, s, t: fmt.sigmoid_loss(q, k, s, t, recompute=True), C),
    "ClipLoss": (lambda q, k, s, t: fmt.ClipLoss()(q, k, s), B),
    "SigLipLoss": (lambda q, k, s, t: fmt.SigLipLoss()(q, k, s, t), C),
}
# (q's dtype, k's dtype) -> the dtype torch promotes the pair to
PAIRS = {(BF16, F32): F32, (F32, BF16): F32, (F16, BF16): F32, (BF16, F16): F32, (F16, F32): F32,
         (F32, F16): F32}


def _leaves(q, k):
    return (q.clone().requires_grad_(), k.clone().requires_grad_(), torch.tensor(9.0, requires_grad=True),
            torch.tensor(-3.0, requires_grad=True))


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("q_dtype,k_dtype", PAIRS)
def test_mixed_dtypes_give_the_results_of_the_promoted_inputs_bitwise(name, q_dtype, k_dtype):
    fn, c = LOSSES[name]
    common = torch.promote_types(q_dtype, k_dtype)
    assert common == PAIRS[q_dtype, k_dtype]
    q, k, s, t = _leaves(unit_rows(1, B, D, q_dtype), unit_rows(2, c, D, k_dtype))
    loss = fn(q, k, s, t)
    loss.backward()
    # The reference: both converted beforehand (exact: every bf16 / fp16 value is an fp32 one),
    # so the library sees the same numbers and gives the same bits.
    q2, k2, s2, t2 = _leaves(q.detach().to(common), k.detach().to(common))
    want = fn(q2, k2, s2, t2)
    want.backward()
    assert loss.dtype == F32 and torch.equal(loss, want)
    assert q.grad.dtype == q_dtype and k.grad.dtype == k_dtype  # each in its input's dtype
    assert torch.equal(q.grad, q2.grad.to(q_dtype)) and torch.equal(k.grad, k2.grad.to(k_dtype))
    assert torch.equal(s.grad, s2.grad)
    if t2.grad is not None:
        assert torch.equal(t.grad, t2.grad)


def _spy_on_the_operators(monkeypatch):
    """The (q, k) each flatmem forward operator is called with, as a list the calls append to."""
    seen = []
    for op in ("contrastive_forward", "sigmoid_forward", "sigmoid_value_and_grad"):
        original = getattr(torch.ops.flatmem, op)

        def spy(*args, _original=original, _op=op):
            seen.append((_op, args[0], args[1]))
            return _original(*args)

        monkeypatch.setattr(torch.ops.flatmem, op, spy)
    return seen


def _every_loss(q, k):
    y = torch.arange(q.shape[0]) % k.shape[0]
    fmt.clip_loss(q, k, 10.0)
    fmt.infonce_loss(q, k, 10.0, y)
    fmt.sigmoid_loss(q, k, 10.0, -1.0)
    fmt.sigmoid_loss(q, k, 10.0, -1.0, recompute=True)


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_equal_dtypes_reach_the_operator_as_they_are(monkeypatch, dtype, requires_grad):
    seen = _spy_on_the_operators(monkeypatch)
    q = unit_rows(3, B, D, dtype).requires_grad_(requires_grad)
    k = unit_rows(4, B, D, dtype).requires_grad_(requires_grad)
    _every_loss(q, k)
    assert {op for op, _, _ in seen} == ({"contrastive_forward", "sigmoid_forward", "sigmoid_value_and_grad"}
                                         if requires_grad else {"contrastive_forward", "sigmoid_forward"})
    assert len(seen) == 4
    for _, got_q, got_k in seen:
        assert got_q is q and got_k is k  # the same tensors: no copy, no cast


def test_of_a_mixed_pair_only_the_narrower_one_is_converted(monkeypatch):
    seen = _spy_on_the_operators(monkeypatch)
    q, k = unit_rows(5, B, D, BF16), unit_rows(6, B, D, F32)
    _every_loss(q, k)
    _every_loss(k, q)
    assert len(seen) == 8
    for i, (_, got_q, got_k) in enumerate(seen):
        wide, narrow = (got_k, got_q) if i < 4 else (got_q, got_k)
        assert wide is k  # the fp32 one as it is
        assert narrow.dtype == F32 and torch.equal(narrow, q.to(F32))
    seen.clear()
    _every_loss(unit_rows(7, B, D, F16), unit_rows(8, B, D, BF16))
    assert all(a.dtype == F32 and b.dtype == F32 for _, a, b in seen)


def test_dtypes_flatmem_does_not_take_are_not_converted_and_the_library_names_them_and_the_argument():
    # The library's message spells the dtype as torch does (not DLPack's code / bits / lanes).
    q, k = unit_rows(9, B, D), unit_rows(10, B, D)
    expected = "is not accepted here; expected float32 or bfloat16 or float16"
    for bad, name in ((q.to(torch.float64), "float64"), ((q * 100).to(torch.int32), "int32"),
                      ((q * 100).to(torch.int64), "int64"), ((q * 100).to(torch.uint8), "uint8")):
        with pytest.raises(flatmem.InvalidArgumentError, match=f"q: dtype {name} {expected}"):
            fmt.clip_loss(bad, k, 10.0)
        with pytest.raises(flatmem.InvalidArgumentError, match=f"k: dtype {name} {expected}"):
            fmt.sigmoid_loss(k, bad, 10.0, -1.0)
    with pytest.raises(flatmem.InvalidArgumentError, match=f"q: dtype float64 {expected}"):
        fmt.infonce_loss(q.to(torch.float64), k.to(torch.float64), 10.0)
    with pytest.raises(flatmem.InvalidArgumentError, match=f"q: dtype float64 {expected}"):
        fmt.ClipLoss()(q.to(torch.float64), k.to(torch.float64), 10.0)


@pytest.mark.parametrize("name", ["clip", "sigmoid"])
def test_a_mixed_pair_compiles_without_graph_breaks(name):
    fn, c = LOSSES[name]
    torch._dynamo.reset()
    step = torch.compile(fn, fullgraph=True, backend="aot_eager")
    out = []
    for run in (fn, step):
        q, k, s, t = _leaves(unit_rows(11, B, D, BF16), unit_rows(12, c, D, F32))
        loss = run(q, k, s, t)
        loss.backward()
        out.append((loss, q.grad, k.grad, s.grad))
    for a, b in zip(*out):
        assert a.dtype == b.dtype and torch.equal(a, b)
