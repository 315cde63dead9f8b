"""flatmem: memory-flat training primitives, the Python binding of the C ABI.

    import numpy as np, flatmem
    loss, backward = flatmem.contrastive_loss(q, k, logit_scale=10.0)   # CLIP loss
    dq, dk, dlogit_scale = backward()

    seg = flatmem.ReversibleSegment([(flatmem.Block("attention", 64, heads=4), mlp)])
    y1, y2 = seg.forward(x1, x2)                                        # reversible segment
    dx1, dx2 = seg.backward(y1, y2, dy1, dy2)

    s = flatmem.CyclicSchedule(world_size=8, stages=4, steps=3)         # cyclic schedule
    s.offset(5), s.action(5, 7)                                         # pure queries

flatmem.capi is the SWIG module generated from bindings/swig/flatmem.i (the C
ABI one to one: Contrastive, ContrastiveOptions, Reversible, Block, Tensor,
CyclicSchedule, version(), ...);
importing it checks that the header it was built with matches the loaded
libflatmem. Failed calls raise flatmem.Error (subclasses per status, e.g.
InvalidArgumentError, also a ValueError) with flatmem's message.
"""
from . import capi
from .capi import (
    CommPoisonedError,
    CommTimeoutError,
    Error,
    InternalError,
    InvalidArgumentError,
    NonFiniteError,
    OutOfMemoryError,
    PeerFailureError,
    UnsupportedError,
    WorkspaceTooSmallError,
)
from .contrastive import Contrastive, ForwardResult, contrastive_loss
from .cyclic import CyclicAction, CyclicSchedule
from .reversible import Block, Context, Function, ReversibleSegment

__version__ = "0.1.0"


def library_version():
    """The loaded libflatmem's version, "MAJOR.MINOR.PATCH"."""
    return capi.version_string()


__all__ = [
    "Block",
    "CommPoisonedError",
    "CommTimeoutError",
    "Context",
    "Contrastive",
    "CyclicAction",
    "CyclicSchedule",
    "Error",
    "ForwardResult",
    "Function",
    "InternalError",
    "InvalidArgumentError",
    "NonFiniteError",
    "OutOfMemoryError",
    "PeerFailureError",
    "ReversibleSegment",
    "UnsupportedError",
    "WorkspaceTooSmallError",
    "capi",
    "contrastive_loss",
    "library_version",
]
