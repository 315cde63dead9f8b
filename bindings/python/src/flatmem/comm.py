"""Communicators (include/flatmem/comm.h): world_size processes ("ranks") that
exchange host (NumPy) buffers over UCX, or threads of one process
(``Communicator.create_local``).

    # every rank, under mpirun / srun / torchrun / a shell loop (FLATMEM_COORDINATOR=host:port)
    comm = flatmem.Communicator.from_env(timeout_ms=10000)
    total = comm.all_reduce(np.array([loss], np.float64))

    # or explicitly: rank 0 makes the id and hands it to the others itself
    uid = flatmem.UniqueId(":0")              # on rank 0 (opens the bootstrap listener)
    text = uid.hex()                          # 256 hex digits; or bytes(uid) (128 bytes)
    comm = flatmem.Communicator(rank, world_size, flatmem.UniqueId.from_hex(text))

Creation is collective (it returns when every rank has joined). Buffers are
C-contiguous NumPy arrays on the CPU; a message is the array's bytes, a receive
must have the sender's byte size. Every wait has a deadline: ``timeout_ms``
per call, 0 = the communicator's default (its ``timeout_ms`` option, else
$FLATMEM_COMM_TIMEOUT_MS, else 60000 ms). A deadline passed raises
``CommTimeoutError`` (a ``TimeoutError``), a dead or aborting peer
``PeerFailureError`` (a ``ConnectionError``), both naming the operation and the
peer; the communicator is then poisoned and every later call raises
``CommPoisonedError`` (a ``ConnectionError``) with the first error's text.

Lifetime: ``close()`` (or the with-block) releases the communicator,
``abort()`` releases it and makes the peers fail at once. Both raise
``InvalidArgumentError`` while a ``Contrastive`` or ``Cyclic`` created with
the communicator is still open (close those first); the handles that
``contrastive_loss(..., comm=comm)`` keeps for the communicator are closed by
it. Outstanding requests are cancelled by close (their buffers are kept alive
until then). Any call on a closed communicator raises ``InvalidArgumentError``.

Threads: one thread at a time per communicator (the C rule; a lock enforces
it). The GIL is released during every wait, all-reduce, ring shift, barrier
and creation, so other Python threads run meanwhile. With
``create_local``, each rank is driven by its own thread.
"""
from __future__ import annotations

import threading

import numpy as np

from . import capi
from ._header import CONSTANTS
from ._tensors import as_arg, as_output

UNIQUE_ID_BYTES = CONSTANTS["FLATMEM_COMM_UNIQUE_ID_BYTES"]


class UniqueId:
    """Rank 0's bootstrap id (flatmem_comm_unique_id): ``UniqueId(address)``
    opens the listener ("host:port", ":0" = any free port; None = the
    environment's FLATMEM_COMM_ADDRESS or a free port). Transfer it with
    ``hex()`` / ``bytes(uid)`` and rebuild it with ``from_hex`` / ``from_bytes``.
    Rank 0 must create its Communicator in the process that made the id."""

    __slots__ = ("_raw",)

    def __init__(self, address=None, *, _raw=None):
        if _raw is None:
            if address is not None and not isinstance(address, str):
                raise TypeError(f"address: expected a str like '127.0.0.1:0', not {type(address).__name__}")
            _raw = capi.UniqueId(address)
        self._raw = _raw

    @classmethod
    def from_hex(cls, text):
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str of 256 hex digits, not {type(text).__name__}")
        return cls(_raw=capi.UniqueId.from_hex(text))

    @classmethod
    def from_bytes(cls, data):
        data = bytes(data)
        if len(data) != UNIQUE_ID_BYTES:
            raise ValueError(f"data: {len(data)} bytes; a unique id has {UNIQUE_ID_BYTES}")
        return cls.from_hex(data.hex())

    def hex(self):
        return self._raw.hex()

    def __bytes__(self):
        return bytes.fromhex(self.hex())

    def __repr__(self):
        return f"flatmem.UniqueId({self.hex()[:16]}...)"


def _buffer(a, name, writable):
    """A C-contiguous NumPy array as a capi.Tensor Arg (TypeError otherwise)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a NumPy array, not {type(a).__name__}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: the array must be C-contiguous (np.ascontiguousarray)")
    return as_output(a, name) if writable else as_arg(a, name)


def int_arg(value, name):
    """An integer argument (Python or NumPy int, not bool), or TypeError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, not {type(value).__name__}")
    return int(value)


def _timeout(timeout_ms, name="timeout_ms"):
    """Milliseconds >= 0 (0 = the communicator's default)."""
    timeout_ms = int_arg(timeout_ms, name)
    if timeout_ms < 0:
        raise ValueError(f"{name}: {timeout_ms}; expected milliseconds >= 0 (0 = the default)")
    return timeout_ms


class Request:
    """An outstanding isend / irecv. ``wait(timeout_ms=0)`` completes it (for
    a receive it returns the buffer); ``test()`` says whether it completed.
    The buffer is kept alive until wait() returns or the communicator closes."""

    __slots__ = ("_raw", "_comm", "buffer", "__weakref__")

    def __init__(self, raw, comm, buffer):
        self._raw = raw
        self._comm = comm
        self.buffer = buffer

    @property
    def peer(self):
        return self._raw.peer()

    @property
    def done(self):
        """True once wait() returned."""
        return self._raw.is_done()

    def test(self):
        """Whether the transfer has completed (without waiting)."""
        with self._comm._lock:
            return self._raw.test()

    def wait(self, timeout_ms=0):
        """Block (GIL released) until complete, at most timeout_ms (0 = the
        communicator's default); returns the buffer."""
        timeout_ms = _timeout(timeout_ms)
        with self._comm._lock:
            try:
                self._raw.wait(timeout_ms)
            finally:
                if self._raw.is_done():
                    self._comm._outstanding.discard(self)
        return self.buffer


class Communicator:
    """A flatmem_comm_t: this rank of a group of world_size ranks.

    Communicator(rank, world_size, unique_id, *, timeout_ms=0, connect_timeout_ms=0)
        flatmem_comm_create: every rank passes rank 0's UniqueId (or its hex).
    Communicator.from_env(*, timeout_ms=0, connect_timeout_ms=0)
        FLATMEM_COORDINATOR=host:port and FLATMEM_RANK / FLATMEM_WORLD_SIZE, or
        a launcher's own variables (Open MPI, MPICH/PMI, Slurm, torchrun).
    Communicator.create_local(world_size, *, timeout_ms=0)
        world_size ranks inside this process (a list), each for its own thread.

    timeout_ms: the default deadline of every wait (0 = $FLATMEM_COMM_TIMEOUT_MS
    or 60000); connect_timeout_ms: how long creation waits for all ranks
    (0 = 120000).
    """

    def __init__(self, rank, world_size, unique_id, *, timeout_ms=0, connect_timeout_ms=0, _raw=None):
        if _raw is None:
            if isinstance(unique_id, str):
                unique_id = UniqueId.from_hex(unique_id)
            elif isinstance(unique_id, (bytes, bytearray)):
                unique_id = UniqueId.from_bytes(unique_id)
            if not isinstance(unique_id, UniqueId):
                raise TypeError(f"unique_id: expected a flatmem.UniqueId, its hex() or bytes, "
                                f"not {type(unique_id).__name__}")
            _raw = capi.Communicator(int_arg(rank, "rank"), int_arg(world_size, "world_size"),
                                     unique_id._raw, _timeout(timeout_ms),
                                     _timeout(connect_timeout_ms, "connect_timeout_ms"))
        self._raw = _raw
        self._lock = threading.Lock()
        self._outstanding = set()   # Requests not yet waited for (they keep their buffers)
        self._contrastive = {}      # handles kept by contrastive_loss(..., comm=self)

    @classmethod
    def from_env(cls, *, timeout_ms=0, connect_timeout_ms=0):
        return cls(None, None, None, _raw=capi.Communicator.from_env(
            _timeout(timeout_ms), _timeout(connect_timeout_ms, "connect_timeout_ms")))

    @classmethod
    def create_local(cls, world_size, *, timeout_ms=0):
        """[rank 0, ..., rank world_size-1] of one group inside this process."""
        group = capi.CommLocalGroup(int_arg(world_size, "world_size"), _timeout(timeout_ms))
        return [cls(None, None, None, _raw=group.take(r)) for r in range(group.world_size())]

    # ---- properties -------------------------------------------------------

    @property
    def rank(self):
        return self._raw.rank()

    @property
    def world_size(self):
        return self._raw.world_size()

    @property
    def closed(self):
        return not self._raw.is_open()

    def health(self):
        """None while healthy, else the error that poisoned it (not raised)."""
        try:
            self.check_health()
        except capi.Error as e:
            return e
        return None

    def check_health(self):
        """Raises the error that poisoned the communicator, if any."""
        with self._lock:
            self._raw.check_health()

    # ---- messages -----------------------------------------------------------

    def isend(self, buffer, peer, tag=0):
        """Send buffer (C-contiguous NumPy array, left unchanged until the
        request completes) to rank peer; returns a Request."""
        arg = _buffer(buffer, "buffer", False)
        return self._post(self._raw.isend, arg, buffer, peer, tag)

    def irecv(self, buffer, peer, tag=0):
        """Receive into buffer (writable, C-contiguous, exactly the sent byte
        size) from rank peer; returns a Request whose wait() returns buffer."""
        arg = _buffer(buffer, "buffer", True)
        return self._post(self._raw.irecv, arg, buffer, peer, tag)

    def _post(self, method, arg, buffer, peer, tag):
        peer = int_arg(peer, "peer")  # the library names a peer out of range
        if not 0 <= int_arg(tag, "tag") < 2**32:
            raise ValueError(f"tag: {tag!r}; expected an int in [0, 2**32)")
        with self._lock:
            request = Request(method(arg.tensor, peer, int(tag)), self, buffer)
            self._outstanding.add(request)
        return request

    def send(self, buffer, peer, tag=0, timeout_ms=0):
        """isend + wait."""
        self.isend(buffer, peer, tag).wait(timeout_ms)

    def recv(self, buffer, peer, tag=0, timeout_ms=0):
        """irecv + wait; returns buffer."""
        return self.irecv(buffer, peer, tag).wait(timeout_ms)

    def all_reduce(self, send, recv=None, timeout_ms=0):
        """Sum over ranks (float32, float64, int32, int64): returns recv (a new
        array like send when None; may be send itself, in place). Every rank
        gets bitwise the same result."""
        send_arg = _buffer(send, "send", False)
        if recv is None:
            recv = np.empty_like(send)
        recv_arg = send_arg if recv is send else _buffer(recv, "recv", True)
        with self._lock:
            self._raw.all_reduce(send_arg.tensor, recv_arg.tensor, _timeout(timeout_ms))
        return recv

    def ring_shift(self, send, recv=None, timeout_ms=0):
        """Send to rank + 1, receive from rank - 1 (mod world_size): returns
        recv (a new array like send when None)."""
        send_arg = _buffer(send, "send", False)
        if recv is None:
            recv = np.empty_like(send)
        recv_arg = _buffer(recv, "recv", True)
        with self._lock:
            self._raw.ring_shift(send_arg.tensor, recv_arg.tensor, _timeout(timeout_ms))
        return recv

    def barrier(self, timeout_ms=0):
        with self._lock:
            self._raw.barrier(_timeout(timeout_ms))

    def init_device(self, cuda_device, timeout_ms=0):
        """Collective: bring up the NCCL device transport of these ranks on
        CUDA device `cuda_device` (flatmem_comm_init_device), as
        Cyclic(..., memory="cuda") and the ring losses on CUDA tensors need
        on every rank. UnsupportedError
        without NCCL or a usable CUDA driver (the communicator stays healthy
        and the call may be retried); InvalidArgumentError for a device that
        does not exist."""
        cuda_device = int_arg(cuda_device, "cuda_device")
        with self._lock:
            self._raw.init_device(cuda_device, _timeout(timeout_ms))

    # ---- release ------------------------------------------------------------

    def _release(self, method):
        for handle in list(self._contrastive.values()):
            handle.close()
        self._contrastive.clear()
        with self._lock:
            method()
            if self._raw.is_open():  # pragma: no cover - method raised
                return
            self._outstanding.clear()  # cancelled by the library: the buffers may go

    def close(self):
        """flatmem_comm_destroy (orderly: what was sent is flushed, the peers
        are told this rank left). Raises InvalidArgumentError while a
        Contrastive or Cyclic made with it is open. No-op when closed."""
        self._release(self._raw.close)

    def abort(self):
        """flatmem_comm_abort: the peers fail at once naming this rank; use it
        after an error. Same rule as close()."""
        self._release(self._raw.abort)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        (self.abort if exc_type is not None else self.close)()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"flatmem.Communicator(rank={self.rank}, world_size={self.world_size}, {state})"


def check_communicator(comm, what):
    """comm as a Communicator, or TypeError naming `what`."""
    if not isinstance(comm, Communicator):
        raise TypeError(f"{what}: expected a flatmem.Communicator, not {type(comm).__name__}")
    return comm
