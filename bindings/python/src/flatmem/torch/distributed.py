"""flatmem communicators for torch programs, and the slots the custom operators name them by.

A flatmem ring loss runs over a ``flatmem.Communicator`` (UCX between processes, host memory).
Two ways to get one in a torch program:

    comm = flatmem.torch.communicator()            # from the initialised default process group
    comm = flatmem.torch.communicator(group)       # ... or from another group
    comm = flatmem.torch.communicator_from_env()   # from torchrun's environment, no process group

``communicator(group)`` is collective over the group: rank 0 of the group makes the bootstrap id
(``flatmem.UniqueId``) and the group broadcasts its 128 bytes (``broadcast_object_list``, any
backend), then every rank joins. ``communicator_from_env()`` reads torchrun's RANK and WORLD_SIZE and
the coordinator ``FLATMEM_COORDINATOR=host:port``, or, when that is unset, MASTER_ADDR with port
MASTER_PORT + 1 (torchrun's store listens on MASTER_PORT itself).

Gradient convention: a ring loss returns the loss of the GLOBAL batch (identical on every rank) and
the exact gradient of that loss with respect to THIS rank's rows q_r, k_r, and the global gradient
of the scale and bias (identical on every rank): nothing is summed or averaged over ranks.
DistributedDataParallel then AVERAGES parameter gradients over the N ranks:

* a tower parameter's gradient is a sum over ranks of what each rank's rows contribute, so the
  average is 1/N of the global loss's gradient: the feature gradients need a factor N;
* logit_scale and logit_bias get N equal global gradients, whose average is already right: they
  need no factor (a factor N there made open_clip-style training drive the scale N times too fast).

``grad_scale=N`` in the functional calls multiplies the gradients of q and k only, which is exactly
that; ``flatmem.torch.ClipLoss`` / ``SigLipLoss`` pass it for you when they run the ring. With it,
every parameter's gradient under DDP is the single-process gradient of the concatenated batch (and
open_clip's under DDP with gather_with_grad=True). The returned loss value is never scaled.
"""
from __future__ import annotations

import os
import threading

import torch

from ..comm import Communicator, UniqueId

_lock = threading.Lock()
_by_slot: dict[int, Communicator] = {}
_next_slot = [1]


def slot(comm) -> int:
    """The integer the custom operators carry for `comm` (-1 for None). A communicator keeps its
    slot until it is closed; slots of closed ones are dropped at the next registration. The slot
    is kept on the communicator too (a plain attribute), so that torch.compile reads it as a
    constant of the graph: a communicator gets it here, the first time it is used, and from
    communicator() / communicator_from_env() and the loss modules when they are given or make one;
    one used for the first time inside a compiled function is a graph break (call slot(comm)
    once before compiling with fullgraph=True)."""
    if comm is None:
        return -1
    known = getattr(comm, _SLOT, None)
    if known is not None:
        return known
    return _register(comm)


def world_size(comm) -> int:
    """comm's world size (1 for None), readable under torch.compile once comm has a slot."""
    if comm is None:
        return 1
    slot(comm)
    return getattr(comm, _WORLD)


_SLOT, _WORLD = "_flatmem_torch_slot", "_flatmem_torch_world_size"


@torch.compiler.disable  # a lock and a SWIG call: eager, a graph break where it is traced
def _register(comm) -> int:
    if not isinstance(comm, Communicator):
        raise TypeError(f"flatmem.torch: comm must be a flatmem.Communicator (flatmem.torch.communicator()), "
                        f"not {type(comm).__name__}")
    with _lock:
        for s, c in list(_by_slot.items()):
            if c.closed:
                del _by_slot[s]
        s = _next_slot[0]
        _next_slot[0] += 1
        _by_slot[s] = comm
    setattr(comm, _WORLD, comm.world_size)
    setattr(comm, _SLOT, s)
    return s


def at(s: int):
    """The communicator of slot s (None for -1)."""
    if s < 0:
        return None
    with _lock:
        comm = _by_slot.get(s)
    if comm is None:
        raise RuntimeError(f"flatmem.torch: no communicator in slot {s} (it was closed)")
    return comm


def communicator(group=None, *, timeout_ms=0, connect_timeout_ms=0) -> Communicator:
    """A flatmem communicator of the ranks of an initialised torch.distributed process group (the
    default group when None), rank for rank. Collective over the group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flatmem.torch.communicator: torch.distributed is not initialised "
                           "(call torch.distributed.init_process_group first, or use communicator_from_env())")
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    src = dist.get_global_rank(group, 0) if group is not None else 0
    uid = UniqueId() if rank == 0 else None
    box = [bytes(uid) if uid is not None else None]
    dist.broadcast_object_list(box, src=src, group=group)
    comm = Communicator(rank, size, uid if uid is not None else UniqueId.from_bytes(box[0]),
                        timeout_ms=timeout_ms, connect_timeout_ms=connect_timeout_ms)
    slot(comm)
    return comm


def communicator_from_env(*, timeout_ms=0, connect_timeout_ms=0) -> Communicator:
    """A flatmem communicator from torchrun's environment (RANK, WORLD_SIZE) without a process
    group; the coordinator is FLATMEM_COORDINATOR, else MASTER_ADDR:(MASTER_PORT + 1)."""
    if not os.environ.get("FLATMEM_COORDINATOR"):
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not host or not port:
            raise RuntimeError("flatmem.torch.communicator_from_env: neither FLATMEM_COORDINATOR=host:port nor "
                               "torchrun's MASTER_ADDR / MASTER_PORT is set")
        os.environ["FLATMEM_COORDINATOR"] = f"{host}:{int(port) + 1}"
    comm = Communicator.from_env(timeout_ms=timeout_ms, connect_timeout_ms=connect_timeout_ms)
    slot(comm)
    return comm


__all__ = ["communicator", "communicator_from_env"]
