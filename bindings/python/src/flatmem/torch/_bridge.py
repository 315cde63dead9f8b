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
(a transposed or expanded view) is made contiguous here, once -- the one copy
this module ever makes, and only for layouts the C API cannot describe.
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
