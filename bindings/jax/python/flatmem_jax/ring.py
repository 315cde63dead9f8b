"""The contrastive losses across processes: flatmem's ring over a flatmem
communicator, inside jitted JAX programs (the way mpi4jax puts MPI in XLA:
the custom call owns the communication; the communicator is named by an
attribute).

    import flatmem_jax
    comm = flatmem_jax.ring.initialize()       # once per process, collective
    loss_and_grads = jax.jit(jax.value_and_grad(
        lambda q, k, s: flatmem_jax.clip_loss(q, k, s, comm=comm), argnums=(0, 1, 2)))
    loss, (dq, dk, ds) = loss_and_grads(q_r, k_r, s)   # this rank's shard
    total = comm.all_reduce(local_sum)                 # sum over ranks, jit-able too

Model
    One process per rank (per device), each running JAX on its own. Each rank
    traces and runs THE SAME program: every ring call (clip_loss / infonce_loss
    / sigmoid_loss with comm=..., their backward, RingComm.all_reduce) is collective --
    every rank makes it, in the same order. XLA may reorder custom calls that
    do not depend on each other by data, and JAX may run two dispatched
    programs at once: keep a program's ring calls ordered by data (a loss
    and its gradient are; two unrelated ring losses in one program are not:
    add one loss to the other first, or make two programs) and let a
    program's results be used before the next one is dispatched (a training
    step reading the last step's parameters does). Calls on one communicator
    are serialised (flatmem's thread rule).

The global batch (flatmem.h, "Ring across ranks")
    Rank r passes its rows q_r (b_r, d) and its columns k_r (c_r, d); the
    loss is that of the concatenation in rank order, q = [q_0; q_1; ...]
    (B, d), k = [k_0; k_1; ...] (C, d). clip_loss: b_r = c_r on every rank
    (ranks may hold different counts). infonce_loss: labels (b_r,) are
    GLOBAL column indices in [0, C) -- a positive may live on any rank --
    or None (row g's positive is column g: R_r + b_r <= C). Every rank
    passes the same d, dtype and logit scale (bitwise), and the same
    precision= (flatmem checks it with the rest).

Values and gradients
    The loss is L of the global batch (the mean over the B rows), the same
    bits on every rank. jax.grad gives this rank's rows of the EXACT
    gradients of the global mean: dq = dL/dq_r, dk = dL/dk_r, and the logit
    scale's gradient dL/ds, identical on every rank -- nothing is summed or
    to be summed over ranks. A model's parameter gradient on rank r covers
    only its own rows: the global parameter gradient is the SUM over ranks of
    the per-rank ones (comm.all_reduce), except for parameters only the
    scale depends on (a learnable log scale: its gradient is already the
    global one on every rank; do not sum it; likewise the sigmoid loss's
    bias, whose dL/dt is global too). The results agree with the
    single-process loss of the concatenated batch to rounding (the sums run
    in another order; with one rank they are bitwise the same).

Failures
    A rank whose arguments flatmem refuses (a different logit scale, d or
    dtype; labels out of range; NaN/Inf) fails with its message, and every
    other rank fails too, naming it. A rank that dies or stalls makes the
    others fail within the communicator's timeout (timeout_ms, default
    $FLATMEM_COMM_TIMEOUT_MS, else 60 s) with FLATMEM_STATUS_PEER_FAILURE or
    _TIMEOUT. The error is XLA's (jax.errors.JaxRuntimeError, text
    "...: FLATMEM_STATUS_...: <flatmem's message>") when the program runs or
    its result is read. The communicator is then poisoned: every later call
    fails at once with FLATMEM_STATUS_COMM_POISONED; close or abort it.

Platforms
    CPU buffers: the ring runs over the communicator's host transport.
    XLA:GPU (CUDA handlers, libflatmem_jax built with nvcc): call
    comm.init_device(cuda_device) once on every rank (collective; the NCCL
    device transport on this rank's GPU), then the ring losses run on the
    device buffers: tile kernels on XLA's stream, blocks over NCCL. Without
    init_device they fail naming options.comm. The ring keeps its transit
    buffers in device memory it allocates itself (cudaMalloc, outside XLA's
    preallocated pool: leave room, e.g. XLA_PYTHON_CLIENT_MEM_FRACTION=.7),
    and it synchronises XLA's stream once per call. The CUDA ring has not
    yet run on a GPU in flatmem's own tests (compiled only). all_reduce sums
    host buffers only (XLA:GPU: UNIMPLEMENTED).

Creating the communicator: initialize() (below). Its UCX transport reads
UCX's own environment (UCX_TLS, UCX_NET_DEVICES, ...; on one host e.g.
UCX_TLS=tcp,self,posix UCX_NET_DEVICES=lo; embedded in Python also
UCX_ERROR_SIGNALS= and UCX_HANDLE_ERRORS=none).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import threading

import jax
import jax.numpy as jnp
import numpy as np

from . import FlatmemError, _lib

__all__ = ["RingComm", "initialize", "communicator", "finalize"]

_lib.flatmem_jax_comm_create_from_env.restype = ctypes.c_int
_lib.flatmem_jax_comm_create_from_env.argtypes = [
    ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p,
    ctypes.c_size_t]
_lib.flatmem_jax_comm_rank.restype = ctypes.c_int
_lib.flatmem_jax_comm_rank.argtypes = [
    ctypes.c_int64, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32),
    ctypes.c_char_p, ctypes.c_size_t]
_lib.flatmem_jax_comm_health.restype = ctypes.c_int
_lib.flatmem_jax_comm_health.argtypes = [ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
_lib.flatmem_jax_comm_barrier.restype = ctypes.c_int
_lib.flatmem_jax_comm_barrier.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p,
                                          ctypes.c_size_t]
_lib.flatmem_jax_comm_init_device.restype = ctypes.c_int
_lib.flatmem_jax_comm_init_device.argtypes = [ctypes.c_int64, ctypes.c_int32, ctypes.c_int64,
                                              ctypes.c_char_p, ctypes.c_size_t]
_lib.flatmem_jax_comm_close.restype = ctypes.c_int
_lib.flatmem_jax_comm_close.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_char_p,
                                        ctypes.c_size_t]

# Dtypes flatmem's host all-reduce sums (comm.h).
_ALL_REDUCE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32),
                      np.dtype(np.int64))


def _checked(function, *args):
    """Calls a flatmem_jax_comm_* function (message buffer appended); raises
    FlatmemError with flatmem's status and message on failure."""
    message = ctypes.create_string_buffer(2048)
    status = function(*args, message, len(message))
    if status != 0:
        name, _, text = message.value.decode(errors="replace").partition(": ")
        raise FlatmemError(name, text)


def _milliseconds(name, value) -> int:
    value = int(value)
    if value < 0:
        raise ValueError(f"flatmem_jax: {name} must be >= 0 milliseconds (0 = default), not {value}")
    return value


class RingComm:
    """A flatmem communicator of this process (one rank), for the ring
    losses (clip_loss / infonce_loss / sigmoid_loss with comm=...) and all_reduce.

    Made by initialize() or RingComm.from_env(); collective creation. The
    custom calls name it by ``slot``, a small index into libflatmem_jax's
    registry (not a pointer). close() (orderly) or abort() (tells the peers
    to fail now) releases it; open communicators are closed at interpreter
    exit. Thread rule: any thread; calls on one communicator are serialised.
    """

    def __init__(self, slot: int):
        # Use from_env() / initialize(); this wraps an existing registry slot.
        self._slot = int(slot)
        self._closed = False
        rank, size = ctypes.c_int32(-1), ctypes.c_int32(0)
        _checked(_lib.flatmem_jax_comm_rank, self._slot, ctypes.byref(rank), ctypes.byref(size))
        self._rank, self._world_size = rank.value, size.value
        _open.add(self)

    @classmethod
    def from_env(cls, *, timeout_ms: int = 0, connect_timeout_ms: int = 0) -> "RingComm":
        """flatmem_comm_create_from_env (collective): FLATMEM_COORDINATOR=host:port
        (required; rank 0 listens there, the others connect), FLATMEM_RANK /
        FLATMEM_WORLD_SIZE or a launcher's variables (OMPI_COMM_WORLD_RANK/_SIZE,
        PMI_RANK/_SIZE, SLURM_PROCID/NTASKS, RANK/WORLD_SIZE).

        timeout_ms: deadline of every wait of every later call (0 =
        $FLATMEM_COMM_TIMEOUT_MS, else 60000); connect_timeout_ms: how long
        creation waits for all ranks (0 = 120000). Raises FlatmemError
        (e.g. INVALID_ARGUMENT naming a missing variable, TIMEOUT naming the
        ranks that never came)."""
        slot = ctypes.c_int64(-1)
        _checked(_lib.flatmem_jax_comm_create_from_env,
                 _milliseconds("timeout_ms", timeout_ms),
                 _milliseconds("connect_timeout_ms", connect_timeout_ms), ctypes.byref(slot))
        return cls(slot.value)

    @property
    def slot(self) -> int:
        """The registry slot the custom calls carry as their ``comm`` attribute."""
        if self._closed:
            raise ValueError(f"flatmem_jax: comm: this RingComm (slot {self._slot}) was closed")
        return self._slot

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def closed(self) -> bool:
        return self._closed

    def health(self) -> None:
        """Returns while the communicator is healthy; raises FlatmemError with
        the status that poisoned it (TIMEOUT, PEER_FAILURE, ...) otherwise."""
        _checked(_lib.flatmem_jax_comm_health, self.slot)

    def barrier(self, timeout_ms: int = 0) -> None:
        """Every rank reaches this call before any returns (collective, host
        side, outside any program); at most timeout_ms (0 = the default)."""
        _checked(_lib.flatmem_jax_comm_barrier, self.slot, _milliseconds("timeout_ms", timeout_ms))

    def init_device(self, cuda_device: int, timeout_ms: int = 0) -> None:
        """flatmem_comm_init_device (collective): creates the communicator's
        NCCL device transport on CUDA device ``cuda_device`` (this rank's GPU,
        e.g. ``jax.local_devices()[0].id``), which the ring losses on XLA:GPU
        move their blocks with. Once per communicator, on every rank; at most
        timeout_ms (0 = the default). Raises FlatmemError (UNSUPPORTED in a
        flatmem built without NCCL, TIMEOUT, ...)."""
        _checked(_lib.flatmem_jax_comm_init_device, self.slot, int(cuda_device),
                 _milliseconds("timeout_ms", timeout_ms))

    def all_reduce(self, x):
        """The sum over ranks of x (collective), as a custom call: works
        eagerly and under jit. x: float32, float64, int32 or int64 (int64 /
        float64 need jax x64), any shape, the same on every rank; returns the
        same shape and dtype, bitwise the same on every rank (flatmem sums in
        a fixed order). Not differentiable. CPU only (XLA:GPU: UNIMPLEMENTED).
        Example: the parameter gradients of a data-parallel step,
        ``jax.tree.map(comm.all_reduce, grads)``."""
        x = jnp.asarray(x)
        if np.dtype(x.dtype) not in _ALL_REDUCE_DTYPES:
            raise TypeError(f"flatmem_jax: all_reduce: x has dtype {x.dtype}; flatmem sums "
                            "float32, float64, int32 and int64")
        # Imported here: flatmem_jax imports this module at its end.
        from . import _call
        (out,) = _call("flatmem_ring_all_reduce", [jax.ShapeDtypeStruct(x.shape, x.dtype)], (x,),
                       None, dict(comm=np.int64(self.slot)))
        return out

    def close(self) -> None:
        """Releases the communicator (flatmem_comm_destroy: orderly -- what this
        rank sent is flushed, the peers are told it left) and its ring
        handles, after a call in progress on it. Not collective. Later use
        raises. Closing twice is a no-op."""
        self._release(abort=False)

    def abort(self) -> None:
        """flatmem_comm_abort: the peers fail at once with PEER_FAILURE naming
        this rank; then releases it as close() does."""
        self._release(abort=True)

    def _release(self, abort: bool) -> None:
        if self._closed:
            return
        self._closed = True
        _open.discard(self)
        _checked(_lib.flatmem_jax_comm_close, self._slot, int(abort))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self._closed else f"slot {self._slot}"
        return f"RingComm(rank {self._rank} of {self._world_size}, {state})"


# Every open communicator, held until close() / abort() or exit (never closed
# by the garbage collector: closing talks to the peers).
_open: "set[RingComm]" = set()
_default: RingComm | None = None
_default_lock = threading.Lock()


@atexit.register
def _close_open_communicators():
    # Orderly, so that a peer still receiving what this rank sent last gets it.
    for comm in list(_open):
        with contextlib.suppress(FlatmemError):
            comm.close()


@contextlib.contextmanager
def _environment(values):
    """os.environ (which flatmem's getenv reads) with `values` set, restored after."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def initialize(coordinator: str | None = None, rank: int | None = None,
               world_size: int | None = None, *, from_jax_distributed: bool = False,
               timeout_ms: int = 0, connect_timeout_ms: int = 0) -> RingComm:
    """Creates this process's communicator (collective: every rank calls it)
    and returns it; later calls return the same one until finalize().

    Where rank, world size and coordinator come from:
      - nothing given: the environment (RingComm.from_env: FLATMEM_COORDINATOR
        and FLATMEM_RANK / FLATMEM_WORLD_SIZE or a launcher's variables, e.g.
        mpirun's OMPI_COMM_WORLD_RANK / _SIZE);
      - rank and world_size given: those, with coordinator ("host:port", which
        rank 0 listens on and the others dial) or $FLATMEM_COORDINATOR;
      - from_jax_distributed=True: jax.process_index() and jax.process_count()
        (after jax.distributed.initialize), with coordinator -- an address
        of its own, not jax.distributed's coordinator port.
    Explicit values are handed to flatmem_comm_create_from_env by setting
    FLATMEM_COORDINATOR / FLATMEM_RANK / FLATMEM_WORLD_SIZE in os.environ
    for the duration of the call (restored afterwards).

    timeout_ms, connect_timeout_ms: as RingComm.from_env. Raises FlatmemError.
    """
    global _default
    with _default_lock:
        if _default is not None and not _default.closed:
            return _default
        values = {}
        if from_jax_distributed:
            if rank is not None or world_size is not None:
                raise ValueError("flatmem_jax: initialize: give either rank and world_size or "
                                 "from_jax_distributed=True, not both")
            rank, world_size = jax.process_index(), jax.process_count()
            if coordinator is None:
                raise ValueError("flatmem_jax: initialize: from_jax_distributed=True needs "
                                 "coordinator='host:port', an address for flatmem's rank 0 to "
                                 "listen on (not jax.distributed's coordinator port)")
        if (rank is None) != (world_size is None):
            raise ValueError("flatmem_jax: initialize: rank and world_size go together "
                             f"(got rank={rank!r}, world_size={world_size!r})")
        if rank is not None:
            values.update(FLATMEM_RANK=str(int(rank)), FLATMEM_WORLD_SIZE=str(int(world_size)))
        if coordinator is not None:
            if not isinstance(coordinator, str) or not coordinator:
                raise TypeError(f"flatmem_jax: initialize: coordinator must be 'host:port', "
                                f"not {coordinator!r}")
            values["FLATMEM_COORDINATOR"] = coordinator
        with _environment(values):
            _default = RingComm.from_env(timeout_ms=timeout_ms,
                                         connect_timeout_ms=connect_timeout_ms)
        return _default


def communicator() -> RingComm:
    """The communicator initialize() made; RuntimeError before it."""
    if _default is None or _default.closed:
        raise RuntimeError("flatmem_jax: no ring communicator: call flatmem_jax.ring.initialize() "
                           "first (on every rank)")
    return _default


def finalize(abort: bool = False) -> None:
    """Closes (or aborts) the communicator initialize() made, if any."""
    global _default
    with _default_lock:
        comm, _default = _default, None
    if comm is not None:
        comm.abort() if abort else comm.close()
