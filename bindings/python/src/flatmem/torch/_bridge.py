"""torch tensors as the C API sees them, without copies.

* Inputs go through DLPack (``Tensor.__dlpack__``): the library reads torch's
  memory in place. A CUDA tensor is exported for the stream the call runs on
  (torch's current stream of its device), which is the stream flatmem
  enqueues on, so nothing waits.
* Outputs are allocated by torch (its caching allocator on CUDA) and exported
  the same way: the library writes into them, and they are returned as they
  are.
* Workspace on CUDA is a torch uint8 tensor of the size flatmem's query gives
  (torch's allocator stays in charge of device memory); on the CPU the handle
  keeps its own.

Layout: the library takes row-strided matrices (rows any distance apart,
elements of a row adjacent). A tensor whose last dimension is not unit-stride
(a transposed or expanded view) is made contiguous here, once -- and only for
layouts the C API cannot describe.

Dtype: the library takes q and k in one dtype. Two different feature dtypes
(a bf16 image tower next to an fp32 text tower) are promoted as torch promotes
them (features()); the other copy this module makes, and only for such a pair.

Gradients are first order: every backward formula hands its gradients through
first_order_only, which lets a second backward (create_graph=True, then
differentiating those gradients) fail with a message instead of giving silent
zeros.
"""
from __future__ import annotations

import torch

from .._tensors import from_dlpack, from_dlpack_for_stream

FEATURE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def stream_of(device: torch.device) -> int:
    """The cudaStream_t (as an int) a call on `device` runs on: torch's current
    stream of that device; 0 on the CPU."""
    if device.type == "cuda":
        return torch.cuda.current_stream(device).cuda_stream
    return 0


def arg(t: torch.Tensor, name: str, stream: int):
    """The flatmem Arg of a torch tensor (no copy; the Arg keeps it alive)."""
    t = t.detach()  # __dlpack__ refuses tensors that require grad; same storage
    if t.device.type == "cuda":
        return from_dlpack_for_stream(t, name, stream)
    return from_dlpack(t, name)


def optional_arg(t, name: str, stream: int):
    return None if t is None else arg(t, name, stream)


def matrix(t, name: str) -> torch.Tensor:
    """A feature matrix as the library takes it: rows any distance apart,
    elements of a row adjacent; another layout (a transposed or expanded
    view) is made contiguous. Dtype, ndim and device are the library's to
    judge (its messages name the argument)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"flatmem.torch: {name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dim() != 2:
        return t
    rows_apart = t.shape[0] <= 1 or t.stride(0) >= t.shape[1]
    elements_adjacent = t.shape[1] <= 1 or t.stride(1) == 1
    return t if rows_apart and elements_adjacent else t.contiguous()


def features(q, k):
    """The feature matrices q and k as the library takes them: each as matrix() makes it, and
    both in one dtype. Two different dtypes among FEATURE_DTYPES are promoted as torch promotes
    them, torch.promote_types (bfloat16 or float16 with float32 -> float32, float16 with
    bfloat16 -> float32): the dtype open_clip computes such a pair's logits in. Widening is
    exact, so the results are those of the promoted inputs; autograd's cast hands each gradient
    back in its own input's dtype. Equal dtypes pass as they are (no copy, no cast); any other
    dtype (float64, an integer) passes too, for the library to refuse naming the argument."""
    q, k = matrix(q, "q"), matrix(k, "k")
    if q.dtype != k.dtype and q.dtype in FEATURE_DTYPES and k.dtype in FEATURE_DTYPES:
        common = torch.promote_types(q.dtype, k.dtype)
        q, k = matrix(q.to(common), "q"), matrix(k.to(common), "k")  # .to() of the wider one: itself
    return q, k


def scalar(x, like: torch.Tensor, name: str) -> torch.Tensor:
    """A one-element float32 tensor on like's device: a number becomes a
    constant, a tensor is cast (autograd carries the cast) and moved."""
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise ValueError(f"flatmem.torch: {name} must have one element, got shape {tuple(x.shape)}")
        return x.reshape(()).to(device=like.device, dtype=torch.float32)
    return torch.tensor(float(x), dtype=torch.float32, device=like.device)


def labels_tensor(labels, q: torch.Tensor):
    """Labels as the library takes them: int64 on q's device, or None."""
    if labels is None:
        return None
    if not isinstance(labels, torch.Tensor):
        labels = torch.as_tensor(labels)
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise TypeError(f"flatmem.torch: labels must be integers, not {labels.dtype}")
    return labels.to(device=q.device, dtype=torch.int64).contiguous()


def workspace(nbytes: int, device: torch.device, stream: int):
    """A uint8 workspace tensor for a CUDA call (None on the CPU or for 0 bytes)."""
    if device.type != "cuda" or nbytes == 0:
        return None
    return arg(torch.empty(nbytes, dtype=torch.uint8, device=device), "workspace", stream)


class _FirstOrderOnly(torch.autograd.Function):
    """The identity on a flatmem backward's gradients whose own backward raises: the node a second
    backward meets where flatmem has no formula."""

    @staticmethod
    def forward(what, *grads):
        # Aliases, not copies: a custom Function's output that is its input is returned as a view
        # of it (what torch itself does with an input returned unchanged).
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.what = inputs[0]

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError(
            f"flatmem.torch: {ctx.what} is differentiable once: its gradients have no gradient of their "
            f"own, so double backward (create_graph=True and a second backward through them, as in "
            f"a gradient penalty on this loss or a Hessian-vector product) is not supported; a second "
            f"backward that does not pass through flatmem's gradients works")


def first_order_only(what: str, *grads):
    """The gradients a flatmem backward formula returns, made safe against double backward.

    A flatmem operator's backward is a C call that torch cannot differentiate; under
    ``torch.autograd.grad(..., create_graph=True)`` its results would silently act as constants
    (a second backward through them gives zeros, or only part of the truth where the formula also
    multiplies by the incoming gradient). Here, when grad mode is on -- a backward run with
    create_graph=True -- each tensor among `grads` goes through an identity autograd node whose
    backward raises a RuntimeError naming `what` (the operator, e.g. "flatmem::contrastive_forward").
    Otherwise (loss.backward(), and torch.compile's traced backward, both run with grad mode off)
    they are returned unchanged, at no cost. None entries stay None; returns a tuple as long as
    `grads`. Every flatmem autograd formula returns its gradients through this (one of
    ``return first_order_only(what, *grads)``), so that the first derivative stays usable under
    create_graph=True (a gradient penalty on another term) and the second fails loudly."""
    if not torch.is_grad_enabled():
        return grads
    at = [i for i, g in enumerate(grads) if isinstance(g, torch.Tensor)]
    if not at:
        return grads
    wrapped = _FirstOrderOnly.apply(what, *(grads[i] for i in at))
    out = list(grads)
    for i, g in zip(at, wrapped):
        out[i] = g
    return tuple(out)
