"""Reversible segments (flatmem_reversible_t) for NumPy and DLPack arrays.

A segment is a stack of n reversible blocks; block k maps (X1, X2) to

    Y1 = X1 + F_k(X2),    Y2 = X2 + G_k(Y1)

Its forward keeps nothing but the output (Y1, Y2); its backward rebuilds every
block's input from its output and returns the input gradients, so activation
memory does not grow with n (include/flatmem/reversible.h is the manual).

Each F and G is either

* a ``Block``: flatmem's built-in pre-LayerNorm attention or MLP (fp32 states
  (batch, tokens, width) or (tokens, width); parameters and their gradients
  are arrays the block points at, gradients are ACCUMULATED), or
* a Python ``Function``: an object with ``forward(x, ctx) -> y`` and
  ``vjp(x, dy, ctx) -> dx`` (the gradient of <dy, F(x)> with respect to x;
  the binding adds it into the C dx). Residuals live in Python: keep what the
  VJP needs in ``forward`` when ``ctx.keeps_residuals`` (``Function.save`` /
  ``Function.load`` key them by (block, part)). A plain callable ``f(x) -> y``
  is a forward-only function. States may be float32 or float64.

    seg = flatmem.ReversibleSegment([(attention0, mlp0), (attention1, mlp1)], mode="auto")
    y1, y2 = seg.forward(x1, x2)
    dx1, dx2 = seg.backward(y1, y2, dy1, dy2)    # parameter gradients accumulate in the blocks
"""
from __future__ import annotations

import contextlib
import threading
import traceback
import weakref

import numpy as np

from . import capi
from ._header import NAMES
from ._options import enum_name, enum_value
from ._tensors import as_arg, output

_MODE, _KIND, _MATH = "flatmem_reversible_mode", "flatmem_block_kind", "flatmem_block_math"
_PARTS = ("F", "G")
_PHASES = tuple(NAMES["flatmem_reversible_phase"])  # forward, record, rebuild, gradient: 0 .. 3
_STATE_DTYPES = {32: np.dtype(np.float32), 64: np.dtype(np.float64)}
NUM_PARAMETERS = capi.BLOCK_NUM_PARAMETERS


def _invalid(message):
    """A flatmem.InvalidArgumentError made by the binding (same attributes as
    the library's)."""
    status = capi.STATUS_INVALID_ARGUMENT
    name = capi.status_string(status)
    e = capi.InvalidArgumentError(f"{name}: {message}")
    e.status, e.status_name, e.detail = status, name, message
    return e


# ---------------------------------------------------------------------------
# Built-in blocks
# ---------------------------------------------------------------------------


class Block:
    """A built-in block (flatmem_block_t), usable as F or G of any segment.

    kind    "attention": F(x) = MHSA(LN(x)) with `heads` heads (width % heads == 0);
            "mlp":       G(x) = GELU(LN(x) @ W1 + b1) @ W2 + b2, `hidden` wide (0 = 4 * width)
    eps     the LayerNorm epsilon
    math    precision of the products (flatmem_block_math): "fp32" (default) or
            "tf32" (CUDA tensor cores; the CPU, where this package's arrays
            live, runs FP32 for either), or the raw value, which the library
            checks

    set_parameters(params, grads=None): the 6 parameter arrays in the order of
    reversible.h (``parameter_shapes`` lists them), fp32, compact; grads the 6
    arrays the VJP ACCUMULATES into (zero them before a backward, see
    ``zero_grads``), or None for a forward-only block. No copy: the block
    points at the arrays, and keeps them referenced, so they must not be
    resized or replaced in place by another buffer; call set_parameters again
    to point it elsewhere. Objects with __dlpack__ are taken too.
    """

    def __init__(self, kind, width, heads=1, hidden=0, eps=1e-6, math="fp32"):
        kind_value = enum_value(kind, _KIND, "kind")
        math_value = enum_value(math, _MATH, "math")
        self._handle = capi.Block(kind_value, int(width), int(heads), int(hidden), float(eps),
                                  math_value)
        self.kind = enum_name(_KIND, kind_value)  # the library accepted it
        self.width = int(width)
        self.heads = int(heads) or 1
        self.hidden = int(hidden) or 4 * self.width
        self.eps = float(eps)
        self.math = enum_name(_MATH, math_value)
        self.parameters = None
        self.gradients = None
        self._keepalive = None

    @property
    def parameter_shapes(self):
        """The shapes of the 6 parameters (and of their gradients), in order."""
        w, h = self.width, self.hidden
        if self.kind == "attention":
            return [(w,), (w,), (w, 3 * w), (3 * w,), (w, w), (w,)]
        return [(w,), (w,), (w, h), (h,), (h, w), (w,)]

    def set_parameters(self, params, grads=None):
        params = list(params)
        if len(params) != NUM_PARAMETERS:
            raise ValueError(f"params: {len(params)} arrays; a {self.kind} block takes {NUM_PARAMETERS}")
        values = [as_arg(p, f"parameters[{i}]") for i, p in enumerate(params)]
        gradients = None
        if grads is not None:
            grads = list(grads)
            if len(grads) != NUM_PARAMETERS:
                raise ValueError(f"grads: {len(grads)} arrays; a {self.kind} block takes {NUM_PARAMETERS}")
            for i, g in enumerate(grads):
                if isinstance(g, np.ndarray) and not g.flags.writeable:
                    raise ValueError(f"grads[{i}]: the array is read-only")
            gradients = [as_arg(g, f"gradients[{i}]") for i, g in enumerate(grads)]
        tensors = [a.tensor for a in values] + ([a.tensor for a in gradients] if gradients else [])
        self._handle.set_parameters(*tensors)
        # Only now: on failure the block still points at the previous arrays.
        self._keepalive = (values, gradients)
        self.parameters, self.gradients = params, grads

    def zero_grads(self):
        """Sets the gradient arrays (NumPy) to zero."""
        if self.gradients is None:
            raise ValueError("zero_grads: the block has no gradient arrays (set_parameters(params, grads))")
        for g in self.gradients:
            g[...] = 0

    def __repr__(self):
        extra = f"heads={self.heads}" if self.kind == "attention" else f"hidden={self.hidden}"
        math = "" if self.math == "fp32" else f", math='{self.math}'"
        return f"flatmem.Block('{self.kind}', width={self.width}, {extra}, eps={self.eps}{math})"


# ---------------------------------------------------------------------------
# Python functions
# ---------------------------------------------------------------------------


class Context:
    """What a Python F or G is told about the call it serves.

    block        the block index k
    part         "F" or "G"
    phase        "forward" (the segment forward: nothing will follow),
                 "record" (STANDARD mode's forward: the VJP follows later),
                 "rebuild" (the backward's rebuild: the VJP follows right after),
                 "gradient" (a VJP)
    seed, offset flatmem_reversible_block_seed(call seed, block, part) and the
                 call's offset: draw randomness from them and the rebuild
                 replays it exactly
    num_threads  CPU threads flatmem gives this call (informational)
    """

    __slots__ = ("block", "part", "phase", "seed", "offset", "num_threads")

    def __init__(self, block, part, phase, seed, offset, num_threads):
        self.block, self.part, self.phase = block, part, phase
        self.seed, self.offset, self.num_threads = seed, offset, num_threads

    @property
    def key(self):
        """(block, part): where residuals of this call are kept."""
        return (self.block, self.part)

    @property
    def keeps_residuals(self):
        """True when a VJP of this block will follow this forward."""
        return self.phase in ("record", "rebuild")

    def __repr__(self):
        return (f"Context(block={self.block}, part={self.part!r}, phase={self.phase!r}, "
                f"seed={self.seed}, offset={self.offset}, num_threads={self.num_threads})")


class Function:
    """F or G in Python. Subclass and define

        forward(self, x, ctx) -> y     same shape as x; any float dtype (cast to x's)
        vjp(self, x, dy, ctx) -> dx    the gradient of sum(dy * F(x)) with respect to x;
                                       the binding ADDS it into flatmem's dx

    x, dy (and a returned y that is a view of them) are read-only views of
    flatmem's buffers, valid during the call only: keep copies, never the
    views (the binding raises InvalidArgumentError if a view outlives the
    call). Parameter gradients are the function's own business (accumulate
    them; the VJP of each block runs exactly once per backward).

    Residuals: ``self.save(ctx, value)`` in forward (when ctx.keeps_residuals)
    and ``self.load(ctx)`` in vjp keep them per (block, part), so one Function
    object may serve several blocks. In OVERLAPPED mode the rebuild's forward
    of block k-1 runs on a library thread while the VJP of block k runs on the
    caller's (each holding the GIL in turn).
    """

    def forward(self, x, ctx):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def vjp(self, x, dy, ctx):
        raise NotImplementedError(f"{type(self).__name__}.vjp")

    def save(self, ctx, value):
        saved = self.__dict__.setdefault("_flatmem_saved", {})
        saved[ctx.key] = value

    def load(self, ctx):
        """The value saved for ctx's (block, part), removed from the store."""
        try:
            return self.__dict__.get("_flatmem_saved", {}).pop(ctx.key)
        except KeyError:
            raise KeyError(f"{type(self).__name__}: nothing saved for block {ctx.block} {ctx.part} "
                           "(save it in forward when ctx.keeps_residuals)") from None


def _has_vjp(fn):
    vjp = getattr(fn, "vjp", None)
    if vjp is None:
        return False
    # a Function subclass that kept the base vjp has none of its own
    return getattr(vjp, "__func__", None) is not Function.vjp


class _Dispatch:
    """The one callable the C trampolines call for every Python F/G of a
    segment (see bindings/swig/flatmem.i, "Reversible segments"). Holds no
    reference to the segment (no cycle through the C object)."""

    def __init__(self, functions):
        self.functions = functions  # 2 * n entries: a Python function, or None (a Block)
        self.local = threading.local()

    def depth(self):
        return getattr(self.local, "depth", 0)

    def __call__(self, vjp, function, block, part, phase, num_threads, seed, offset, shape,
                 bits, x, a, dx):
        depth = self.depth()
        self.local.depth = depth + 1
        try:
            ctx = Context(block, _PARTS[part], _PHASES[phase], seed, offset, num_threads)
            fn = self.functions[function]
            dtype = _STATE_DTYPES[bits]
            try:
                if vjp:
                    shown = _call_vjp(fn, ctx, shape, dtype, x, a, dx)
                else:
                    shown = _call_forward(fn, ctx, shape, dtype, x, a)
            except BaseException as e:
                # The frames of the traceback hold views of flatmem's buffers;
                # the exception travels on (re-raised by the segment call).
                traceback.clear_frames(e.__traceback__)
                raise
        finally:
            self.local.depth = depth
            for view in (x, a, dx):
                if view is not None:
                    try:
                        view.release()
                    except BufferError:
                        pass
        # Every view of an array shown to the function has it as its base, so
        # the array is gone now unless the function kept a view of it.
        kept = [name for name, ref in shown if ref() is not None]
        if kept:
            raise _invalid(
                f"block {block}, {_PARTS[part]} {'vjp' if vjp else 'forward'}: the function kept "
                f"a view of {' and '.join(kept)} beyond the call; these are flatmem's buffers, valid "
                "during the call only: keep a copy (np.array(x)) instead")


def _as_result(value, shape, dtype, what, name):
    r = np.asarray(value)
    if r.shape != tuple(shape):
        raise _invalid(f"{what}: returned {name} of shape {r.shape}; expected {tuple(shape)} (x's shape)")
    if r.dtype.kind != "f":
        raise _invalid(f"{what}: returned {name} of dtype {r.dtype}; expected a floating-point array "
                       f"(it is cast to the state's {dtype})")
    return r


def _view(buffer, dtype, shape):
    """The array over a C buffer (no copy) and a weak reference to it."""
    a = np.frombuffer(buffer, dtype)
    return a.reshape(shape), weakref.ref(a)


def _call_forward(fn, ctx, shape, dtype, x, y):
    """Calls fn.forward (or fn) and writes its result into y; returns the weak
    references of the arrays the function saw."""
    what = f"block {ctx.block}, {ctx.part} forward"
    xs, x_ref = _view(x, dtype, shape)
    result = fn.forward(xs, ctx) if hasattr(fn, "forward") else fn(xs)
    result = _as_result(result, shape, dtype, what, "y")
    np.copyto(_view(y, dtype, shape)[0], result, casting="same_kind")
    return [("x", x_ref)]


def _call_vjp(fn, ctx, shape, dtype, x, dy, dx):
    """Calls fn.vjp and adds its result into dx (the C convention dx += ...)."""
    what = f"block {ctx.block}, {ctx.part} vjp"
    xs, x_ref = _view(x, dtype, shape)
    dys, dy_ref = _view(dy, dtype, shape)
    result = fn.vjp(xs, dys, ctx)
    if result is None:
        raise _invalid(f"{what}: returned None; expected the input gradient (shape {tuple(shape)})")
    result = _as_result(result, shape, dtype, what, "dx")
    dxs = _view(dx, dtype, shape)[0]
    np.add(dxs, result, out=dxs, casting="same_kind")
    return [("x", x_ref), ("dy", dy_ref)]


# ---------------------------------------------------------------------------
# The segment
# ---------------------------------------------------------------------------


class ReversibleSegment:
    """A flatmem_reversible_t: a stack of reversible blocks.

    blocks       [(F_0, G_0), (F_1, G_1), ...]: each a Block, a Function (an
                 object with forward(x, ctx) and vjp(x, dy, ctx)) or a plain
                 callable f(x) -> y (forward only)
    mode         "auto" (default: times vanilla and overlapped per shape and
                 keeps the faster), "standard" (ordinary backprop: the
                 forward keeps every block's input, O(n) memory), "vanilla"
                 (rebuild then gradients, block by block) or "overlapped" (the
                 rebuild of block k-1 on a second thread while the gradients
                 of block k run; bitwise the same results as vanilla)
    num_threads  CPU threads including the caller's (0 = all processors)

    States: x1 and x2 of one shape and dtype, float32 or float64 (the
    built-in blocks take float32 (batch, tokens, width) or (tokens, width)),
    compact; NumPy arrays or __dlpack__ objects. Results are new NumPy arrays.
    Calls are serialised per segment and run without the GIL (Python
    functions take it while they run). The Blocks and functions are kept
    referenced by the segment.
    """

    def __init__(self, blocks, mode="auto", num_threads=0):
        pairs = list(blocks)
        if not pairs:
            raise ValueError("blocks: empty; a segment has at least one (F, G) pair")
        functions = []
        for k, pair in enumerate(pairs):
            try:
                f, g = pair
            except (TypeError, ValueError):
                raise TypeError(f"blocks[{k}]: expected an (F, G) pair, got {type(pair).__name__}") from None
            for part, fn in zip(_PARTS, (f, g)):
                if not isinstance(fn, Block) and not hasattr(fn, "forward") and not callable(fn):
                    raise TypeError(f"blocks[{k}] {part}: expected a flatmem.Block, a flatmem.Function "
                                    f"(forward(x, ctx), vjp(x, dy, ctx)) or a callable, not "
                                    f"{type(fn).__name__}")
                functions.append(fn)
        # The handle first: it is destroyed first, before the blocks it calls.
        self._handle = capi.Reversible(len(pairs), enum_value(mode, _MODE, "mode"), int(num_threads))
        self._functions = functions
        self._dispatch = _Dispatch([None if isinstance(fn, Block) else fn for fn in functions])
        if any(not isinstance(fn, Block) for fn in functions):
            self._handle.set_dispatch(self._dispatch)
        for i, fn in enumerate(functions):
            if isinstance(fn, Block):
                self._handle.set_block(i // 2, i % 2, fn._handle)
            else:
                self._handle.set_python(i // 2, i % 2)
        self._handle.create()
        self._lock = threading.Lock()
        self.num_blocks = len(pairs)
        self.mode = str(enum_name(_MODE, self._handle.mode()))
        self.num_threads = int(num_threads)

    # ---- lifetime -------------------------------------------------------------

    def close(self):
        """Destroy the handle now (joins its thread); the blocks stay usable."""
        with self._lock:
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._handle is None else "open"
        return f"flatmem.ReversibleSegment({self.num_blocks} blocks, mode='{self.mode}', {state})"

    @contextlib.contextmanager
    def _call(self):
        """The handle, for one call at a time (the C thread rule)."""
        if self._dispatch.depth():  # before the lock, which this thread may hold
            raise RuntimeError("flatmem.ReversibleSegment: a function of this segment called the "
                               "segment itself (a callback must not call its own handle)")
        with self._lock:
            if self._handle is None:
                raise ValueError("flatmem.ReversibleSegment: the segment is closed")
            yield self._handle

    @property
    def blocks(self):
        """The (F, G) pairs, as given."""
        fs = self._functions
        return [(fs[i], fs[i + 1]) for i in range(0, len(fs), 2)]

    # ---- calls ---------------------------------------------------------------

    @staticmethod
    def _like(arg, name):
        return output(arg.shape, arg.dtype if arg.dtype is not None else np.float32, name)

    def forward(self, x1, x2, seed=0, offset=0):
        """(y1, y2): the segment output. Keeps nothing (STANDARD mode: every
        block's input and residuals, until the next forward)."""
        a1, a2 = as_arg(x1, "x1"), as_arg(x2, "x2")
        y1, t1 = self._like(a1, "y1")
        y2, t2 = self._like(a2, "y2")
        with self._call() as h:
            h.forward(a1.tensor, a2.tensor, int(seed), int(offset), t1.tensor, t2.tensor)
        return y1, y2

    def backward(self, y1, y2, dy1, dy2, seed=0, offset=0, return_inputs=False):
        """(dx1, dx2), or (dx1, dx2, x1, x2) with return_inputs=True (x1, x2:
        the segment input as the rebuild recovered it). Pass the seed and
        offset of the forward. Blocks accumulate their parameter gradients."""
        for i, fn in enumerate(self._functions):
            if not isinstance(fn, Block) and not _has_vjp(fn):
                raise TypeError(f"blocks[{i // 2}] {_PARTS[i % 2]}: {fn!r} has no vjp(x, dy, ctx); "
                                "a backward needs one (see flatmem.Function)")
        a1, a2 = as_arg(y1, "y1"), as_arg(y2, "y2")
        d1, d2 = as_arg(dy1, "dy1"), as_arg(dy2, "dy2")
        dx1, u1 = self._like(a1, "dx1")
        dx2, u2 = self._like(a2, "dx2")
        x1 = x2 = v1 = v2 = None
        if return_inputs:
            x1, v1 = self._like(a1, "x1")
            x2, v2 = self._like(a2, "x2")
        with self._call() as h:
            h.backward(a1.tensor, a2.tensor, d1.tensor, d2.tensor, int(seed), int(offset),
                               u1.tensor, u2.tensor, v1 and v1.tensor, v2 and v2.tensor)
        return (dx1, dx2, x1, x2) if return_inputs else (dx1, dx2)

    @property
    def last_mode(self):
        """The mode the last successful backward ran ("standard", "vanilla" or
        "overlapped"; "auto" before any)."""
        with self._call() as h:
            mode = h.last_mode()
        return str(enum_name(_MODE, mode))

    def rebuild_error(self, x1, x2, seed=0, offset=0):
        """(num_blocks,) float64: for each block k, max |rebuilt - true| /
        max |true| over its two input streams (forward from x1, x2, then the
        rebuild; a diagnostic that allocates O(n) states)."""
        a1, a2 = as_arg(x1, "x1"), as_arg(x2, "x2")
        errors, e = output((self.num_blocks,), np.float64, "errors")
        with self._call() as h:
            h.rebuild_error(a1.tensor, a2.tensor, int(seed), int(offset), e.tensor)
        return errors

    def forward_workspace_size(self, x):
        """Bytes of workspace a forward on states like x uses (the handle's own)."""
        a = as_arg(x, "x")
        with self._call() as h:
            return h.forward_workspace_size(a.tensor)

    def backward_workspace_size(self, x):
        """Bytes of workspace a backward on states like x uses (AUTO: the larger
        of vanilla and overlapped)."""
        a = as_arg(x, "x")
        with self._call() as h:
            return h.backward_workspace_size(a.tensor)
