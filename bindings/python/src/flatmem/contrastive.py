"""The tiled contrastive loss (flatmem_contrastive_t) for NumPy and DLPack arrays.

Two levels:

* ``contrastive_loss(q, k, logit_scale, labels=None, symmetric=True)`` returns
  ``(loss, backward)``; ``backward(dloss=1.0)`` returns ``(dq, dk, dlogit_scale)``.
* ``Contrastive``: the handle itself, with its options, ``forward``,
  ``backward`` and the workspace queries (the pattern later handles follow).
* ``sigmoid_loss(q, k, logit_scale, logit_bias, labels=None)`` returns
  ``(loss, backward)`` for the pairwise sigmoid (SigLIP) loss;
  ``backward(dloss=1.0)`` returns ``(dq, dk, dlogit_scale, dlogit_bias)``.
  ``sigmoid_value_and_grad(...)`` returns the loss and all four gradients
  from one pass (SigmoidResult). On a handle: ``Contrastive("sigmoid")`` with
  ``sigmoid_forward``, ``sigmoid_value_and_grad``, ``sigmoid_backward`` and
  ``sigmoid_workspace_size``.

The sigmoid loss (flatmem.h, "Sigmoid (SigLIP) loss"): logits
x_ij = s <q_i, k_j> + t, z_ij = +1 for row i's positive column y_i (labels[i],
or i without labels, which needs c >= b) and -1 for every other column,

    L = -(1/b) sum_i sum_j log sigmoid(z_ij x_ij)

the sum over all c columns of a row, the MEAN over the b rows. The gradients
are those of L itself: ``dlogit_scale`` = dL/ds and ``dlogit_bias`` = dL/dt
at the given s and t (a framework that learns log s multiplies dlogit_scale
by s). Unlike the softmax losses nothing is saved between calls: the
backward recomputes the logits from q, k, s and t.

Both take ``comm=`` (a flatmem.Communicator): the ring loss, where each rank
passes ITS rows q_r and columns k_r of one global batch (see "Ring across
ranks" in flatmem.h). The loss is that of the concatenated batch (the GLOBAL
mean, identical bits on every rank), and the gradients are the exact
gradients of that global loss w.r.t. this rank's q_r, k_r and s -- nothing
is summed over ranks (a data-parallel wrapper that averages parameter
gradients over N ranks must pass dloss = N). InfoNCE labels are GLOBAL column
indices. Calls are collective: every rank calls forward / backward in the
same order with the same loss, d, dtype, logit scale and dloss.

Formulas, shapes, dtypes and the gradient convention are those of
include/flatmem/flatmem.h: the loss is the mean over the b rows, and
``dlogit_scale`` is d/ds of the scale s itself (multiply by s for a learned
log-scale).
"""
from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple, Optional

import numpy as np

from . import capi
from ._options import c_defaults, c_integer, c_type, enum_name, enum_value, precision_value
from ._tensors import Arg, as_arg, as_output, as_scalar_arg, as_workspace, dlpack_dtype, output
from .comm import check_communicator

_CONTRASTIVE = "flatmem_contrastive_options"
# The binding's own names of two losses, besides the header's (_header.NAMES).
_LOSS_ALIASES = {"clip": capi.CONTRASTIVE_SYMMETRIC, "siglip": capi.CONTRASTIVE_SIGMOID}


_C_DEFAULTS = c_defaults(_CONTRASTIVE)  # FLATMEM_CONTRASTIVE_OPTIONS_INIT


def _threads_or_tile(value, field):
    return c_integer(value, field, c_type(_CONTRASTIVE, field))


class Options(NamedTuple):
    """The options of a contrastive handle as the C values they are
    (flatmem_contrastive_options, the communicator aside): what Contrastive,
    kept_handle and flatmem.torch carry once a binding entry point has
    translated the names a user wrote (Options.of). C judges the values."""

    loss: int = _C_DEFAULTS["loss"]
    num_threads: int = _C_DEFAULTS["num_threads"]
    tile_rows: int = _C_DEFAULTS["tile_rows"]
    tile_cols: int = _C_DEFAULTS["tile_cols"]
    nonfinite: int = _C_DEFAULTS["nonfinite"]
    logit_cache_bytes: int = _C_DEFAULTS["logit_cache_bytes"]
    fp32_precision: int = _C_DEFAULTS["fp32_precision"]

    @classmethod
    def of(cls, loss="symmetric", *, num_threads=0, tile_rows=0, tile_cols=0, nonfinite="error",
           logit_cache_bytes=0, precision="default") -> "Options":
        """The one translation of the option names (Contrastive's arguments)
        into their C values; a name that does not exist is a ValueError
        naming the option and the names it has."""
        return cls(enum_value(loss, "flatmem_contrastive_loss", "loss", _LOSS_ALIASES),
                   _threads_or_tile(num_threads, "num_threads"), _threads_or_tile(tile_rows, "tile_rows"),
                   _threads_or_tile(tile_cols, "tile_cols"),
                   enum_value(nonfinite, "flatmem_nonfinite_policy", "nonfinite"),
                   c_integer(logit_cache_bytes, "logit_cache_bytes", c_type(_CONTRASTIVE, "logit_cache_bytes"),
                             unit="bytes", note=" (0 = no cache)"),
                   precision_value(precision))


class ForwardResult(NamedTuple):
    """What Contrastive.forward returns: the mean loss (0-d float32) and the
    saved log-sum-exp vectors the backward needs (col_lse None for InfoNCE)."""

    loss: np.ndarray
    row_lse: np.ndarray
    col_lse: Optional[np.ndarray]


class SigmoidResult(NamedTuple):
    """What the sigmoid loss's value_and_grad returns (an entry not requested
    is None): loss (0-d float32), dq (b, d) and dk (c, d) in the gradient
    dtype, dlogit_scale = dL/ds and dlogit_bias = dL/dt (float32, shaped like
    logit_scale / logit_bias)."""

    loss: Optional[np.ndarray]
    dq: Optional[np.ndarray]
    dk: Optional[np.ndarray]
    dlogit_scale: Optional[np.ndarray]
    dlogit_bias: Optional[np.ndarray]


class SigmoidGrads(NamedTuple):
    """What the sigmoid loss's backward returns: the gradients of dloss * L
    (an entry not requested is None), as in SigmoidResult."""

    dq: Optional[np.ndarray]
    dk: Optional[np.ndarray]
    dlogit_scale: Optional[np.ndarray]
    dlogit_bias: Optional[np.ndarray]


class Contrastive:
    """A flatmem_contrastive_t handle: created with its options, destroyed with
    the object (or by close() / a with-block).

    loss        "symmetric" (CLIP, c = b, no labels), "infonce" (rows ->
                columns, optional int64 labels, c >= b allowed) or "sigmoid"
                (alias "siglip": the pairwise sigmoid loss, module docstring;
                its calls are the sigmoid_* methods, forward / backward and
                their workspace queries refuse such a handle, and the sigmoid_*
                methods refuse a handle of another loss)
    num_threads CPU threads including the caller's; 0 = all processors
    tile_rows, tile_cols   tile extents (0 = 512); results depend on them
                (summation order), not on num_threads
    nonfinite   "error" (NaN/Inf inputs raise NonFiniteError) or "propagate"
    logit_cache_bytes   a memory/compute dial, in bytes (default 0: off).
                The forward keeps the raw logit tiles <q_i, k_j> (fp32) that
                fit in this budget inside the handle, and the next backward
                on the same q and k reads them instead of recomputing them:
                forward + backward take 8 b c d - 2 min(budget / 4, b c) d
                FLOPs instead of 8 b c d, i.e. 6 b c d at a budget of 4 b c
                bytes (64 MiB for b = c = 4096). The handle allocates
                min(budget, 4 b c) bytes at its first forward and keeps them
                until it is closed (OutOfMemoryError naming the option when
                that fails). Results are bitwise identical with and without
                the cache; a backward whose q or k differ from the last
                forward's (shapes, dtype or contents, checked by a 128-bit
                fingerprint) recomputes. CPU tensors only (CUDA calls ignore
                it).
    precision   options.fp32_precision: "default", "round_once" (alias
                "tf32") or "full" (anything else: ValueError): defined once,
                with its error bounds, in flatmem.h (flatmem_fp32_precision).

    comm        a flatmem.Communicator (default None: this process alone): the
                ring loss over its ranks (module docstring; CPU tensors, no
                workspace, no logit cache). The handle keeps a reference to
                it, and comm.close() raises until this handle is closed.
                For the sigmoid loss: each rank passes its rows q_r and
                columns k_r, labels are GLOBAL column indices (without labels
                global row g's positive is global column g), L is that of the
                concatenated batch (B = global rows in the mean), dq / dk this
                rank's rows / columns of the global gradient, dlogit_scale and
                dlogit_bias identical on every rank; no workspace.

    options     an Options (the C values, translated once: Options.of), in
                place of loss .. precision

    Inputs are NumPy arrays (float32, ml_dtypes.bfloat16 or float16 features,
    any row stride; int64 labels) or objects with __dlpack__; outputs are new
    NumPy arrays. Calls on one handle are serialised by a lock (the C thread
    rule: one thread at a time per handle; with comm, also the communicator's
    lock); the GIL is released while the library computes and while the ring
    waits for its peers.
    """

    def __init__(self, loss="symmetric", *, num_threads=0, tile_rows=0, tile_cols=0,
                 nonfinite="error", logit_cache_bytes=0, precision="default", comm=None,
                 options: Optional[Options] = None):
        if options is None:
            options = Options.of(loss, num_threads=num_threads, tile_rows=tile_rows, tile_cols=tile_cols,
                                 nonfinite=nonfinite, logit_cache_bytes=logit_cache_bytes, precision=precision)
        raw = capi.ContrastiveOptions()
        (raw.loss, raw.num_threads, raw.tile_rows, raw.tile_cols, raw.nonfinite, raw.logit_cache_bytes,
         raw.fp32_precision) = options
        self._symmetric = options.loss in (capi.CONTRASTIVE_DEFAULT, capi.CONTRASTIVE_SYMMETRIC)
        self._lock = threading.Lock()
        if comm is not None:
            check_communicator(comm, "comm")
        self.comm = comm
        self._handle = capi.Contrastive(raw, comm._raw if comm is not None else None)
        self.options = {"loss": enum_name("flatmem_contrastive_loss", options.loss),
                        "num_threads": options.num_threads, "tile_rows": options.tile_rows,
                        "tile_cols": options.tile_cols, "nonfinite": options.nonfinite,
                        "logit_cache_bytes": options.logit_cache_bytes,
                        "precision": enum_name("flatmem_fp32_precision", options.fp32_precision)}

    @property
    def symmetric(self):
        return self._symmetric

    def close(self):
        """Destroy the handle now (joins its threads, frees its workspace) and
        release its communicator, if any."""
        with self._lock:
            self._handle = None

    @contextlib.contextmanager
    def locked(self):
        """The raw handle (flatmem.capi.Contrastive) under the handle's lock and,
        for a ring, its communicator's: for callers that make the C calls
        themselves (flatmem.torch), one thread at a time as C requires."""
        with self._lock, (self.comm._lock if self.comm is not None else contextlib.nullcontext()):
            yield self._h()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._handle is None else "open"
        return f"flatmem.Contrastive({self.options}, {state})"

    def _h(self):
        if self._handle is None:
            raise ValueError("flatmem.Contrastive: the handle is closed")
        return self._handle

    # ---- workspace queries ------------------------------------------------

    def forward_workspace_size(self, q, k):
        """Bytes of workspace forward() needs for these shapes and dtypes."""
        q, k = as_arg(q, "q"), as_arg(k, "k")
        with self._lock:
            return self._h().forward_workspace_size(q.tensor, k.tensor)

    def backward_workspace_size(self, q, k, grad_dtype=None, *, dq=True, dk=True):
        """Bytes of workspace backward() needs when it writes dq / dk (False:
        not requested) in grad_dtype (None: the input dtype)."""
        q, k = as_arg(q, "q"), as_arg(k, "k")
        dq_t = self._grad_meta(q, grad_dtype, "dq") if dq else None
        dk_t = self._grad_meta(k, grad_dtype, "dk") if dk else None
        with self._lock:
            return self._h().backward_workspace_size(q.tensor, k.tensor, dq_t, dk_t)

    @staticmethod
    def _grad_meta(like, grad_dtype, name):
        """A data-less tensor with like's shape in grad_dtype (for size queries)."""
        src = like.tensor
        if grad_dtype is None:
            code, bits = src.dtype_code(), src.dtype_bits()
        else:
            code, bits = dlpack_dtype(grad_dtype, name)
        t = capi.Tensor(0, src.ndim(), code, bits)
        for i in range(src.ndim()):
            t.set_shape(i, src.shape(i))
        return t

    # ---- forward / backward ------------------------------------------------

    def forward(self, q, k, logit_scale, labels=None, *, workspace=None):
        """The mean loss and the saved log-sum-exp vectors (ForwardResult)."""
        return self._forward(as_arg(q, "q"), as_arg(k, "k"), as_scalar_arg(logit_scale, "logit_scale"),
                             as_arg(labels, "labels"), as_workspace(workspace))

    def backward(self, q, k, logit_scale, row_lse, col_lse=None, labels=None, dloss=None, *,
                 dq=True, dk=True, dlogit_scale=True, grad_dtype=None, workspace=None):
        """Gradients of dloss * L: returns (dq, dk, dlogit_scale).

        dq, dk: True = a new array in grad_dtype (None: the input dtype;
        "float32" also allowed), False = not computed (None returned), or a
        writable NumPy array (any row stride) to write into.
        dlogit_scale: True (a new float32 array shaped like logit_scale) or False.
        dloss: the upstream gradient g (None = 1).
        """
        return self._backward(as_arg(q, "q"), as_arg(k, "k"), as_scalar_arg(logit_scale, "logit_scale"),
                              as_arg(row_lse, "row_lse"), as_arg(col_lse, "col_lse"),
                              as_arg(labels, "labels"), as_scalar_arg(dloss, "dloss"),
                              dq, dk, dlogit_scale, grad_dtype, as_workspace(workspace))

    def _forward(self, q: Arg, k: Arg, s: Arg, labels: Optional[Arg], ws: Optional[Arg]):
        b, c = q.extent(0), k.extent(0)
        loss, loss_t = output((), np.float32, "loss")
        row_lse, row_t = output((b,), np.float32, "row_lse")
        col_lse, col_t = output((c,), np.float32, "col_lse") if self._symmetric else (None, None)
        with self.locked() as h:
            h.forward(q.tensor, k.tensor, labels and labels.tensor, s.tensor, loss_t.tensor,
                              row_t.tensor, col_t and col_t.tensor, ws and ws.tensor)
        return ForwardResult(loss, row_lse, col_lse)

    def _backward(self, q: Arg, k: Arg, s: Arg, row_lse: Arg, col_lse: Optional[Arg],
                  labels: Optional[Arg], dloss: Optional[Arg], dq, dk, dlogit_scale, grad_dtype,
                  ws: Optional[Arg]):
        dq, dq_t = self._gradient(dq, q, grad_dtype, "dq")
        dk, dk_t = self._gradient(dk, k, grad_dtype, "dk")
        ds, ds_t = (None, None)
        if dlogit_scale:
            ds, ds_t = output(s.shape if s.ndim == 1 else (), np.float32, "dlogit_scale")
        with self.locked() as h:
            h.backward(q.tensor, k.tensor, labels and labels.tensor, s.tensor,
                               row_lse.tensor, col_lse and col_lse.tensor, dloss and dloss.tensor,
                               dq_t and dq_t.tensor, dk_t and dk_t.tensor, ds_t and ds_t.tensor,
                               ws and ws.tensor)
        return dq, dk, ds

    @staticmethod
    def _gradient(spec, like: Arg, grad_dtype, name):
        """(array, Arg) for a gradient output: new, caller-provided or skipped."""
        if spec is None or spec is False:
            return None, None
        if spec is True:
            dtype = grad_dtype if grad_dtype is not None else like.dtype
            if dtype is None:
                raise TypeError(f"{name}: no NumPy dtype matches the input's; pass grad_dtype='float32'")
            shape = like.shape if like.ndim == 2 else (like.extent(0), like.extent(1))
            return output(shape, dtype, name)
        return spec, as_output(spec, name)

    @staticmethod
    def _scalar_gradient(wanted, like: Arg, name):
        """(array, Arg) of a new float32 gradient shaped like a one-element
        argument (0-d, or (1,) when it is), or (None, None)."""
        if not wanted:
            return None, None
        return output(like.shape if like.ndim == 1 else (), np.float32, name)

    # ---- the sigmoid (SigLIP) loss --------------------------------------------

    def sigmoid_workspace_size(self, q, k, grad_dtype=None, *, dq=False, dk=False):
        """Bytes of workspace the sigmoid calls need: sigmoid_forward with the
        defaults (dq = dk = False), sigmoid_value_and_grad / sigmoid_backward
        with dq / dk True when they write those gradients in grad_dtype (None:
        the input dtype)."""
        q, k = as_arg(q, "q"), as_arg(k, "k")
        dq_t = self._grad_meta(q, grad_dtype, "dq") if dq else None
        dk_t = self._grad_meta(k, grad_dtype, "dk") if dk else None
        with self._lock:
            return self._h().sigmoid_workspace_size(q.tensor, k.tensor, dq_t, dk_t)

    def sigmoid_forward(self, q, k, logit_scale, logit_bias, labels=None, *, workspace=None):
        """The sigmoid loss L alone (2 b c d FLOPs): a 0-d float32 array.

        q (b, d), k (c, d): float32, bfloat16 or float16 (the same dtype; any
        row stride, contiguous rows). logit_scale s (finite, > 0) and
        logit_bias t (finite): Python / NumPy numbers (converted to float32)
        or one-element float32 arrays. labels: (b,) int64 column indices in
        [0, c), or None (y_i = i, needs c >= b).
        """
        return self._sigmoid_forward(*_sigmoid_args(q, k, logit_scale, logit_bias, labels),
                                     as_workspace(workspace))

    def sigmoid_value_and_grad(self, q, k, logit_scale, logit_bias, labels=None, *, loss=True, dq=True,
                               dk=True, dlogit_scale=True, dlogit_bias=True, grad_dtype=None,
                               workspace=None):
        """The sigmoid loss and its gradients in one pass (6 b c d FLOPs):
        SigmoidResult(loss, dq, dk, dlogit_scale, dlogit_bias).

        Arguments as for sigmoid_forward. loss, dlogit_scale, dlogit_bias:
        True (a new float32 array) or False (None returned). dq, dk: True = a
        new array in grad_dtype (None: the input dtype; "float32" also
        allowed), False = not computed, or a writable NumPy array (any row
        stride) to write into. At least one output. dq = dL/dq (b, d),
        dk = dL/dk (c, d), dlogit_scale = dL/ds, dlogit_bias = dL/dt, for
        L the mean over the b rows.
        """
        return self._sigmoid_value_and_grad(*_sigmoid_args(q, k, logit_scale, logit_bias, labels), loss, dq,
                                            dk, dlogit_scale, dlogit_bias, grad_dtype, as_workspace(workspace))

    def sigmoid_backward(self, q, k, logit_scale, logit_bias, labels=None, dloss=None, *, dq=True, dk=True,
                         dlogit_scale=True, dlogit_bias=True, grad_dtype=None, workspace=None):
        """The gradients of dloss * L, recomputing the logits (6 b c d FLOPs):
        SigmoidGrads(dq, dk, dlogit_scale, dlogit_bias).

        dloss: the upstream gradient g (None = 1; a number or a one-element
        float32 array, finite under nonfinite="error"). Outputs as for
        sigmoid_value_and_grad (at least one).
        """
        return self._sigmoid_backward(*_sigmoid_args(q, k, logit_scale, logit_bias, labels),
                                      as_scalar_arg(dloss, "dloss"), dq, dk, dlogit_scale, dlogit_bias,
                                      grad_dtype, as_workspace(workspace))

    def _sigmoid_outputs(self, q: Arg, k: Arg, s: Arg, t: Arg, dq, dk, dlogit_scale, dlogit_bias, grad_dtype):
        """The four gradient outputs of a sigmoid call: ((arrays), (Args))."""
        dq, dq_t = self._gradient(dq, q, grad_dtype, "dq")
        dk, dk_t = self._gradient(dk, k, grad_dtype, "dk")
        ds, ds_t = self._scalar_gradient(dlogit_scale, s, "dlogit_scale")
        dt, dt_t = self._scalar_gradient(dlogit_bias, t, "dlogit_bias")
        return (dq, dk, ds, dt), tuple(a and a.tensor for a in (dq_t, dk_t, ds_t, dt_t))

    def _sigmoid_forward(self, q: Arg, k: Arg, s: Arg, t: Arg, labels: Optional[Arg], ws: Optional[Arg]):
        loss, loss_t = output((), np.float32, "loss")
        with self.locked() as h:
            h.sigmoid_forward(q.tensor, k.tensor, labels and labels.tensor, s.tensor, t.tensor, loss_t.tensor,
                              ws and ws.tensor)
        return loss

    def _sigmoid_value_and_grad(self, q: Arg, k: Arg, s: Arg, t: Arg, labels: Optional[Arg], loss, dq, dk,
                                dlogit_scale, dlogit_bias, grad_dtype, ws: Optional[Arg]) -> SigmoidResult:
        loss, loss_t = output((), np.float32, "loss") if loss else (None, None)
        grads, tensors = self._sigmoid_outputs(q, k, s, t, dq, dk, dlogit_scale, dlogit_bias, grad_dtype)
        with self.locked() as h:
            h.sigmoid_value_and_grad(q.tensor, k.tensor, labels and labels.tensor, s.tensor, t.tensor,
                                     loss_t and loss_t.tensor, *tensors, ws and ws.tensor)
        return SigmoidResult(loss, *grads)

    def _sigmoid_backward(self, q: Arg, k: Arg, s: Arg, t: Arg, labels: Optional[Arg], dloss: Optional[Arg],
                          dq, dk, dlogit_scale, dlogit_bias, grad_dtype, ws: Optional[Arg]) -> SigmoidGrads:
        grads, tensors = self._sigmoid_outputs(q, k, s, t, dq, dk, dlogit_scale, dlogit_bias, grad_dtype)
        with self.locked() as h:
            h.sigmoid_backward(q.tensor, k.tensor, labels and labels.tensor, s.tensor, t.tensor,
                               dloss and dloss.tensor, *tensors, ws and ws.tensor)
        return SigmoidGrads(*grads)


_shared = threading.local()


def kept_handle(options: Options, comm=None) -> Contrastive:
    """The handle kept for these resolved options: the communicator's (a ring,
    closed by comm.close()) or the calling thread's (one per Options, created
    at first use: creating one starts its worker threads, and one with a
    logit cache keeps its cache). What the functional calls here and
    flatmem.torch's operators run on."""
    if comm is not None:
        check_communicator(comm, "comm")
        if options.logit_cache_bytes:
            raise ValueError("logit_cache_bytes: the ring loss (comm=...) has no logit cache; pass 0")
        handles = comm._contrastive
    else:
        handles = getattr(_shared, "handles", None)
        if handles is None:
            handles = _shared.handles = {}
    handle = handles.get(options)
    if handle is None:
        handle = handles[options] = Contrastive(options=options, comm=comm)
    return handle


def _handle_for(comm, loss, num_threads, tile_rows, tile_cols, nonfinite, logit_cache_bytes=0,
                precision="default"):
    """The kept handle of a functional call (its options by name)."""
    return kept_handle(Options.of(loss, num_threads=num_threads, tile_rows=tile_rows, tile_cols=tile_cols,
                                  nonfinite=nonfinite, logit_cache_bytes=logit_cache_bytes, precision=precision),
                       comm)


def contrastive_loss(q, k, logit_scale, labels=None, symmetric=True, *, num_threads=0,
                     tile_rows=0, tile_cols=0, nonfinite="error", logit_cache_bytes=0, precision="default",
                     comm=None):
    """The contrastive loss of row features q (b, d) against column features
    k (c, d) at logit scale s: returns (loss, backward).

    symmetric=True: the CLIP loss (c = b, row i paired with column i, no
    labels). symmetric=False: InfoNCE rows -> columns with labels (b,) int64
    in [0, c) (default: y_i = i), c >= b allowed.

    loss is a 0-d float32 array; backward(dloss=1.0) returns (dq, dk,
    dlogit_scale): NumPy arrays in the input dtype (dlogit_scale float32,
    shaped like logit_scale), the gradients of dloss * loss. backward may be
    called more than once; it recomputes from q, k and the saved log-sum-exp
    vectors, which it keeps alive.

    Options as for Contrastive; a handle per thread and option set is kept
    between calls. logit_cache_bytes (bytes, default 0 = off) trades memory
    for FLOPs as Contrastive's does: the forward keeps up to that many bytes
    of logit tiles in the thread's handle for these options (held until the
    thread ends), and backward() reads them instead of recomputing -- down to
    6 b c d FLOPs for forward + backward instead of 8 b c d at 4 b c bytes.
    Each forward replaces the tiles: backward() hits when no other forward
    with the same options ran on this thread since its own (otherwise it
    recomputes; the results are bitwise the same either way). Errors raise flatmem.Error subclasses whose message is
    flatmem's (which argument, its shape or value, what was expected).

    precision: "default", "round_once" ("tf32") or "full", as for
    Contrastive (flatmem.h, flatmem_fp32_precision).

    comm: a flatmem.Communicator -> the ring loss of the global batch whose
    rows q and columns k on this rank are this rank's shard (labels: GLOBAL
    column indices). Collective: every rank calls it, and backward(), in the
    same order. The loss is the global one on every rank; backward() gives
    the exact gradients of the global loss w.r.t. this rank's q, k and s
    (nothing summed over ranks). The handle is kept by the communicator
    (closed by comm.close(); backward() afterwards raises). No logit cache.
    """
    handle = _handle_for(comm, "symmetric" if symmetric else "infonce", num_threads, tile_rows, tile_cols,
                         nonfinite, logit_cache_bytes, precision)
    q, k = as_arg(q, "q"), as_arg(k, "k")
    s, labels = as_scalar_arg(logit_scale, "logit_scale"), as_arg(labels, "labels")
    saved = handle._forward(q, k, s, labels, None)
    row_lse = as_arg(saved.row_lse, "row_lse")
    col_lse = as_arg(saved.col_lse, "col_lse")

    def backward(dloss=1.0):
        """(dq, dk, dlogit_scale): gradients of dloss * loss."""
        return handle._backward(q, k, s, row_lse, col_lse, labels, as_scalar_arg(dloss, "dloss"),
                                True, True, True, None, None)

    return saved.loss, backward


def _sigmoid_args(q, k, logit_scale, logit_bias, labels):
    return (as_arg(q, "q"), as_arg(k, "k"), as_scalar_arg(logit_scale, "logit_scale"),
            as_scalar_arg(logit_bias, "logit_bias"), as_arg(labels, "labels"))


def sigmoid_loss(q, k, logit_scale, logit_bias, labels=None, *, comm=None, num_threads=0, tile_rows=0,
                 tile_cols=0, nonfinite="error", precision="default"):
    """The pairwise sigmoid (SigLIP) loss of row features q (b, d) against
    column features k (c, d): returns (loss, backward).

    L = -(1/b) sum_i sum_j log sigmoid(z_ij (s <q_i, k_j> + t)), z_ij = +1 for
    j = y_i and -1 otherwise: the sum over all c columns, the MEAN over the b
    rows. y_i = labels[i] (labels (b,) int64 in [0, c)) or i (labels None,
    needs c >= b). q, k: float32, bfloat16 or float16 (the same dtype).
    logit_scale s (finite, > 0) and logit_bias t (finite): numbers or
    one-element float32 arrays.

    loss is a 0-d float32 array (2 b c d FLOPs). backward(dloss=1.0) returns
    SigmoidGrads(dq, dk, dlogit_scale, dlogit_bias), the gradients of
    dloss * L: dq (b, d) and dk (c, d) in the input dtype, dlogit_scale =
    dL/ds and dlogit_bias = dL/dt (float32, shaped like logit_scale /
    logit_bias). backward recomputes the logits (6 b c d FLOPs), may be
    called more than once and keeps q, k, s, t alive. When the gradients are
    wanted anyway, sigmoid_value_and_grad is one pass (6 b c d FLOPs instead
    of 8 b c d).

    Options as for Contrastive; a handle per thread and option set is kept
    between calls. Errors raise flatmem.Error subclasses whose message is
    flatmem's (which argument, its shape or value, what was expected).
    precision ("default", "round_once" / "tf32", "full"): as for Contrastive
    (flatmem.h, flatmem_fp32_precision).

    comm: a flatmem.Communicator -> the loss of the global batch whose rows q
    and columns k on this rank are this rank's shard; labels are GLOBAL
    column indices (without labels, global row g's positive is global column
    g). Collective: every rank calls it, and backward(), in the same order
    with the same s, t and dloss. The loss (mean over the B global rows),
    dlogit_scale and dlogit_bias are identical on every rank; dq, dk are this
    rank's slices of the global gradient (nothing summed over ranks). The
    handle is kept by the communicator (closed by comm.close()).
    """
    handle = _handle_for(comm, "sigmoid", num_threads, tile_rows, tile_cols, nonfinite, 0, precision)
    q, k, s, t, labels = _sigmoid_args(q, k, logit_scale, logit_bias, labels)
    loss = handle._sigmoid_forward(q, k, s, t, labels, None)

    def backward(dloss=1.0):
        """SigmoidGrads(dq, dk, dlogit_scale, dlogit_bias): gradients of dloss * loss."""
        return handle._sigmoid_backward(q, k, s, t, labels, as_scalar_arg(dloss, "dloss"), True, True, True,
                                        True, None, None)

    return loss, backward


def sigmoid_value_and_grad(q, k, logit_scale, logit_bias, labels=None, *, comm=None, num_threads=0,
                           tile_rows=0, tile_cols=0, nonfinite="error", grad_dtype=None, precision="default"):
    """The sigmoid (SigLIP) loss and all its gradients in one pass (6 b c d
    FLOPs): SigmoidResult(loss, dq, dk, dlogit_scale, dlogit_bias).

    Arguments, loss convention (mean over the b rows), options and comm as
    for sigmoid_loss. dq (b, d), dk (c, d) in grad_dtype (None: the input
    dtype; "float32" for fp32 gradients of 16-bit inputs); loss, dlogit_scale
    = dL/ds and dlogit_bias = dL/dt float32. precision as for sigmoid_loss. For an upstream gradient g,
    multiply the results by g (or use sigmoid_loss's backward(g)).
    """
    handle = _handle_for(comm, "sigmoid", num_threads, tile_rows, tile_cols, nonfinite, 0, precision)
    q, k, s, t, labels = _sigmoid_args(q, k, logit_scale, logit_bias, labels)
    return handle._sigmoid_value_and_grad(q, k, s, t, labels, True, True, True, True, True, grad_dtype, None)
