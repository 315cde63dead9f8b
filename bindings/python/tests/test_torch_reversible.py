"""flatmem.torch.ReversibleSequence (nn.Modules as F and G) and ReversibleTransformer (flatmem's
built-in blocks) against plain torch autograd of the same stack; vanilla, overlapped and auto
bitwise equal; activation memory flat in depth; dropout replayed exactly in the rebuild;
exceptions from F / G coming back as themselves.

Tolerances. float64 states and modules: the rebuild x1 = y1 - F(x2) loses at most a few ulps of
|y1| per block, which the backward's Lipschitz constants (here < 4 per block, small weights)
carry through 3 blocks: 1e-10 of each gradient's largest element is far above that (2^-52 4^6 ~
1e-12) and far below any wiring error. float32 (the built-in blocks compute in fp32): products of
width <= 32 err by <= 32 * 2^-24 ~ 2e-6 relative, softmax and LayerNorm alike; 1e-4 of the largest
element bounds 3 blocks forward and backward with margin."""
import copy
import math
import weakref

import pytest
import torch

import flatmem.torch as fmt

MODES = ["vanilla", "overlapped", "auto"]


def mlp(width, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                            torch.nn.Linear(2 * width, width)).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * 0.3)
        m[0].weight += 1.0  # LayerNorm gains near 1
    return m


def plain(blocks, x1, x2):
    for f, g in blocks:
        x1 = x1 + f(x2)
        x2 = x2 + g(x1)
    return x1, x2


def objective(y1, y2):
    return (y1 * torch.linspace(-1, 1, y1.numel(), dtype=y1.dtype).reshape(y1.shape)).sum() + (y2 ** 2).sum()


def run(model, x1, x2, forward=None):
    """(dx1, dx2, [parameter grads], (y1, y2)) of objective(model(x1, x2))."""
    for p in model.parameters():
        p.grad = None
    a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    y1, y2 = (forward or model)(a, b)
    objective(y1, y2).backward()
    return a.grad, b.grad, [p.grad.clone() for p in model.parameters()], (y1.detach(), y2.detach())


def states(shape, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)


def assert_close(got, want, rel, what):
    scale = want.abs().max().item()
    err = (got.to(want.dtype) - want).abs().max().item()
    assert err <= rel * scale + 1e-300, f"{what}: off by {err:.3g} (largest {scale:.3g}, allowed {rel * scale:.3g})"


@pytest.mark.parametrize("mode", MODES + ["standard"])
@pytest.mark.parametrize("shape", [(1, 1, 6), (2, 5, 6), (3, 13, 6)])
def test_gradients_equal_torch_autograd_of_the_same_stack(mode, shape):
    width = shape[-1]
    blocks = [(mlp(width, seed=2 * k), mlp(width, seed=2 * k + 1)) for k in range(3)]
    seq = fmt.ReversibleSequence(blocks, mode=mode)
    x1, x2 = states(shape)
    got = run(seq, x1, x2)
    want = run(seq, x1, x2, forward=lambda a, b: plain(blocks, a, b))
    for name, g, w in (("y1", got[3][0], want[3][0]), ("y2", got[3][1], want[3][1]), ("dx1", got[0], want[0]),
                       ("dx2", got[1], want[1])):
        assert_close(g, w, 1e-10, name)
    assert len(got[2]) == len(want[2]) == 3 * 2 * 6
    for i, (g, w) in enumerate(zip(got[2], want[2])):
        assert_close(g, w, 1e-10, f"parameter {i}")


def test_float32_modules_and_states():
    reference = [(mlp(8, torch.float64, 10 + k), mlp(8, torch.float64, 20 + k)) for k in range(3)]
    blocks = [(copy.deepcopy(f).float(), copy.deepcopy(g).float()) for f, g in reference]
    x1, x2 = states((2, 9, 8), torch.float64, 3)
    got = run(fmt.ReversibleSequence(blocks, mode="overlapped"), x1.float(), x2.float())
    want = run(torch.nn.ModuleList(torch.nn.ModuleList(p) for p in reference), x1, x2,
               forward=lambda a, b: plain(reference, a, b))
    assert_close(got[0], want[0], 1e-4, "dx1")
    assert_close(got[1], want[1], 1e-4, "dx2")
    for i, (g, w) in enumerate(zip(got[2], want[2])):
        assert_close(g, w, 1e-4, f"parameter {i}")


def test_the_modes_give_the_same_bits():
    blocks = [(mlp(6, seed=30 + k), mlp(6, seed=40 + k)) for k in range(4)]
    x1, x2 = states((2, 7, 6))
    results = [run(fmt.ReversibleSequence(blocks, mode=mode), x1, x2) for mode in MODES]
    for other in results[1:]:
        assert torch.equal(results[0][0], other[0]) and torch.equal(results[0][1], other[1])
        for a, b in zip(results[0][2], other[2]):
            assert torch.equal(a, b)


def test_parameter_gradients_accumulate_like_any_modules():
    blocks = [(mlp(4, seed=50), mlp(4, seed=51))]
    seq = fmt.ReversibleSequence(blocks, mode="vanilla")
    x1, x2 = states((2, 3, 4))
    once = run(seq, x1, x2)[2]
    seq.zero_grad()
    for _ in range(2):  # no zeroing in between: .grad adds up
        y1, y2 = seq(x1, x2)
        objective(y1, y2).backward()
    for p, g in zip(seq.parameters(), once):
        assert_close(p.grad, 2 * g, 1e-12, "accumulated")


class Counted(torch.nn.Module):
    """An MLP that counts its live hidden activations (a graph keeps them alive)."""

    alive = 0
    peak = 0

    def __init__(self, width, seed):
        super().__init__()
        self.inner = mlp(width, seed=seed)

    def forward(self, x):
        h = self.inner[1](self.inner[0](x))
        if torch.is_grad_enabled():
            Counted.alive += 1
            Counted.peak = max(Counted.peak, Counted.alive)
            weakref.finalize(h, Counted._release)
        return self.inner[3](self.inner[2](h))

    @staticmethod
    def _release():
        Counted.alive -= 1


@pytest.mark.parametrize("mode", ["vanilla", "overlapped", "standard"])
def test_activation_memory_is_flat_in_depth(mode):
    peaks = {}
    for depth in (4, 16):
        blocks = [(Counted(6, k), Counted(6, 100 + k)) for k in range(depth)]
        seq = fmt.ReversibleSequence(blocks, mode=mode)
        Counted.alive = Counted.peak = 0
        x1, x2 = states((2, 5, 6))
        run(seq, x1, x2)
        assert Counted.alive == 0  # every graph released
        peaks[depth] = Counted.peak
    if mode == "standard":
        assert peaks[4] == 8 and peaks[16] == 32  # every block's graph kept: the baseline
    elif mode == "vanilla":
        assert peaks[4] == peaks[16] == 2  # the rebuild's graphs of block k's G and F, then its VJPs
    else:
        # the rebuild of block k-1 runs while block k's VJPs do: F and G of at most two blocks,
        # how many at once depending on the threads' timing, never on the depth
        assert max(peaks.values()) <= 4, peaks


class RecordingDropout(torch.nn.Module):
    """Dropout that logs the masks it draws; in replay mode it reuses them in order."""

    def __init__(self, p):
        super().__init__()
        self.p, self.log, self.replay = p, [], None

    def forward(self, x):
        if self.replay is not None:
            mask = self.replay.pop(0)
        else:
            mask = (torch.rand(x.shape, dtype=x.dtype) >= self.p).to(x.dtype) / (1 - self.p)
            self.log.append(mask)
        return x * mask


def test_dropout_is_replayed_exactly_in_the_rebuild():
    drops = [RecordingDropout(0.5) for _ in range(6)]
    blocks = [(torch.nn.Sequential(mlp(6, seed=60 + k), drops[2 * k]), torch.nn.Sequential(mlp(6, seed=70 + k),
                                                                                          drops[2 * k + 1]))
              for k in range(3)]
    seq = fmt.ReversibleSequence(blocks, mode="overlapped")
    x1, x2 = states((2, 5, 6))
    got = run(seq, x1, x2)
    for d in drops:
        forward_mask, rebuild_mask = d.log  # one draw in the forward, one in the rebuild
        assert torch.equal(forward_mask, rebuild_mask)
        assert 0 < forward_mask.count_nonzero() < forward_mask.numel()
    for d in drops:
        d.replay = [d.log[0]]
    want = run(seq, x1, x2, forward=lambda a, b: plain(blocks, a, b))
    assert_close(got[0], want[0], 1e-10, "dx1")
    assert_close(got[1], want[1], 1e-10, "dx2")
    # each forward of the sequence draws new masks
    first = [d.log[0] for d in drops]
    for d in drops:
        d.replay, d.log = None, []
    seq(x1, x2)
    assert any(not torch.equal(a, d.log[0]) for a, d in zip(first, drops))


class Failing(torch.nn.Module):
    def __init__(self, when):
        super().__init__()
        self.when, self.calls = when, 0
        self.lin = torch.nn.Linear(4, 4).double()

    def forward(self, x):
        self.calls += 1
        if self.calls == self.when:
            raise KeyError("the module's own error")
        return self.lin(x)


@pytest.mark.parametrize("when,where", [(1, "forward"), (2, "backward")])
def test_an_exception_in_a_module_comes_back_as_itself(when, where):
    seq = fmt.ReversibleSequence([(Failing(when), mlp(4, seed=80))], mode="vanilla")
    x1, x2 = states((1, 3, 4))
    with pytest.raises(KeyError, match="the module's own error") as info:
        y1, y2 = seq(x1.clone().requires_grad_(), x2)
        objective(y1, y2).backward()
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "block 0" in notes and "F" in notes, notes


def test_device_states_are_refused_clearly():
    seq = fmt.ReversibleSequence([(mlp(4), mlp(4))])
    with pytest.raises(TypeError, match="x1 is on meta"):
        seq(torch.empty(1, 2, 4, device="meta"), torch.empty(1, 2, 4, device="meta"))


# ---------------------------------------------------------------------------------------------
# The built-in blocks
# ---------------------------------------------------------------------------------------------

def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps) * w + b


def attention(x, p, heads, eps):
    lw, lb, wq, bq, wp, bp = p
    batch, tokens, width = x.shape
    d = width // heads
    qkv = layer_norm(x, lw, lb, eps) @ wq + bq
    q, k, v = (qkv[..., i * width:(i + 1) * width].reshape(batch, tokens, heads, d).transpose(1, 2) for i in range(3))
    a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v
    return a.transpose(1, 2).reshape(batch, tokens, width) @ wp + bp


def feed_forward(x, p, eps):
    lw, lb, w1, b1, w2, b2 = p
    return torch.nn.functional.gelu(layer_norm(x, lw, lb, eps) @ w1 + b1) @ w2 + b2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batch,tokens,width,heads,depth", [(1, 1, 8, 1, 1), (2, 7, 24, 4, 3), (3, 17, 32, 2, 2)])
def test_the_builtin_transformer_equals_its_formulas_in_torch(mode, batch, tokens, width, heads, depth):
    torch.manual_seed(batch + depth)
    model = fmt.ReversibleTransformer(width, heads, depth, mode=mode)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x1, x2 = (x.float() for x in states((batch, tokens, width), seed=5))
    got = run(model, x1, x2)

    params = [[p.detach().double().requires_grad_() for p in list(pair.attention.ordered()) + list(pair.mlp.ordered())]
              for pair in model.blocks]

    def reference(a, b):
        for ps in params:
            a = a + attention(b, ps[:6], heads, model.eps)
            b = b + feed_forward(a, ps[6:], model.eps)
        return a, b

    a, b = x1.double().requires_grad_(), x2.double().requires_grad_()
    y1, y2 = reference(a, b)
    objective(y1, y2).backward()
    assert_close(got[3][0], y1.detach(), 1e-4, "y1")
    assert_close(got[0], a.grad, 1e-4, "dx1")
    assert_close(got[1], b.grad, 1e-4, "dx2")
    mine = [p.grad for pair in model.blocks for part in (pair.attention, pair.mlp) for p in part.ordered()]
    for i, (g, w) in enumerate(zip(mine, [p.grad for ps in params for p in ps])):
        assert_close(g, w, 1e-4, f"parameter {i}")


def test_the_builtin_transformer_is_a_module_like_any_other():
    model = fmt.ReversibleTransformer(16, 2, 2, hidden=24)
    names = [n for n, _ in model.named_parameters()]
    assert names[:2] == ["blocks.0.attention.ln_weight", "blocks.0.attention.ln_bias"]
    assert len(names) == 24 and model.blocks[0].mlp.fc1_weight.shape == (16, 24)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x1, x2 = states((2, 3, 16), torch.float32)
    before = objective(*model(x1, x2)).item()
    for _ in range(3):
        opt.zero_grad()
        objective(*model(x1, x2)).backward()
        opt.step()
    assert objective(*model(x1, x2)).item() < before
    model.zero_grad()
    model.blocks[1].mlp.fc2_bias.requires_grad_(False)
    x = x1.clone().requires_grad_()
    objective(*model(x, x2)).backward()
    assert model.blocks[1].mlp.fc2_bias.grad is None and x.grad is not None


# ---------------------------------------------------------------------------------------------
# Autocast, 16-bit states, keyword arguments, torch.compile, RevLib, double backward
# ---------------------------------------------------------------------------------------------
#
# Tolerances with bf16 / fp16 arithmetic. The forward computes exactly what ordinary autograd
# computes (the same module calls on the same inputs; the stream additions in the streams' dtype,
# as torch's type promotion does them), so y is compared BITWISE, and so are STANDARD mode's
# gradients (the same graph; each stream gradient a sum of two terms, which commutes). VANILLA and
# OVERLAPPED run the VJPs on rebuilt inputs: x2' = (x2 + G(y1)) - G(y1) in fp32 differs from x2
# by at most one fp32 ulp of |y2| (observed here: 1e-7 of the largest gradient), which a module's
# cast to 16 bits usually absorbs and, for an input that sits on a rounding boundary, moves by
# one 16-bit ulp (2^-8 relative for bf16). Such a step moves a gradient by at most about 2^-8 of
# its largest element (one row of one product), and the blocks here (weights * 0.3, 3 blocks) do
# not amplify it past 2^-6; a wiring error (a missing term, the wrong stream, autocast not
# replayed) moves it by O(1) or, for autocast, is asserted on the modules' own records.

BF16_GRADIENT_REL = 2.0**-6


class Recording(torch.nn.Module):
    """An MLP that logs, per call, whether CPU autocast was on, its output dtype and the thread."""

    def __init__(self, width, seed, dtype=torch.float32):
        super().__init__()
        self.inner = mlp(width, dtype, seed)
        self.calls = []

    def forward(self, x):
        y = self.inner(x)
        self.calls.append((torch.is_autocast_enabled("cpu"), y.dtype, torch.is_grad_enabled()))
        return y


def recording_blocks(width, depth, dtype=torch.float32, seed=0):
    return [(Recording(width, seed + 2 * k, dtype), Recording(width, seed + 2 * k + 1, dtype)) for k in range(depth)]


def grads_of(model_or_blocks, x1, x2, forward, autocast=None):
    """(y1, y2, dx1, dx2, [parameter grads]) of objective(forward(x1, x2)), the forward under
    `autocast` (a dtype) when given, the backward outside it."""
    params = [p for p in (model_or_blocks.parameters())]
    for p in params:
        p.grad = None
    a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y1, y2 = forward(a, b)
    objective(y1.double(), y2.double()).backward()
    return y1.detach(), y2.detach(), a.grad, b.grad, [p.grad for p in params]


def as_module(blocks):
    return torch.nn.ModuleList(torch.nn.ModuleList(p) for p in blocks)


@pytest.mark.parametrize("mode", ["vanilla", "overlapped", "standard"])
def test_autocast_bf16_runs_every_module_under_it_and_matches_ordinary_autograd(mode):
    blocks = recording_blocks(8, 3)
    seq = fmt.ReversibleSequence(blocks, mode=mode, num_threads=2)
    x1, x2 = states((2, 5, 8), torch.float32, 11)
    got = grads_of(seq, x1, x2, seq, autocast=torch.bfloat16)
    calls = [c for f, g in blocks for m in (f, g) for c in m.calls]
    # every module call -- forward, and the rebuild on flatmem's own thread -- ran under autocast
    assert len(calls) == 3 * 2 * (1 if mode == "standard" else 2) and all(on and dtype == torch.bfloat16 for on, dtype, _ in calls), calls
    for f, g in blocks:
        f.calls.clear(), g.calls.clear()
    want = grads_of(as_module(blocks), x1, x2, lambda a, b: plain(blocks, a, b), autocast=torch.bfloat16)
    assert got[0].dtype == want[0].dtype == torch.float32  # x + bf16 F(x): fp32, as type promotion has it
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    rel = 0.0 if mode == "standard" else BF16_GRADIENT_REL
    for name, g, w in zip(("dx1", "dx2"), got[2:4], want[2:4]):
        assert_close(g, w, rel, name)
    for i, (g, w) in enumerate(zip(got[4], want[4])):
        assert_close(g, w, rel, f"parameter {i}")


def test_the_rebuild_replays_the_forwards_autocast_state_whatever_the_backward_runs_under():
    blocks = recording_blocks(6, 2, seed=20)
    seq = fmt.ReversibleSequence(blocks, mode="vanilla")
    x1, x2 = states((3, 6), torch.float32, 12)
    a = x1.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y1, y2 = seq(a, x2)
    objective(y1, y2).backward()  # outside autocast: the rebuild must still run in bf16
    assert all(on and dtype == torch.bfloat16 for f, g in blocks for m in (f, g) for on, dtype, _ in m.calls)
    for f, g in blocks:
        f.calls.clear(), g.calls.clear()
    y1, y2 = seq(x1.clone().requires_grad_(), x2)  # forward in fp32 ...
    with torch.autocast("cpu", dtype=torch.bfloat16):
        objective(y1, y2).backward()  # ... backward inside autocast: the rebuild stays fp32
    assert all(not on and dtype == torch.float32 for f, g in blocks for m in (f, g) for on, dtype, _ in m.calls)


def widened_stack(blocks, dtype):
    """Ordinary autograd of the recipe ReversibleSequence follows for 16-bit states: fp32 streams,
    modules fed the states' dtype, results narrowed at the end."""
    def forward(a, b):
        a, b = a.float(), b.float()
        for f, g in blocks:
            a = a + f(b.to(dtype)).float()
            b = b + g(a.to(dtype)).float()
        return a.to(dtype), b.to(dtype)
    return forward


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["vanilla", "overlapped", "standard"])
def test_16_bit_states_keep_fp32_streams_and_match_ordinary_autograd(dtype, mode):
    blocks = recording_blocks(8, 3, dtype, seed=30)
    seq = fmt.ReversibleSequence(blocks, mode=mode)
    x1, x2 = (x.to(dtype) for x in states((2, 7, 8), torch.float32, 13))
    got = grads_of(seq, x1, x2, seq)
    assert all(d == dtype for f, g in blocks for m in (f, g) for _, d, _ in m.calls)  # modules see the state dtype
    want = grads_of(as_module(blocks), x1, x2, widened_stack(blocks, dtype))
    assert got[0].dtype == got[2].dtype == dtype and got[3].dtype == dtype
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    rel = 0.0 if mode == "standard" else BF16_GRADIENT_REL
    for name, g, w in zip(("dx1", "dx2"), got[2:4], want[2:4]):
        assert_close(g.float(), w.float(), rel, name)
    for i, (g, w) in enumerate(zip(got[4], want[4])):
        assert_close(g.float(), w.float(), rel, f"parameter {i}")


class Masked(torch.nn.Module):
    """A block that takes keyword arguments: a mask over tokens, a conditioning vector, a constant."""

    def __init__(self, width, seed):
        super().__init__()
        self.inner = mlp(width, seed=seed)

    def forward(self, x, mask=None, cond=None, gain=1.0):
        y = self.inner(x + (0.0 if cond is None else cond)) * gain
        return y if mask is None else y * mask[..., None]


def test_keyword_arguments_reach_every_module_and_tensors_among_them_get_gradients():
    blocks = [(Masked(6, 40 + k), Masked(6, 50 + k)) for k in range(3)]
    seq = fmt.ReversibleSequence(blocks, mode="overlapped")
    x1, x2 = states((2, 5, 6), seed=14)
    mask = (torch.arange(5) % 3 != 0).double().expand(2, 5)
    cond = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).requires_grad_()
    got = run(seq, x1, x2, forward=lambda a, b: seq(a, b, mask=mask, cond=cond, gain=0.5))
    got_cond = cond.grad.clone()
    cond.grad = None

    def reference(a, b):
        for f, g in blocks:
            a = a + f(b, mask=mask, cond=cond, gain=0.5)
            b = b + g(a, mask=mask, cond=cond, gain=0.5)
        return a, b

    want = run(seq, x1, x2, forward=reference)
    for name, g, w in (("y1", got[3][0], want[3][0]), ("dx1", got[0], want[0]), ("dx2", got[1], want[1]),
                       ("d cond", got_cond, cond.grad)):
        assert_close(g, w, 1e-10, name)
    for i, (g, w) in enumerate(zip(got[2], want[2])):
        assert_close(g, w, 1e-10, f"parameter {i}")
    # another constant is another call, not a stale one
    y_half = seq(x1, x2, mask=mask, gain=0.5)[0]
    y_one = seq(x1, x2, mask=mask, gain=1.0)[0]
    assert not torch.equal(y_half, y_one)


def test_torch_compile_fullgraph_runs_the_segment_as_one_operator():
    torch._dynamo.reset()
    blocks = [(mlp(8, torch.float32, 60 + k), mlp(8, torch.float32, 70 + k)) for k in range(3)]
    seq = fmt.ReversibleSequence(blocks, mode="vanilla")
    head = torch.nn.Linear(8, 8)

    def model(a, b):
        y1, y2 = seq(a, b)
        return head(y1) + y2

    x1, x2 = states((2, 5, 8), torch.float32, 15)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for forward, autocast in ((model, None), (compiled, None), (model, torch.bfloat16), (compiled, torch.bfloat16)):
        out = []
        for run_ in range(2):  # the second call runs the compiled graph again, no recompile
            for p in list(seq.parameters()) + list(head.parameters()):
                p.grad = None
            a, b = x1.clone().requires_grad_(), x2.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast is not None):
                y = forward(a, b)
            objective(y, y).backward()
            out.append([y.detach(), a.grad, b.grad] + [p.grad for p in seq.parameters()])
        if forward is model:
            eager = out[0]
        else:
            for i, (g, w) in enumerate(zip(out[1], eager)):
                assert torch.equal(g, w), f"compiled result {i} differs from eager (autocast {autocast})"
    # the same under inductor, the default backend
    torch._dynamo.reset()
    y = torch.compile(model, fullgraph=True)(x1, x2)
    assert torch.allclose(y, model(x1, x2), rtol=1e-6, atol=1e-6)


def test_the_builtin_transformer_compiles_with_fullgraph():
    torch._dynamo.reset()
    model = fmt.ReversibleTransformer(16, 2, 2)
    x1, x2 = states((2, 3, 16), torch.float32)
    want = run(model, x1, x2)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = run(model, x1, x2, forward=lambda a, b: compiled(a, b))
    for g, w in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2])):
        assert torch.equal(g, w)


def test_the_same_stack_under_revlib_gives_the_same_gradients():
    # float64; under CPU autocast RevLib 1.7's backward recomputes without it (it saves CUDA's
    # autocast state only), so its gradients are not those of its own forward there; ours are
    # checked against ordinary autograd under autocast above.
    revlib = pytest.importorskip("revlib")
    autocast, dtype = None, torch.float64
    blocks = [(mlp(6, dtype, 80 + k), mlp(6, dtype, 90 + k)) for k in range(3)]
    seq = fmt.ReversibleSequence(blocks, mode="overlapped")
    x1, x2 = states((2, 5, 6), dtype, 16)
    got = grads_of(seq, x1, x2, seq, autocast=autocast)
    rev = revlib.ReversibleSequential(*[m for pair in blocks for m in pair], split_dim=2)

    def through_revlib(a, b):
        y = rev(torch.cat([a, b], dim=2))
        return y[..., :6], y[..., 6:]

    want = grads_of(rev, x1, x2, through_revlib, autocast=autocast)
    for name, g, w in zip(("y1", "y2", "dx1", "dx2"), got[:4], want[:4]):
        assert_close(g, w, 1e-10, name)
    for i, (g, w) in enumerate(zip(got[4], want[4])):
        assert_close(g, w, 1e-10, f"parameter {i}")


@pytest.mark.parametrize("model", ["sequence", "transformer"])
def test_a_second_backward_through_the_segment_raises(model):
    if model == "sequence":
        m = fmt.ReversibleSequence([(mlp(4), mlp(4))], mode="vanilla")
        x1, x2 = states((2, 3, 4))
    else:
        m = fmt.ReversibleTransformer(8, 2, 1)
        x1, x2 = states((2, 3, 8), torch.float32)
    a = x1.clone().requires_grad_()
    y1, y2 = m(a, x2)
    (g,) = torch.autograd.grad(objective(y1, y2), a, create_graph=True)
    first = run(m, x1, x2)[0]
    assert torch.equal(g.detach(), first)  # the first derivative is unchanged under create_graph
    with pytest.raises(RuntimeError, match="double backward"):
        g.square().sum().backward()


def test_states_of_another_dtype_are_refused_naming_them():
    seq = fmt.ReversibleSequence([(mlp(4), mlp(4))])
    with pytest.raises(TypeError, match="x1 is torch.int32"):
        seq(torch.zeros(1, 2, 4, dtype=torch.int32), torch.zeros(1, 2, 4, dtype=torch.int32))
    with pytest.raises(TypeError, match="x1 is torch.float32 but x2 is torch.float64"):
        seq(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4, dtype=torch.float64))
