"""flatmem: memory-flat training primitives, the Python binding of the C ABI.

    import numpy as np, flatmem
    loss, backward = flatmem.contrastive_loss(q, k, logit_scale=10.0)   # CLIP loss
    dq, dk, dlogit_scale = backward()
    loss, backward = flatmem.sigmoid_loss(q, k, logit_scale=10.0, logit_bias=-10.0)  # SigLIP loss
    dq, dk, dlogit_scale, dlogit_bias = backward()

    seg = flatmem.ReversibleSegment([(flatmem.Block("attention", 64, heads=4), mlp)])
    y1, y2 = seg.forward(x1, x2)                                        # reversible segment
    dx1, dx2 = seg.backward(y1, y2, dy1, dy2)

    s = flatmem.CyclicSchedule(world_size=8, stages=4, steps=3)         # cyclic schedule
    s.offset(5), s.action(5, 7)                                         # pure queries

    comm = flatmem.Communicator.from_env()        # ranks over UCX (mpirun, srun, torchrun, ...)
    loss, backward = flatmem.contrastive_loss(q_r, k_r, 10.0, comm=comm)  # ring loss of the global batch
    with flatmem.Cyclic(comm, stages=4, steps=3) as cyc: ...           # cyclic data parallelism
    with flatmem.CyclicStages(comm, micro_batches=8, steps=3,           # one rank per stage
                              boundary_bytes=[4096] * 3) as h: ...

    flatmem.cpu_isa()                  # ('amx', 'amx'): CPU instruction set in use, best
    flatmem.cpu_engine()               # the kernels it runs: 'flatmem 0.2.0 own kernels at amx: ...'
    flatmem.set_cpu_isa("avx2")        # for the whole process; None: back to $FLATMEM_CPU_ISA

flatmem.capi is the SWIG module generated from bindings/swig/flatmem.i (the C
ABI one to one: Contrastive, ContrastiveOptions, Reversible, Block, Tensor,
CyclicSchedule, Communicator, Cyclic, CyclicStages, version(), ...);
importing it checks that the header it was built with matches the loaded
libflatmem. Failed calls raise flatmem.Error (subclasses per status, e.g.
InvalidArgumentError, also a ValueError) with flatmem's message; communicator
failures raise CommTimeoutError (a TimeoutError), PeerFailureError and
CommPoisonedError (ConnectionErrors).
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
from .comm import Communicator, Request, UniqueId
from .contrastive import (Contrastive, ForwardResult, SigmoidGrads, SigmoidResult, contrastive_loss,
                          sigmoid_loss, sigmoid_value_and_grad)
from .cpu import CPU_ISAS, cpu_engine, cpu_isa, set_cpu_isa
from .cyclic import (Cyclic, CyclicAction, CyclicRelaySummary, CyclicRelayTimeStep, CyclicSchedule, CyclicSummary,
                     CyclicTimeStepStats)
from .cyclic_stages import (CyclicStages, CyclicStagesAction, CyclicStagesOccupancy, CyclicStagesSchedule,
                            CyclicStagesSummary, CyclicStagesTimeStepStats)
from .reversible import Block, Context, Function, ReversibleSegment

__version__ = "0.2.0"


def library_version():
    """The loaded libflatmem's version, "MAJOR.MINOR.PATCH"."""
    return capi.version_string()


__all__ = [
    "Block",
    "CPU_ISAS",
    "CommPoisonedError",
    "CommTimeoutError",
    "Context",
    "Communicator",
    "Contrastive",
    "Cyclic",
    "CyclicAction",
    "CyclicRelaySummary",
    "CyclicRelayTimeStep",
    "CyclicSchedule",
    "CyclicStages",
    "CyclicStagesAction",
    "CyclicStagesOccupancy",
    "CyclicStagesSchedule",
    "CyclicStagesSummary",
    "CyclicStagesTimeStepStats",
    "CyclicSummary",
    "CyclicTimeStepStats",
    "Error",
    "ForwardResult",
    "Function",
    "InternalError",
    "InvalidArgumentError",
    "NonFiniteError",
    "OutOfMemoryError",
    "PeerFailureError",
    "Request",
    "ReversibleSegment",
    "SigmoidGrads",
    "SigmoidResult",
    "UniqueId",
    "UnsupportedError",
    "WorkspaceTooSmallError",
    "capi",
    "contrastive_loss",
    "cpu_engine",
    "cpu_isa",
    "library_version",
    "set_cpu_isa",
    "sigmoid_loss",
    "sigmoid_value_and_grad",
]
