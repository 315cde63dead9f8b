"""Reversible segments for torch: a stack of reversible blocks whose forward keeps only its output.

    seq = flatmem.torch.ReversibleSequence([(F1, G1), (F2, G2), ...], mode="auto")
    y1, y2 = seq(x1, x2)          # block k: y1 = x1 + F_k(x2), y2 = x2 + G_k(y1)
    loss(y1, y2).backward()       # x1.grad, x2.grad and every parameter's .grad, as usual

F_k and G_k are ordinary nn.Modules mapping a state to a state of the same shape. The forward
runs them without autograd and keeps nothing but (y1, y2); the backward is flatmem's schedule
(include/flatmem/reversible.h): block by block, from the last, it rebuilds the block's input from
its output (x2 = y2 - G(y1), x1 = y1 - F(x2)) and runs the VJPs of G and F -- "vanilla" one after
the other, "overlapped" with the rebuild of block k-1 on a library thread while block k's
gradients run on the caller's, "auto" timing both per shape and keeping the faster ("standard" is
ordinary backprop, the baseline: the forward keeps every block's graph). Activation memory does
not grow with depth: the rebuild's forward records the block's graph (torch autograd), the VJP
walks it right away, and at most two blocks' graphs are alive.

Gradients: the segment is one autograd node whose inputs are x1, x2 and the modules' parameters
that require gradients; it returns their gradients to the engine, so they reach ``.grad``
(accumulating, with hooks and DistributedDataParallel as for any module), and x1 / x2 get theirs.
Randomness replays exactly: every call of F_k / G_k (forward, rebuild) runs with torch's CPU
generator seeded from flatmem's per-block (seed, offset) (flatmem_reversible_block_seed), in a
forked RNG state, so dropout draws the same mask in the rebuild as in the forward; each forward
of the sequence draws its seed from torch's generator, so masks differ step to step. Modules with
running statistics (BatchNorm in training mode) update them in the rebuild too.

Exceptions: one raised in F or G comes back as itself from the forward or from backward(), with
a note naming the block and phase. States: float32 or float64 CPU tensors (x1 and x2 of one shape
and dtype); the modules see torch tensors, their results are cast to the state's dtype. CUDA
states with Python modules are refused (TypeError): flatmem hands Python functions host buffers;
on a GPU, flatmem.torch.ReversibleTransformer's built-in blocks run on the device.
"""
from __future__ import annotations

import warnings
import weakref

import numpy as np
import torch

from .. import reversible as _rev
from . import _bridge as br

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _host_tensor(x, copy):
    """A torch view (or copy) of one of flatmem's host buffers, as the dispatch shows it (NumPy)."""
    if copy:
        return torch.tensor(x)
    with warnings.catch_warnings():  # a read-only buffer: torch warns that writes would be undefined
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


class _RngScope:
    """torch's CPU generator seeded from flatmem's (seed, offset) for one call, then restored."""

    def __init__(self, ctx):
        self.seed = (ctx.seed + ctx.offset * _GOLDEN) & _MASK64

    def __enter__(self):
        self.state = torch.random.get_rng_state()
        torch.random.default_generator.manual_seed(self.seed)

    def __exit__(self, *exc):
        torch.random.set_rng_state(self.state)


class _ModuleFunction(_rev.Function):
    """F or G of block k: a torch module run by flatmem's dispatch (reversible.py)."""

    def __init__(self, module, parameters, sink):
        self.module = module
        self.parameters = parameters  # the module's parameters that require gradients
        self.sink = sink              # weak reference to the sequence (its gradient accumulators)

    def forward(self, x, ctx):
        if ctx.keeps_residuals:
            # rebuild or record: the VJP of this block follows; keep its graph. x is copied: the
            # graph must outlive flatmem's buffer.
            xs = _host_tensor(x, copy=True).requires_grad_()
            with torch.enable_grad(), _RngScope(ctx):
                y = self.module(xs)
            self.save(ctx, (xs, y))
            return y.detach().numpy()
        with torch.no_grad(), _RngScope(ctx):
            return self.module(_host_tensor(x, copy=False)).numpy()

    def vjp(self, x, dy, ctx):
        xs, y = self.load(ctx)
        dys = _host_tensor(dy, copy=False).to(y.dtype)
        grads = torch.autograd.grad(y, [xs] + self.parameters, dys, allow_unused=True)
        sequence = self.sink()
        for p, g in zip(self.parameters, grads[1:]):
            if g is not None:
                sequence._accumulate(p, g)
        dx = grads[0]
        return np.zeros(x.shape, x.dtype) if dx is None else dx.numpy()


class _Segment(torch.autograd.Function):
    """One autograd node for a whole stack (inputs: x1, x2, then the parameters), run by its owner
    (ReversibleSequence or ReversibleTransformer): owner._run_forward(x1, x2, seed) -> (y1, y2) and
    owner._run_backward(y1, y2, dy1, dy2, seed) -> (dx1, dx2, [a gradient or None per parameter])."""

    @staticmethod
    def forward(ctx, owner, seed, x1, x2, *parameters):
        y1, y2 = owner._run_forward(x1, x2, seed)
        ctx.owner, ctx.seed = owner, seed
        ctx.save_for_backward(y1, y2)
        return y1, y2

    @staticmethod
    def backward(ctx, dy1, dy2):
        y1, y2 = ctx.saved_tensors
        dx1, dx2, grads = ctx.owner._run_backward(y1, y2, dy1, dy2, ctx.seed)
        return (None, None, dx1, dx2, *grads)


class ReversibleSequence(torch.nn.Module):
    """A reversible stack of (F, G) module pairs (module docstring).

    blocks       [(F_0, G_0), (F_1, G_1), ...] of nn.Modules (registered as submodules
                 ``blocks[k][0]`` / ``blocks[k][1]``)
    mode         "auto" (default), "vanilla", "overlapped" or "standard"
    num_threads  flatmem's CPU threads (0 = torch.get_num_threads())

    ``forward(x1, x2)`` returns (y1, y2). ``last_mode`` names the mode the last backward ran.
    """

    def __init__(self, blocks, mode="auto", num_threads=0):
        super().__init__()
        pairs = [tuple(pair) for pair in blocks]
        for k, pair in enumerate(pairs):
            if len(pair) != 2 or not all(isinstance(m, torch.nn.Module) for m in pair):
                raise TypeError(f"blocks[{k}]: expected an (F, G) pair of torch.nn.Modules")
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleList(pair) for pair in pairs)
        self.mode = mode
        self.num_threads = num_threads
        self._accumulators = None
        self._segment = None

    def _trainable(self):
        return [p for p in self.parameters() if p.requires_grad]

    def _build(self):
        """The flatmem segment over this stack's modules (made at the first call: the modules may
        be replaced or moved between construction and use)."""
        sink = weakref.ref(self)
        functions = []
        for pair in self.blocks:
            functions.append(tuple(_ModuleFunction(m, [p for p in m.parameters() if p.requires_grad], sink)
                                   for m in pair))
        threads = self.num_threads or torch.get_num_threads()
        self._segment = _rev.ReversibleSegment(functions, mode=self.mode, num_threads=threads)
        self._signature = self._parameter_signature()

    def _parameter_signature(self):
        return tuple((id(p), p.requires_grad) for p in self.parameters())

    def _ensure_segment(self):
        if self._segment is None or self._signature != self._parameter_signature():
            self._build()
        return self._segment

    @staticmethod
    def _states(x1, x2):
        for name, x in (("x1", x1), ("x2", x2)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"flatmem.torch.ReversibleSequence: {name} must be a torch.Tensor")
            if x.device.type != "cpu":
                raise TypeError(f"flatmem.torch.ReversibleSequence: {name} is on {x.device}; Python modules "
                                "run on CPU states (flatmem.torch.ReversibleTransformer's built-in blocks run "
                                "on a GPU)")
        return x1.detach().contiguous(), x2.detach().contiguous()

    def _run_forward(self, x1, x2, seed):
        segment = self._ensure_segment()
        x1, x2 = self._states(x1, x2)
        y1, y2 = torch.empty_like(x1), torch.empty_like(x2)
        args = [br.arg(t, name, 0) for t, name in ((x1, "x1"), (x2, "x2"), (y1, "y1"), (y2, "y2"))]
        with segment._call() as h:
            h.forward(args[0].tensor, args[1].tensor, seed, 0, args[2].tensor, args[3].tensor)
        return y1, y2

    def _run_backward(self, y1, y2, dy1, dy2, seed):
        segment = self._ensure_segment()
        parameters = self._trainable()
        self._accumulators = {}
        dy1, dy2 = self._states(dy1, dy2)
        dx1, dx2 = torch.empty_like(y1), torch.empty_like(y2)
        names = ((y1, "y1"), (y2, "y2"), (dy1.to(y1.dtype), "dy1"), (dy2.to(y2.dtype), "dy2"), (dx1, "dx1"),
                 (dx2, "dx2"))
        a = [br.arg(t, name, 0) for t, name in names]
        try:
            with segment._call() as h:
                h.backward(a[0].tensor, a[1].tensor, a[2].tensor, a[3].tensor, seed, 0, a[4].tensor, a[5].tensor)
            grads = [self._accumulators.get(id(p)) for p in parameters]
        finally:
            self._accumulators = None
        return dx1, dx2, grads

    def _accumulate(self, parameter, gradient):
        held = self._accumulators.get(id(parameter))
        self._accumulators[id(parameter)] = gradient if held is None else held + gradient

    @property
    def last_mode(self):
        return self._segment.last_mode if self._segment is not None else "auto"

    def forward(self, x1, x2):
        seed = int(torch.randint(0, 2**62, (1,)).item())
        return _Segment.apply(self, seed, x1, x2, *self._trainable())
