"""flatmem: memory-flat training primitives, the Python binding of the C ABI.

    import numpy as np, flatmem
    loss, backward = flatmem.contrastive_loss(q, k, logit_scale=10.0)   # CLIP loss
    dq, dk, dlogit_scale = backward()

flatmem.capi is the SWIG module generated from bindings/swig/flatmem.i (the C
ABI one to one: Contrastive, ContrastiveOptions, Tensor, version(), ...);
importing it checks that the header it was built with matches the loaded
libflatmem. Failed calls raise flatmem.Error (subclasses per status, e.g.
InvalidArgumentError, also a ValueError) with flatmem's message.
"""
from . import capi
from .capi import (
    Error,
    InternalError,
    InvalidArgumentError,
    NonFiniteError,
    OutOfMemoryError,
    UnsupportedError,
    WorkspaceTooSmallError,
)
from .contrastive import Contrastive, ForwardResult, contrastive_loss

__version__ = "0.1.0"


def library_version():
    """The loaded libflatmem's version, "MAJOR.MINOR.PATCH"."""
    return capi.version_string()


__all__ = [
    "Contrastive",
    "Error",
    "ForwardResult",
    "InternalError",
    "InvalidArgumentError",
    "NonFiniteError",
    "OutOfMemoryError",
    "UnsupportedError",
    "WorkspaceTooSmallError",
    "capi",
    "contrastive_loss",
    "library_version",
]
