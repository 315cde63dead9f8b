"""The torch custom operators (namespace ``flatmem``) over flatmem's contrastive handle.

Each operator is one C call on the inputs' device (CPU, or CUDA on torch's current stream), with
a fake implementation (shapes only, for torch.compile and meta tensors) and, for the forward
operators, an autograd formula that calls the backward operator:

    contrastive_forward   (q, k, s, labels?, ...)           -> (loss, row_lse, col_lse)
    contrastive_backward  (q, k, s, labels?, row_lse, col_lse, dloss, ...) -> (dq, dk, ds)
    sigmoid_forward       (q, k, s, t, labels?, ...)        -> loss                      [backward recomputes]
    sigmoid_value_and_grad(q, k, s, t, labels?, ...)        -> (loss, dq, dk, ds, dt)   [backward scales them]
    sigmoid_backward      (q, k, s, t, labels?, dloss, ...) -> (dq, dk, ds, dt)

A gradient the caller does not need is not computed (an empty tensor stands in its place). The
non-tensor arguments are plain values: ``comm`` is a communicator slot (distributed.slot; -1 =
this process alone), ``nonfinite`` is options.nonfinite (a flatmem_nonfinite_policy value; CUDA
tensors need FLATMEM_NONFINITE_PROPAGATE), ``grad_scale`` multiplies the gradients of q and k -- not those of the scale and bias,
which every rank of a ring already holds for the global batch (a ring under DDP, distributed.py),
``precision`` is options.fp32_precision (a flatmem_fp32_precision value). The entry points in
losses.py translate the names a user writes into these values, once (flatmem.contrastive.Options.of).
Gradients are first order only (the backward operators have no autograd of their own): every
formula hands its gradients through _bridge.first_order_only, so that a double backward
(create_graph=True, then a backward through those gradients) raises a RuntimeError naming the
operator rather than giving zeros.

The operators are defined with torch.library.Library (schema strings below) rather than
torch.library.custom_op, whose wrapper imports torch._dynamo (and sympy) at the first call: about
160 MB and a second or two in every process that never compiles anything.
"""
from typing import Optional

import torch
from torch import Tensor

from .. import capi
from ..contrastive import Options, kept_handle
from . import _bridge as br
from . import distributed as _dist

_F32 = torch.float32
_LIB = torch.library.Library("flatmem", "DEF")


def _op(schema):
    """Defines flatmem::<name> with this schema; the decorated function is its CPU and CUDA kernel."""
    def register(fn):
        name = schema.split("(")[0]
        _LIB.define(schema)
        for key in ("CPU", "CUDA"):
            _LIB.impl(name, fn, key)
        return fn
    return register


def _fake(name):
    return torch.library.register_fake(f"flatmem::{name}")


_SYMMETRIC, _INFONCE, _SIGMOID = capi.CONTRASTIVE_SYMMETRIC, capi.CONTRASTIVE_INFONCE, capi.CONTRASTIVE_SIGMOID


def _handle(loss: int, nonfinite: int, cache_bytes: int = 0, comm: int = -1, precision: int = 0):
    """The kept flatmem.Contrastive for these options, already C values (the entry points in
    losses.py translated the names, once): the calling thread's, or the ring's of the communicator
    in slot `comm`. Its CPU threads are torch's (torch.get_num_threads(): what torchrun's
    OMP_NUM_THREADS or torch.set_num_threads set), not all the machine's."""
    return kept_handle(Options(loss, torch.get_num_threads(), 0, 0, nonfinite, cache_bytes, precision),
                       _dist.at(comm))


def _rows(t: Tensor) -> int:
    return t.shape[0] if t.dim() > 0 else 1


def _new(shape, dtype, like: Tensor, name: str, stream: int):
    t = torch.empty(shape, dtype=dtype, device=like.device)
    return t, br.arg(t, name, stream)


def _gradient(want: bool, like: Tensor, name: str, stream: int):
    """A new gradient tensor shaped and typed like `like` (or an empty stand-in when not wanted)."""
    if not want:
        return torch.empty(0, dtype=like.dtype, device=like.device), None
    return _new(like.shape, like.dtype, like, name, stream)


def _tensor_of(a):
    return None if a is None else a.tensor


def _incoming(dloss: Tensor, grad_scale: float) -> Tensor:
    """The upstream gradient as the C calls take it: fp32, times grad_scale."""
    g = dloss.to(_F32)
    return g * grad_scale if grad_scale != 1.0 else g


def _scalar_gradient(d: Tensor, grad_scale: float, shape) -> Tensor:
    """A scale or bias gradient from a C call that took dloss * grad_scale, as the gradient of
    dloss alone: grad_scale is for the feature gradients only (distributed.py: every rank already
    holds the global dL/ds and dL/dt; DDP's average of N equal values must stay that value)."""
    return (d / grad_scale if grad_scale != 1.0 else d).reshape(shape)


# ---------------------------------------------------------------------------------------------
# The softmax losses: CLIP (symmetric) and InfoNCE
# ---------------------------------------------------------------------------------------------

@_op("contrastive_forward(Tensor q, Tensor k, Tensor logit_scale, Tensor? labels, bool symmetric, "
     "int cache_bytes, int comm, int nonfinite, float grad_scale, int precision) -> (Tensor, Tensor, Tensor)")
def contrastive_forward(q: Tensor, k: Tensor, logit_scale: Tensor, labels: Optional[Tensor], symmetric: bool,
                        cache_bytes: int, comm: int, nonfinite: int,
                        grad_scale: float, precision: int) -> tuple[Tensor, Tensor, Tensor]:
    stream = br.stream_of(q.device)
    handle = _handle(_SYMMETRIC if symmetric else _INFONCE, nonfinite, cache_bytes, comm, precision)
    Q, K, S = br.arg(q, "q", stream), br.arg(k, "k", stream), br.arg(logit_scale, "logit_scale", stream)
    L = br.optional_arg(labels, "labels", stream)
    loss, loss_t = _new((), _F32, q, "loss", stream)
    row, row_t = _new((_rows(q),), _F32, q, "row_lse", stream)
    col, col_t = torch.empty(0, dtype=_F32, device=q.device), None
    if symmetric:
        col, col_t = _new((_rows(k),), _F32, q, "col_lse", stream)
    with handle.locked() as h:
        ws = br.workspace(h.forward_workspace_size(Q.tensor, K.tensor), q.device, stream) if q.is_cuda else None
        h.forward(Q.tensor, K.tensor, _tensor_of(L), S.tensor, loss_t.tensor, row_t.tensor, _tensor_of(col_t),
                  _tensor_of(ws), stream)
    return loss, row, col


@_fake("contrastive_forward")
def _(q, k, logit_scale, labels, symmetric, cache_bytes, comm, nonfinite, grad_scale, precision):
    col = q.new_empty((k.shape[0],), dtype=_F32) if symmetric else q.new_empty((0,), dtype=_F32)
    return q.new_empty((), dtype=_F32), q.new_empty((q.shape[0],), dtype=_F32), col


@_op("contrastive_backward(Tensor q, Tensor k, Tensor logit_scale, Tensor? labels, Tensor row_lse, "
     "Tensor col_lse, Tensor dloss, bool symmetric, bool want_dq, bool want_dk, int cache_bytes, "
     "int comm, int nonfinite, int precision) -> (Tensor, Tensor, Tensor)")
def contrastive_backward(q: Tensor, k: Tensor, logit_scale: Tensor, labels: Optional[Tensor], row_lse: Tensor,
                         col_lse: Tensor, dloss: Tensor, symmetric: bool, want_dq: bool, want_dk: bool,
                         cache_bytes: int, comm: int, nonfinite: int,
                         precision: int) -> tuple[Tensor, Tensor, Tensor]:
    stream = br.stream_of(q.device)
    handle = _handle(_SYMMETRIC if symmetric else _INFONCE, nonfinite, cache_bytes, comm, precision)
    Q, K, S = br.arg(q, "q", stream), br.arg(k, "k", stream), br.arg(logit_scale, "logit_scale", stream)
    L = br.optional_arg(labels, "labels", stream)
    R = br.arg(row_lse, "row_lse", stream)
    C = br.arg(col_lse, "col_lse", stream) if symmetric else None
    G = br.arg(dloss, "dloss", stream)
    dq, dq_t = _gradient(want_dq, q, "dq", stream)
    dk, dk_t = _gradient(want_dk, k, "dk", stream)
    ds, ds_t = _new((), _F32, q, "dlogit_scale", stream)
    with handle.locked() as h:
        ws = None
        if q.is_cuda:
            ws = br.workspace(h.backward_workspace_size(Q.tensor, K.tensor, _tensor_of(dq_t), _tensor_of(dk_t)),
                              q.device, stream)
        h.backward(Q.tensor, K.tensor, _tensor_of(L), S.tensor, R.tensor, _tensor_of(C), G.tensor,
                   _tensor_of(dq_t), _tensor_of(dk_t), ds_t.tensor, _tensor_of(ws), stream)
    return dq, dk, ds


@_fake("contrastive_backward")
def _(q, k, logit_scale, labels, row_lse, col_lse, dloss, symmetric, want_dq, want_dk, cache_bytes, comm,
      nonfinite, precision):
    dq = torch.empty_like(q) if want_dq else q.new_empty((0,))
    dk = torch.empty_like(k) if want_dk else k.new_empty((0,))
    return dq, dk, q.new_empty((), dtype=_F32)


def _contrastive_setup(ctx, inputs, output):
    q, k, s, labels, symmetric, cache_bytes, comm, nonfinite, grad_scale, precision = inputs
    _, row, col = output
    ctx.save_for_backward(q, k, s, labels, row, col)
    ctx.options = (symmetric, cache_bytes, comm, nonfinite, grad_scale, precision)


def _contrastive_grad(ctx, dloss, _drow, _dcol):
    q, k, s, labels, row, col = ctx.saved_tensors
    symmetric, cache_bytes, comm, nonfinite, grad_scale, precision = ctx.options
    want_dq, want_dk, want_ds = ctx.needs_input_grad[:3]
    g = _incoming(dloss, grad_scale)
    dq, dk, ds = torch.ops.flatmem.contrastive_backward(q, k, s, labels, row, col, g, symmetric, want_dq,
                                                        want_dk, cache_bytes, comm, nonfinite, precision)
    grads = br.first_order_only("flatmem::contrastive_forward", dq if want_dq else None, dk if want_dk else None,
                                _scalar_gradient(ds, grad_scale, s.shape) if want_ds else None)
    return (*grads, None, None, None, None, None, None, None)


torch.library.register_autograd("flatmem::contrastive_forward", _contrastive_grad,
                                setup_context=_contrastive_setup)


# ---------------------------------------------------------------------------------------------
# The sigmoid (SigLIP) loss
# ---------------------------------------------------------------------------------------------

def _sigmoid_args(q, k, s, t, labels, stream):
    return (br.arg(q, "q", stream), br.arg(k, "k", stream), br.arg(s, "logit_scale", stream),
            br.arg(t, "logit_bias", stream), br.optional_arg(labels, "labels", stream))


def _sigmoid_gradients(want_dq: bool, want_dk: bool, q: Tensor, k: Tensor, stream: int):
    """(tensor, Arg) pairs of the sigmoid calls' gradient outputs: dq, dk (or stand-ins), ds, dt."""
    return (_gradient(want_dq, q, "dq", stream), _gradient(want_dk, k, "dk", stream),
            _new((), _F32, q, "dlogit_scale", stream), _new((), _F32, q, "dlogit_bias", stream))


def _sigmoid_workspace(h, Q, K, dq_t, dk_t, device, stream):
    if device.type != "cuda":
        return None
    return br.workspace(h.sigmoid_workspace_size(Q.tensor, K.tensor, _tensor_of(dq_t), _tensor_of(dk_t)),
                        device, stream)


@_op("sigmoid_forward(Tensor q, Tensor k, Tensor logit_scale, Tensor logit_bias, Tensor? labels, "
     "int comm, int nonfinite, float grad_scale, int precision) -> Tensor")
def sigmoid_forward(q: Tensor, k: Tensor, logit_scale: Tensor, logit_bias: Tensor, labels: Optional[Tensor],
                    comm: int, nonfinite: int, grad_scale: float, precision: int) -> Tensor:
    stream = br.stream_of(q.device)
    Q, K, S, T, L = _sigmoid_args(q, k, logit_scale, logit_bias, labels, stream)
    loss, loss_t = _new((), _F32, q, "loss", stream)
    with _handle(_SIGMOID, nonfinite, 0, comm, precision).locked() as h:
        ws = _sigmoid_workspace(h, Q, K, None, None, q.device, stream)
        h.sigmoid_forward(Q.tensor, K.tensor, _tensor_of(L), S.tensor, T.tensor, loss_t.tensor, _tensor_of(ws),
                          stream)
    return loss


@_fake("sigmoid_forward")
def _(q, k, logit_scale, logit_bias, labels, comm, nonfinite, grad_scale, precision):
    return q.new_empty((), dtype=_F32)


@_op("sigmoid_backward(Tensor q, Tensor k, Tensor logit_scale, Tensor logit_bias, Tensor? labels, "
     "Tensor dloss, bool want_dq, bool want_dk, int comm, int nonfinite, int precision) -> (Tensor, Tensor, "
     "Tensor, Tensor)")
def sigmoid_backward(q: Tensor, k: Tensor, logit_scale: Tensor, logit_bias: Tensor, labels: Optional[Tensor],
                     dloss: Tensor, want_dq: bool, want_dk: bool, comm: int,
                     nonfinite: int, precision: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    stream = br.stream_of(q.device)
    Q, K, S, T, L = _sigmoid_args(q, k, logit_scale, logit_bias, labels, stream)
    G = br.arg(dloss, "dloss", stream)
    (dq, dq_t), (dk, dk_t), (ds, ds_t), (dt, dt_t) = _sigmoid_gradients(want_dq, want_dk, q, k, stream)
    with _handle(_SIGMOID, nonfinite, 0, comm, precision).locked() as h:
        ws = _sigmoid_workspace(h, Q, K, dq_t, dk_t, q.device, stream)
        h.sigmoid_backward(Q.tensor, K.tensor, _tensor_of(L), S.tensor, T.tensor, G.tensor, _tensor_of(dq_t),
                           _tensor_of(dk_t), ds_t.tensor, dt_t.tensor, _tensor_of(ws), stream)
    return dq, dk, ds, dt


@_fake("sigmoid_backward")
def _(q, k, logit_scale, logit_bias, labels, dloss, want_dq, want_dk, comm, nonfinite, precision):
    dq = torch.empty_like(q) if want_dq else q.new_empty((0,))
    dk = torch.empty_like(k) if want_dk else k.new_empty((0,))
    return dq, dk, q.new_empty((), dtype=_F32), q.new_empty((), dtype=_F32)


def _sigmoid_setup(ctx, inputs, output):
    q, k, s, t, labels, comm, nonfinite, grad_scale, precision = inputs
    ctx.save_for_backward(q, k, s, t, labels)
    ctx.options = (comm, nonfinite, grad_scale, precision)


def _sigmoid_grad(ctx, dloss):
    q, k, s, t, labels = ctx.saved_tensors
    comm, nonfinite, grad_scale, precision = ctx.options
    want = ctx.needs_input_grad
    g = _incoming(dloss, grad_scale)
    dq, dk, ds, dt = torch.ops.flatmem.sigmoid_backward(q, k, s, t, labels, g, want[0], want[1], comm, nonfinite,
                                                        precision)
    grads = br.first_order_only("flatmem::sigmoid_forward", dq if want[0] else None, dk if want[1] else None,
                                _scalar_gradient(ds, grad_scale, s.shape) if want[2] else None,
                                _scalar_gradient(dt, grad_scale, t.shape) if want[3] else None)
    return (*grads, None, None, None, None, None)


torch.library.register_autograd("flatmem::sigmoid_forward", _sigmoid_grad, setup_context=_sigmoid_setup)


@_op("sigmoid_value_and_grad(Tensor q, Tensor k, Tensor logit_scale, Tensor logit_bias, "
     "Tensor? labels, int comm, int nonfinite, float grad_scale, int precision) -> (Tensor, Tensor, Tensor, "
     "Tensor, Tensor)")
def sigmoid_value_and_grad(q: Tensor, k: Tensor, logit_scale: Tensor, logit_bias: Tensor,
                           labels: Optional[Tensor], comm: int, nonfinite: int, grad_scale: float,
                           precision: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    stream = br.stream_of(q.device)
    Q, K, S, T, L = _sigmoid_args(q, k, logit_scale, logit_bias, labels, stream)
    loss, loss_t = _new((), _F32, q, "loss", stream)
    (dq, dq_t), (dk, dk_t), (ds, ds_t), (dt, dt_t) = _sigmoid_gradients(True, True, q, k, stream)
    with _handle(_SIGMOID, nonfinite, 0, comm, precision).locked() as h:
        ws = _sigmoid_workspace(h, Q, K, dq_t, dk_t, q.device, stream)
        h.sigmoid_value_and_grad(Q.tensor, K.tensor, _tensor_of(L), S.tensor, T.tensor, loss_t.tensor, dq_t.tensor,
                                 dk_t.tensor, ds_t.tensor, dt_t.tensor, _tensor_of(ws), stream)
    return loss, dq, dk, ds, dt


@_fake("sigmoid_value_and_grad")
def _(q, k, logit_scale, logit_bias, labels, comm, nonfinite, grad_scale, precision):
    scalar = q.new_empty((), dtype=_F32)
    return scalar, torch.empty_like(q), torch.empty_like(k), q.new_empty((), dtype=_F32), q.new_empty((), dtype=_F32)


def _saved_setup(ctx, inputs, output):
    _, _, s, t, _, _, _, grad_scale, _ = inputs
    _, dq, dk, ds, dt = output
    ctx.save_for_backward(dq, dk, ds, dt)
    ctx.shapes = (s.shape, t.shape)
    ctx.grad_scale = grad_scale


def _is_one(g: Tensor) -> bool:
    """Whether the incoming gradient is exactly 1 on the CPU (loss.backward()): then the saved dq
    and dk are the gradients themselves, handed on without a copy. Asked of plain eager tensors
    only: not while tracing (fake and functional tensors are subclasses; the test would be data
    dependent) nor of a CUDA scalar (a device sync)."""
    return (type(g) is torch.Tensor and g.device.type == "cpu" and not torch.compiler.is_compiling()
            and g.item() == 1.0)


def _saved_grad(ctx, dloss, *_unused):
    """The gradients the forward computed, times the incoming one (exact for g = 1); grad_scale
    multiplies the feature gradients only (_scalar_gradient)."""
    dq, dk, ds, dt = ctx.saved_tensors
    want = ctx.needs_input_grad
    g = _incoming(dloss, ctx.grad_scale)
    g_scalar = _incoming(dloss, 1.0)
    s_shape, t_shape = ctx.shapes
    if _is_one(g):
        dq_g, dk_g = dq, dk
    else:
        dq_g, dk_g = (dq * g).to(dq.dtype), (dk * g).to(dk.dtype)
    # Under create_graph=True the saved dq, dk, ds, dt are this node's own outputs: a second
    # backward through them would come back here as their (ignored) incoming gradients and give
    # part of the truth silently; first_order_only stops it with an error instead.
    grads = br.first_order_only("flatmem::sigmoid_value_and_grad", dq_g if want[0] else None,
                                dk_g if want[1] else None, (ds * g_scalar).reshape(s_shape) if want[2] else None,
                                (dt * g_scalar).reshape(t_shape) if want[3] else None)
    return (*grads, None, None, None, None, None)


torch.library.register_autograd("flatmem::sigmoid_value_and_grad", _saved_grad, setup_context=_saved_setup)
