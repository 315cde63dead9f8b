"""Reversible segments for torch: a stack of reversible blocks whose forward keeps only its output.

    seq = flatmem.torch.ReversibleSequence([(F1, G1), (F2, G2), ...], mode="auto")
    y1, y2 = seq(x1, x2)          # block k: y1 = x1 + F_k(x2), y2 = x2 + G_k(y1)
    y1, y2 = seq(x1, x2, mask=m)  # keyword arguments reach every F_k and G_k: F_k(x2, mask=m)
    loss(y1, y2).backward()       # x1.grad, x2.grad and every parameter's .grad, as usual

F_k and G_k are ordinary nn.Modules mapping a state to a state of the same shape. The forward
runs them without autograd and keeps nothing but (y1, y2); the backward is flatmem's schedule
(include/flatmem/reversible.h): block by block, from the last, it rebuilds the block's input from
its output (x2 = y2 - G(y1), x1 = y1 - F(x2)) and runs the VJPs of G and F -- "vanilla" one after
the other, "overlapped" with the rebuild of block k-1 on a library thread while block k's
gradients run, "auto" timing both per shape and keeping the faster ("standard" is ordinary
backprop, the baseline: the forward keeps every block's graph). Activation memory does not grow
with depth: the rebuild's forward records the block's graph (torch autograd), the VJP walks it
right away, and at most two blocks' graphs are alive.

Gradients: the segment is one autograd node (the custom operator ``flatmem::reversible_forward``)
whose inputs are x1, x2, the modules' parameters that require gradients and the tensors among the
keyword arguments; it returns their gradients to the engine, so they reach ``.grad``
(accumulating, with hooks and DistributedDataParallel as for any module). A parameter that
requires a gradient but that no F or G used gets a zero gradient (ordinary autograd: None).
Differentiable once: a second backward through the segment (create_graph=True, then
differentiating the gradients) raises.

Keyword arguments: ``seq(x1, x2, **kwargs)`` calls every F_k(x, **kwargs) and G_k(x, **kwargs) in
the forward and again in the rebuild (an attention mask, a conditioning vector). Tensors among them
that require gradients get them (summed over every block that used them); other values are
passed as they are (and are constants of a compiled graph).

States: x1, x2 of one shape and dtype on the CPU: float32 or float64 (the residual streams are
kept in that dtype), or bfloat16 / float16 (the streams are accumulated in float32 -- the rebuild
error would grow with depth in 16 bits -- and the modules see the states' dtype; y1, y2 come back
in it, x1.grad / x2.grad too). The modules see torch tensors of the states' dtype; their results
are cast to the streams' dtype. CUDA states with Python modules are refused (TypeError):
flatmem hands Python functions host buffers; on a GPU, flatmem.torch.ReversibleTransformer's
built-in blocks run on the device.

Autocast: a forward under ``torch.autocast("cpu", dtype)`` runs every F and G under that autocast,
on whichever thread flatmem calls it from, and the backward's rebuild replays the forward's
autocast state whatever the state around the backward is, so the rebuild recomputes what the
forward computed (y = x + F(x) in the streams' dtype: an autocast bf16 F gives fp32 streams as
ordinary autograd's type promotion does). GradScaler works as for any module (the scaled
gradient is just the incoming gradient).

torch.compile: the segment is one opaque operator with a fake implementation, so a model that
holds a ReversibleSequence compiles without a graph break (fullgraph=True works) and runs the
segment through flatmem; F and G themselves run eagerly inside that operator (compile them on their
own if they are worth it). Modules whose forward changes state (BatchNorm's running statistics)
update it in the rebuild too, as in eager mode; a compiled graph does not see those updates.

Randomness replays exactly: every call of F_k / G_k (forward, rebuild) runs with torch's CPU
generator seeded from flatmem's per-block (seed, offset) (flatmem_reversible_block_seed), in a
forked RNG state, so dropout draws the same mask in the rebuild as in the forward; each forward
of the sequence draws its seed from torch's generator, so masks differ step to step.

Exceptions: one raised in F or G comes back as itself from the forward or from backward(), with
a note naming the block and phase.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import warnings
import weakref

import torch

from .. import reversible as _rev
from . import _bridge as br
from . import _ops

__all__ = ["ReversibleSequence"]

_GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_NARROW = (torch.bfloat16, torch.float16)
_STREAM_DTYPES = (torch.float32, torch.float64)


def _host_tensor(x, copy):
    """A torch view (or copy) of one of flatmem's host buffers, as the dispatch shows it (NumPy)."""
    if copy:
        return torch.tensor(x)
    with warnings.catch_warnings():  # a read-only buffer: torch warns that writes would be undefined
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(x)


# ---------------------------------------------------------------------------------------------
# What one call of a segment tells its modules
# ---------------------------------------------------------------------------------------------

_known_arguments: list = []  # interned (tensor names, number names and kinds, constants)
_known_lock = threading.Lock()


@torch._dynamo.assume_constant_result
def _intern(entry) -> int:
    """The index of `entry` among the keyword-argument layouts seen (added when new): a compiled
    graph names the layout by this int, a constant, so equal layouts never recompile."""
    with _known_lock:
        for i, known in enumerate(_known_arguments):
            if _same_layout(known, entry):
                return i
        _known_arguments.append(entry)
        return len(_known_arguments) - 1


def _same_layout(a, b):
    if a[:2] != b[:2] or len(a[2]) != len(b[2]):
        return False
    for (na, va), (nb, vb) in zip(a[2], b[2]):
        if na != nb or type(va) is not type(vb):
            return False
        try:
            if not bool(va == vb):
                return False
        except Exception:  # an object without a truth value for ==: only itself is the same
            if va is not vb:
                return False
    return True


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _split_arguments(kwargs):
    """(spec, context) of a call's keyword arguments: the tensors and the numbers (as 0-d
    tensors: torch.compile treats Python numbers as graph inputs, not constants) travel in
    `context`, the layout and every other value (str, bool, None, ...) in the int `spec`."""
    names = sorted(kwargs)
    tensors = tuple(n for n in names if isinstance(kwargs[n], torch.Tensor))
    numbers = tuple((n, "int" if isinstance(kwargs[n], int) else "float") for n in names if _is_number(kwargs[n]))
    constants = tuple((n, kwargs[n]) for n in names
                      if not isinstance(kwargs[n], torch.Tensor) and not _is_number(kwargs[n]))
    context = [kwargs[n] for n in tensors]
    context += [torch.tensor(kwargs[n], dtype=torch.int64 if kind == "int" else torch.float64) for n, kind in numbers]
    return _intern((tensors, numbers, constants)), context


def _join_arguments(spec, context):
    """The keyword arguments of `spec` from the operator's `context` (_split_arguments reversed);
    returns (kwargs, names of the tensor arguments in context order)."""
    with _known_lock:
        tensors, numbers, constants = _known_arguments[spec]
    kwargs = dict(constants)
    kwargs.update(zip(tensors, (t.detach() for t in context)))
    for (name, kind), t in zip(numbers, context[len(tensors):]):
        kwargs[name] = int(t.item()) if kind == "int" else float(t.item())
    return kwargs, list(tensors)


class _Call:
    """One forward or backward of a segment, as its modules see it: the keyword arguments (those
    whose gradient is wanted become fresh leaves in every recorded call), the forward's CPU
    autocast dtype (None: off), the dtype the modules take and the streams' dtype."""

    def __init__(self, spec, context, wants, autocast_dtype, module_dtype, stream_dtype):
        self.kwargs, self.names = _join_arguments(spec, context)
        self.wanted = [n for n, w in zip(self.names, wants) if w]
        self.autocast_dtype = autocast_dtype
        self.module_dtype = module_dtype or stream_dtype
        self.stream_dtype = stream_dtype

    def module_input(self, x):
        return x.to(self.module_dtype)

    def stream_result(self, y):
        return y.to(self.stream_dtype).numpy()

    def recorded_kwargs(self):
        """The keyword arguments for a call whose VJP follows: (kwargs, {name: leaf})."""
        leaves = {n: self.kwargs[n].detach().requires_grad_() for n in self.wanted}
        return dict(self.kwargs, **leaves), leaves

    @contextlib.contextmanager
    def scope(self, ctx, grad):
        """The state a module call runs in, on any thread: grad mode, the forward's autocast,
        torch's generator seeded from the block's (seed, offset), and autograd dispatch on even
        inside a custom operator's kernel (which runs below autograd)."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(_autograd_dispatch())
            stack.enter_context(torch.enable_grad() if grad else torch.no_grad())
            stack.enter_context(torch.autocast("cpu", dtype=self.autocast_dtype or torch.bfloat16,
                                               enabled=self.autocast_dtype is not None))
            if ctx is not None:
                stack.enter_context(_RngScope(ctx))
            yield


_fresh_dispatch = []


def _autograd_dispatch():
    """The dispatcher's thread-local key sets of a fresh thread -- the state flatmem's own threads
    call modules in -- for a module call on the calling thread too: a custom operator's kernel
    runs below autograd (its thread excludes the autograd keys), where torch ops would record no
    graph for the rebuild's VJP."""
    if not _fresh_dispatch:
        def read():
            _fresh_dispatch[:] = [torch._C._dispatch_tls_local_include_set(),
                                  torch._C._dispatch_tls_local_exclude_set()]
        reader = threading.Thread(target=read)
        reader.start()
        reader.join()
    return torch._C._ForceDispatchKeyGuard(*_fresh_dispatch)


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
        self.sink = sink              # weak reference to the sequence (its call and accumulators)

    def forward(self, x, ctx):
        call = self.sink()._current
        if ctx.keeps_residuals:
            # rebuild or record: the VJP of this block follows; keep its graph. x is copied: the
            # graph must outlive flatmem's buffer.
            with call.scope(ctx, grad=True):
                xs = call.module_input(_host_tensor(x, copy=True)).requires_grad_()
                kwargs, leaves = call.recorded_kwargs()
                y = self.module(xs, **kwargs)
            self.save(ctx, (xs, y, leaves))
            return call.stream_result(y.detach())
        with call.scope(ctx, grad=False):
            return call.stream_result(self.module(call.module_input(_host_tensor(x, copy=False)), **call.kwargs))

    def vjp(self, x, dy, ctx):
        xs, y, leaves = self.load(ctx)
        sequence = self.sink()
        call = sequence._current
        with call.scope(None, grad=False):
            dys = _host_tensor(dy, copy=False).to(y.dtype)
            inputs = [xs] + self.parameters + list(leaves.values())
            grads = torch.autograd.grad(y, inputs, dys, allow_unused=True)
        for p, g in zip(self.parameters, grads[1:]):
            if g is not None:
                sequence._accumulate(p, g)
        for name, g in zip(leaves, grads[1 + len(self.parameters):]):
            if g is not None:
                sequence._accumulate(name, g)
        dx = grads[0]
        return torch.zeros(x.shape, dtype=call.stream_dtype).numpy() if dx is None else call.stream_result(dx)


# ---------------------------------------------------------------------------------------------
# The segment as a torch custom operator: one autograd node, opaque to torch.compile
# ---------------------------------------------------------------------------------------------

_owner_lock = threading.Lock()
_owners: "weakref.WeakValueDictionary[int, torch.nn.Module]" = weakref.WeakValueDictionary()
_next_owner = itertools.count(1)


class _SegmentOwner(torch.nn.Module):
    """A module whose forward runs a segment through the operators (ReversibleSequence,
    ReversibleTransformer): it owns the int the operators name it by, a fresh one for every
    instance, a deepcopy or an unpickled copy included (a plain attribute, so that torch.compile
    reads it as a constant)."""

    def __init__(self):
        super().__init__()
        self._take_slot()

    def _take_slot(self):
        with _owner_lock:
            self._flatmem_slot = next(_next_owner)
            _owners[self._flatmem_slot] = self

    def __setstate__(self, state):
        super().__setstate__(state)
        self._take_slot()


def _owner(slot: int):
    owner = _owners.get(slot)
    if owner is None:
        raise RuntimeError(f"flatmem.torch: the reversible module of slot {slot} no longer exists")
    return owner


@_ops._op("reversible_forward(int owner, Tensor seed, Tensor x1, Tensor x2, Tensor[] parameters, "
          "Tensor[] context, int spec, ScalarType? autocast_dtype, ScalarType? module_dtype) -> (Tensor, Tensor)")
def _forward_kernel(owner, seed, x1, x2, parameters, context, spec, autocast_dtype, module_dtype):
    call = _Call(spec, context, [False] * len(context), autocast_dtype, module_dtype, x1.dtype)
    return _owner(owner)._run_forward(x1, x2, int(seed.item()), call)


@_ops._fake("reversible_forward")
def _(owner, seed, x1, x2, parameters, context, spec, autocast_dtype, module_dtype):
    return torch.empty_like(x1), torch.empty_like(x2)


@_ops._op("reversible_backward(int owner, Tensor seed, Tensor y1, Tensor y2, Tensor dy1, Tensor dy2, "
          "Tensor[] parameters, Tensor[] context, bool[] context_wanted, int spec, ScalarType? autocast_dtype, "
          "ScalarType? module_dtype) -> (Tensor, Tensor, Tensor[], Tensor[])")
def _backward_kernel(owner, seed, y1, y2, dy1, dy2, parameters, context, context_wanted, spec, autocast_dtype,
                        module_dtype):
    call = _Call(spec, context, context_wanted, autocast_dtype, module_dtype, y1.dtype)
    dx1, dx2, grads, context_grads = _owner(owner)._run_backward(y1, y2, dy1, dy2, int(seed.item()), call)
    # an operator returns tensors: a gradient nobody produced is zero
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(parameters, grads)]
    context_grads += [None] * (len(context) - len(context_grads))  # the numbers among the arguments: none
    context_grads = [torch.zeros_like(t) if g is None else g.to(t.dtype) for t, g in zip(context, context_grads)]
    return dx1, dx2, grads, context_grads


@_ops._fake("reversible_backward")
def _(owner, seed, y1, y2, dy1, dy2, parameters, context, context_wanted, spec, autocast_dtype, module_dtype):
    return (torch.empty_like(y1), torch.empty_like(y2), [torch.empty_like(p) for p in parameters],
            [torch.empty_like(t) for t in context])


def _segment_setup(ctx, inputs, output):
    owner, seed, _, _, parameters, context, spec, autocast_dtype, module_dtype = inputs
    y1, y2 = output
    ctx.save_for_backward(seed, y1, y2, *parameters, *context)
    ctx.counts = (len(parameters), len(context))
    ctx.options = (owner, [t.requires_grad for t in context], spec, autocast_dtype, module_dtype)


def _segment_grad(ctx, dy1, dy2):
    seed, y1, y2, *rest = ctx.saved_tensors
    n_parameters, _ = ctx.counts
    parameters, context = rest[:n_parameters], rest[n_parameters:]
    owner, wanted, spec, autocast_dtype, module_dtype = ctx.options
    dx1, dx2, grads, context_grads = torch.ops.flatmem.reversible_backward(
        owner, seed, y1, y2, dy1, dy2, parameters, context, wanted, spec, autocast_dtype, module_dtype)
    dx1, dx2, *grads = br.first_order_only("flatmem::reversible_forward", dx1, dx2, *grads, *context_grads)
    grads, context_grads = grads[:n_parameters], grads[n_parameters:]
    # (a list entry cannot be None; autograd drops the zeros of context tensors that want no gradient)
    return None, None, dx1, dx2, grads, context_grads, None, None, None


torch.library.register_autograd("flatmem::reversible_forward", _segment_grad, setup_context=_segment_setup)


def _autocast_dtype():
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None


def _run_segment(owner, seed, x1, x2, parameters, kwargs=None):
    """(y1, y2) of owner's segment through the operator: owner._run_forward(x1, x2, seed, call) and
    owner._run_backward(y1, y2, dy1, dy2, seed, call) -> (dx1, dx2, [grad or None per parameter],
    [grad or None per context tensor]) run it on streams of float32 / float64; 16-bit states are
    widened here (autograd narrows their gradients back) and their dtype told to the modules."""
    dtype = x1.dtype
    stream = torch.float32 if dtype in _NARROW else dtype
    spec, context = _split_arguments(kwargs or {})
    y1, y2 = torch.ops.flatmem.reversible_forward(owner._flatmem_slot, seed, x1.to(stream), x2.to(stream), parameters,
                                                  context, spec, _autocast_dtype(),
                                                  dtype if dtype != stream else None)
    return y1.to(dtype), y2.to(dtype)


# ---------------------------------------------------------------------------------------------
# The module
# ---------------------------------------------------------------------------------------------

class ReversibleSequence(_SegmentOwner):
    """A reversible stack of (F, G) module pairs (module docstring).

    blocks       [(F_0, G_0), (F_1, G_1), ...] of nn.Modules (registered as submodules
                 ``blocks[k][0]`` / ``blocks[k][1]``)
    mode         "auto" (default), "vanilla", "overlapped" or "standard"
    num_threads  flatmem's CPU threads (0 = torch.get_num_threads())

    ``forward(x1, x2, **kwargs)`` returns (y1, y2); kwargs reach every F and G. ``last_mode`` names
    the mode the last backward ran.
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
        self._current = None
        self._segment = None

    def _trainable(self):
        return [p for p in self.parameters() if p.requires_grad]

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_segment"] = None  # flatmem's handle is not copied: a copy makes its own at first use
        return state

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
    def _check_states(x1, x2):
        for name, x in (("x1", x1), ("x2", x2)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"flatmem.torch.ReversibleSequence: {name} must be a torch.Tensor")
            if x.device.type != "cpu":
                raise TypeError(f"flatmem.torch.ReversibleSequence: {name} is on {x.device}; Python modules "
                                "run on CPU states (flatmem.torch.ReversibleTransformer's built-in blocks run "
                                "on a GPU)")
            if x.dtype not in _STREAM_DTYPES + _NARROW:
                raise TypeError(f"flatmem.torch.ReversibleSequence: {name} is {x.dtype}; expected float32, "
                                "float64, bfloat16 or float16")
        if x1.dtype != x2.dtype:
            raise TypeError(f"flatmem.torch.ReversibleSequence: x1 is {x1.dtype} but x2 is {x2.dtype}; the two "
                            "states share one dtype")

    @contextlib.contextmanager
    def _serving(self, call):
        """The segment's handle, with `call` as what its modules see (one call at a time)."""
        segment = self._ensure_segment()
        with segment._call() as h:
            self._current = call
            try:
                yield h
            finally:
                self._current = None

    def _run_forward(self, x1, x2, seed, call):
        x1, x2 = x1.detach().contiguous(), x2.detach().contiguous()
        y1, y2 = torch.empty_like(x1), torch.empty_like(x2)
        args = [br.arg(t, name, 0) for t, name in ((x1, "x1"), (x2, "x2"), (y1, "y1"), (y2, "y2"))]
        with self._serving(call) as h:
            h.forward(args[0].tensor, args[1].tensor, seed, 0, args[2].tensor, args[3].tensor)
        return y1, y2

    def _run_backward(self, y1, y2, dy1, dy2, seed, call):
        parameters = self._trainable()
        dy1, dy2 = (d.detach().to(y1.dtype).contiguous() for d in (dy1, dy2))
        dx1, dx2 = torch.empty_like(y1), torch.empty_like(y2)
        names = ((y1, "y1"), (y2, "y2"), (dy1, "dy1"), (dy2, "dy2"), (dx1, "dx1"), (dx2, "dx2"))
        a = [br.arg(t.contiguous(), name, 0) for t, name in names]
        self._accumulators = {}
        try:
            with self._serving(call) as h:
                h.backward(a[0].tensor, a[1].tensor, a[2].tensor, a[3].tensor, seed, 0, a[4].tensor, a[5].tensor)
            grads = [self._accumulators.get(id(p)) for p in parameters]
            context_grads = [self._accumulators.get(name) for name in call.names]
        finally:
            self._accumulators = None
        return dx1, dx2, grads, context_grads

    def _accumulate(self, key, gradient):
        """Adds a gradient of a parameter (or of the keyword argument named `key`)."""
        key = key if isinstance(key, str) else id(key)
        held = self._accumulators.get(key)
        self._accumulators[key] = gradient if held is None else held + gradient

    @property
    def last_mode(self):
        return self._segment.last_mode if self._segment is not None else "auto"

    def forward(self, x1, x2, **kwargs):
        self._check_states(x1, x2)
        seed = torch.randint(0, 2**62, (1,), dtype=torch.int64)
        return _run_segment(self, seed, x1, x2, self._trainable(), kwargs)
