"""The cyclic data-parallel schedule of flatmem/cyclic.h, as pure queries.

N ranks train a model cut into L stages; one training step of a rank is 2L
time steps (forward of stages 0 .. L-1, then backward of L-1 .. 0), and rank
r starts offset(r) = floor(r * 2L / N) time steps after rank 0 (0 for every
rank under "sync"). The averaged gradient of step s reaches stage j before its
forward in step s + 1 + delay(r, j).

    s = flatmem.CyclicSchedule(world_size=8, stages=4, steps=3, rule="newest")
    s.offset(5), s.delay(5, 0), s.length()     # 5, 1, 39
    s.action(5, 7)                              # CyclicAction(kind='forward', stage=2, step=0, ...)

Ranks, stages, steps and time steps are 0-based, as in C. The queries are the
library's flatmem_cyclic_schedule_* functions (closed forms, no handle, safe
from any thread).

The runtime, ``Cyclic(comm, stages=, steps=, rule=, ...)``, drives one rank of
that schedule over a flatmem.Communicator from a plain NumPy training loop:

    with flatmem.Cyclic(comm, stages=L, steps=S, rule="sync") as cyc:
        while (a := cyc.next()).kind != "done":        # may wait (GIL released)
            if a.update_stage is not None:              # grads[...] now holds the average
                params[a.update_stage] -= lr * grads[a.update_stage][a.update_step % 2]
            if a.kind == "forward":
                ...forward of stage a.stage on micro-batch a.step
            elif a.kind == "backward":
                g = grads[a.stage][a.step % 2]          # compute into it, then hand it over:
                cyc.reduce(a.stage, g)

A gradient array belongs to the handle from reduce() until the next() that
returns its update (it then holds the AVERAGE over ranks, 1/N times the sum);
the handle keeps a reference to it meanwhile, so it cannot be freed, but do
not read or write it. Under "delay1" / "newest" step s's gradient is still in
flight during step s + 1's backward: alternate two buffers per stage (s % 2).

Device gradients: ``Cyclic(..., memory="cuda")`` on a communicator whose
device transport is up (``comm.init_device(cuda_device)`` on every rank
first) takes kDLCUDA ``__dlpack__`` tensors (PyTorch, CuPy, JAX, ...) on that
device and averages them over NCCL; ``reduce(stage, g, stream=s)`` names the
cudaStream_t (an int) the gradient was computed on, so the chain reads it
after that stream's work without a host wait (None: the legacy default
stream). With parameters="relayed" the shards and full stages are device
tensors too (N <= 2L ranks; UnsupportedError otherwise): ``set_shard(stage,
shard, stream=s)`` names the stream the shard is updated on (the handle's
copies of it are enqueued there inside next()), ``parameters(full,
stream=s)`` the stream the full stage is copied on.
"""
from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import numpy as np

from . import capi
from ._header import NAMES
from ._options import enum_name, enum_value
from ._tensors import as_arg, as_stream_arg, as_stream_output
from .comm import check_communicator, int_arg

_KINDS = {value: name for name, value in NAMES["flatmem_cyclic_action_kind"].items()}  # idle .. done


class CyclicAction(NamedTuple):
    """What one rank does in one time step (flatmem_cyclic_action; C's -1 is None)."""

    time_step: int
    kind: str  # "idle", "forward", "backward" or "done"
    stage: Optional[int]  # forward / backward: 0 .. L-1
    step: Optional[int]  # forward / backward: the training step (micro-batch)
    update_stage: Optional[int]  # before the action, apply the average of
    update_step: Optional[int]  # step update_step to stage update_stage
    activations_held: int  # stage activations held during the time step (0 .. L)
    phase: Optional[int]  # 0 .. 2L-1 within the step

    @classmethod
    def from_capi(cls, a):
        """From a capi.CyclicAction."""
        def some(v):
            return None if v < 0 else int(v)

        try:
            kind = _KINDS[a.kind]
        except KeyError:
            raise RuntimeError(f"flatmem: unknown cyclic action kind {a.kind}") from None
        return cls(int(a.time_step), kind, some(a.stage), some(a.step), some(a.update_stage),
                   some(a.update_step), int(a.activations_held), some(a.phase))


def _rule_code(rule):
    return enum_value(rule, "flatmem_cyclic_rule", "rule")


def kept_stats(handle, load, item, first, count):
    """The raw statistics `item(i)` that `load(first, count)` copied into the
    SWIG handle, under the handle's lock; count None = every time step begun
    from `first` on."""
    with handle._lock:
        if count is None:
            count = max(handle._raw.summary().time_steps - int(first), 0)
        return [item(i) for i in range(load(int(first), int(count)))]


def int64_entries(values, count, name, meaning):
    """None, or `values` as a compact (count,) int64 array (an options array);
    ValueError naming the option otherwise."""
    if values is None:
        return None
    entries = np.ascontiguousarray(values, dtype=np.int64)
    if entries.shape != (count,):
        raise ValueError(f"{name}: shape {entries.shape}; expected ({count},), {meaning}")
    return entries


class _Schedule:
    """What CyclicSchedule and CyclicStagesSchedule share: the SWIG struct
    (self._raw) with its stages, steps and rule."""

    @classmethod
    def _from_capi(cls, raw):
        self = cls.__new__(cls)
        self._raw = raw
        return self

    @property
    def stages(self):
        return self._raw.stages

    @property
    def steps(self):
        return self._raw.steps

    @property
    def rule(self):
        """The rule's name ("delay1", "newest", "sync")."""
        return enum_name("flatmem_cyclic_rule", self._raw.rule)


class CyclicSchedule(_Schedule):
    """The shape of a cyclic schedule: world_size ranks, `stages` stages, `steps`
    training steps per rank, and the update rule: "delay1" (default; every stage
    applies the previous step's average), "newest" (this step's where the
    schedule allows) or "sync" (no stagger: plain data parallelism). The library
    checks the ranges at once (flatmem.InvalidArgumentError naming the field)."""

    def __init__(self, world_size, stages, steps, rule="delay1"):
        self._raw = capi.CyclicSchedule(int(world_size), int(stages), int(steps), _rule_code(rule))

    @property
    def world_size(self):
        return self._raw.world_size

    def offset(self, rank):
        """Time steps `rank` starts after rank 0 (flatmem_cyclic_schedule_offset)."""
        return self._raw.offset(rank)

    def delay(self, rank, stage):
        """0 or 1: step s's average reaches `stage` before its forward in step
        s + 1 + delay (flatmem_cyclic_schedule_delay)."""
        return self._raw.delay(rank, stage)

    def length(self):
        """Global time steps until every rank is done, its last update included
        (flatmem_cyclic_schedule_length)."""
        return self._raw.length()

    def action(self, rank, time_step):
        """What `rank` does at global time step `time_step` ("done" at and after
        length()); flatmem_cyclic_schedule_action."""
        return CyclicAction.from_capi(self._raw.action(rank, time_step))

    def actions(self, rank):
        """The actions of `rank` at every time step of the run, 0 .. length() - 1."""
        return [self.action(rank, t) for t in range(self.length())]

    def __repr__(self):
        return (f"flatmem.CyclicSchedule(world_size={self.world_size}, stages={self.stages}, "
                f"steps={self.steps}, rule={self.rule!r})")


class CyclicTimeStepStats(NamedTuple):
    """What happened in one time step of this rank (flatmem_cyclic_time_step_stats;
    bytes in bytes, times in seconds)."""

    time_step: int
    kind: str
    stage: Optional[int]
    step: Optional[int]
    activations_held: int
    activation_bytes: int
    bytes_sent: int
    seconds: float
    wait_seconds: float
    bytes_scheduled: int


class CyclicSummary(NamedTuple):
    """Totals since the handle was created (flatmem_cyclic_summary)."""

    time_steps: int
    bytes_sent: int
    messages_sent: int
    max_bytes_sent_per_time_step: int
    peak_activation_bytes: int
    wait_seconds: float
    seconds: float


class CyclicRelayTimeStep(NamedTuple):
    """The ZeRO relay in one time step of this rank (flatmem_cyclic_relay_time_step; bytes)."""

    time_step: int
    parameter_bytes: int  # shards + staging holding a stage, the most during the time step (measured)
    parameter_bytes_scheduled: int  # the same by the protocol (no timing)
    relay_bytes_sent: int  # full stages relayed on and shards sent to rank 0


class CyclicRelaySummary(NamedTuple):
    """Relay sizes and totals since create (flatmem_cyclic_relay_summary; bytes)."""

    shard_bytes: int  # this rank's shards, all stages
    replicated_bytes: int  # one replica of all stages: what "replicated" holds per rank
    staging_buffers: int  # K full-stage staging buffers
    staging_bytes: int  # K times the largest stage
    peak_parameter_bytes: int
    peak_parameter_bytes_scheduled: int
    relay_bytes_sent: int
    relay_messages_sent: int


def stream_arg(stream):
    """The cudaStream_t of a *_stream call as an int; None stays None (the
    plain call: the legacy default stream)."""
    return None if stream is None else int_arg(stream, "stream")


def call_for_stream(raw, name, stream, *args):
    """The SWIG handle's name(*args), or its name_stream(*args, stream) twin
    when a stream is given (the C API's plain / *_stream pairs)."""
    if stream is None:
        getattr(raw, name)(*args)
    else:
        getattr(raw, name + "_stream")(*args, stream)


def _writable_arg(tensor, name, stream):
    """The Arg of a tensor the library keeps or writes (a gradient, a shard):
    a writable C-contiguous NumPy array, or any __dlpack__ object (asked for
    its capsule with the DLPack stream of `stream` when it lives on a CUDA
    device). Whether its device suits the handle's memory is the library's
    call (its message names options.memory); only what cannot be described
    at all is refused here."""
    if isinstance(tensor, np.ndarray) and not (tensor.flags.c_contiguous and tensor.flags.writeable):
        raise ValueError(f"{name}: expected a writable C-contiguous NumPy array")
    return as_stream_arg(tensor, name, stream)


def _kept(tensor, arg):
    """What keeps a tensor handed to the handle alive: the array itself, or
    the __dlpack__ object and its capsule."""
    return tensor if isinstance(tensor, np.ndarray) else arg.keepalive


class Cyclic:
    """One rank of the cyclic data-parallel runtime (flatmem_cyclic_t) over a
    flatmem.Communicator; creation is collective (every rank passes the same
    stages, steps and rule).

    comm              the Communicator (kept referenced; comm.close() raises
                      until this handle is closed). One Cyclic per
                      communicator at a time.
    stages, steps     L stages, training steps per rank
    rule              "delay1" (default), "newest" or "sync" (plain data
                      parallelism: every step's average applied before the next)
    activation_bytes  None or L ints: bytes of activations each stage keeps
                      (accounting for stats() only; None = 1 per stage)
    timeout_ms        deadline of every wait (0 = the communicator's default)
    nonfinite         "error" (reduce() of a NaN/Inf gradient raises
                      NonFiniteError and poisons the communicator) or "propagate"
    history           time steps of stats() kept (0 = 65536)
    parameters        "replicated" (default: every rank holds all stages) or
                      "relayed" (the ZeRO relay, "delay1" only: rank k holds
                      shard k of every stage, set_shard(); before each
                      forward / backward parameters(full) waits for the full
                      stage, relayed rank to rank in stagger order)
    parameter_count   "relayed": L ints, the elements n_j of each stage
    memory            "host" (default: NumPy / kDLCPU gradients over the
                      host transport) or "cuda" (kDLCUDA __dlpack__ gradients,
                      and relayed shards and full stages, on the
                      communicator's device, over NCCL: needs
                      comm.init_device(...) on every rank first; "relayed"
                      needs N <= 2L; UnsupportedError from a flatmem built
                      without NCCL). Every rank passes the same.

    next() -> CyclicAction, reduce(stage, gradient, stream=None), stats(), summary(),
    schedule, close() / with-block; relayed: set_shard(stage, shard, stream=None),
    shard(stage), shard_range(stage, rank=None), parameters(full, stream=None),
    relay_stats(), relay_summary(). Thread rule: one thread drives the handle
    (a lock enforces it); next() releases the GIL while it waits.
    Failures (a dead peer, a timeout) raise PeerFailureError /
    CommTimeoutError naming the stage, step and peer.
    """

    def __init__(self, comm, *, stages, steps, rule="delay1", activation_bytes=None, timeout_ms=0,
                 nonfinite="error", history=0, parameters="replicated", parameter_count=None, memory="host"):
        check_communicator(comm, "comm")
        stages = int_arg(stages, "stages")
        accounting = int64_entries(activation_bytes, stages, "activation_bytes", "bytes per stage")
        counts = int64_entries(parameter_count, stages, "parameter_count", "the elements of each stage")
        parameters = enum_value(parameters, "flatmem_cyclic_parameter_mode", "parameters")
        memory = enum_value(memory, "flatmem_cyclic_memory", "memory")
        nonfinite = enum_value(nonfinite, "flatmem_nonfinite_policy", "nonfinite")
        self.comm = comm
        self._lock = threading.Lock()
        self._held = {}  # (stage, step) -> the gradient array the handle owns
        self._shards = {}  # stage -> the registered shard (relayed: read by the library in next())
        accounting_arg = as_arg(accounting, "activation_bytes")  # None stays None
        counts_arg = as_arg(counts, "parameter_count")
        self._raw = capi.Cyclic(comm._raw, stages, int_arg(steps, "steps"), _rule_code(rule),
                                accounting_arg and accounting_arg.tensor,
                                int_arg(timeout_ms, "timeout_ms"), nonfinite,
                                int_arg(history, "history"), parameters, counts_arg and counts_arg.tensor,
                                memory)
        self.schedule = CyclicSchedule._from_capi(self._raw.schedule())
        self._step = None  # the step of the current BACKWARD (for reduce's bookkeeping)

    def next(self):
        """Advance one time step; returns its CyclicAction. When update_stage is
        not None, the gradient array handed over for (update_stage,
        update_step) now holds the average and is the caller's again."""
        with self._lock:
            a = CyclicAction.from_capi(self._raw.next())
            if a.update_stage is not None:
                self._held.pop((a.update_stage, a.update_step), None)
            self._step = a.step if a.kind == "backward" else None
        return a

    def reduce(self, stage, gradient, stream=None):
        """Hand over the gradient of `stage` computed in this time step's
        BACKWARD: float32/float64, compact, the same dtype and size on every
        rank. It belongs to the handle (kept referenced, do not touch it)
        until next() returns its update, averaged in place.

        memory="host": a writable C-contiguous NumPy array (or a kDLCPU
        __dlpack__ object). memory="cuda": a __dlpack__ object on the
        communicator's CUDA device; `stream` is the cudaStream_t (an int, as
        torch.cuda.Stream.cuda_stream or cupy's Stream.ptr) it was computed
        on, None = the legacy default stream: the chain reads the gradient
        after the work enqueued on it so far (no host wait here), and the
        DLPack producer is asked to make the data ready for that stream.
        Ignored for host gradients. A gradient of the other kind than the
        handle's memory raises InvalidArgumentError naming options.memory;
        under nonfinite="error" a NaN/Inf in a device gradient is found by the
        chain, so the NonFiniteError comes from the next next()."""
        stage = int_arg(stage, "stage")
        stream = stream_arg(stream)
        arg = _writable_arg(gradient, "gradient", stream)
        with self._lock:
            call_for_stream(self._raw, "reduce", stream, stage, arg.tensor)
            self._held[(stage, self._step)] = _kept(gradient, arg)

    def stats(self, first=0, count=None):
        """Per-time-step statistics still kept (the last `history` ones), as a
        list of CyclicTimeStepStats from time step `first` on."""
        raw = kept_stats(self, self._raw.load_stats, self._raw.stat, first, count)
        return [CyclicTimeStepStats(int(s.time_step), _KINDS.get(s.kind, s.kind),
                                    None if s.stage < 0 else int(s.stage),
                                    None if s.step < 0 else int(s.step), int(s.activations_held),
                                    int(s.activation_bytes), int(s.bytes_sent), float(s.seconds),
                                    float(s.wait_seconds), int(s.bytes_scheduled)) for s in raw]

    def summary(self):
        with self._lock:
            s = self._raw.summary()
        return CyclicSummary(int(s.time_steps), int(s.bytes_sent), int(s.messages_sent),
                             int(s.max_bytes_sent_per_time_step), int(s.peak_activation_bytes),
                             float(s.wait_seconds), float(s.seconds))

    def set_shard(self, stage, shard, stream=None):
        """Relayed: register this rank's shard of `stage`, float32/float64,
        of exactly the elements of shard_range(stage) (possibly none) holding
        version 0: memory="host": a writable C-contiguous NumPy array (or a
        kDLCPU __dlpack__ object); memory="cuda": a __dlpack__ object on the
        communicator's device, and `stream` the cudaStream_t (an int; None =
        the legacy default stream) you update it on: the handle's copies of
        it are enqueued there inside next(), between your updates (ignored
        for host shards). The library reads it inside later next() calls (it
        sends copies), so the handle keeps it referenced (a __dlpack__ object
        with its capsule) until it is registered again or the handle is
        closed; update it in place at the stage's update actions with the
        average's shard range (the gradient array of that update). A shard
        of the other kind than the handle's memory raises
        InvalidArgumentError naming options.memory."""
        stage = int_arg(stage, "stage")
        stream = stream_arg(stream)
        arg = _writable_arg(shard, "shard", stream)
        with self._lock:
            call_for_stream(self._raw, "set_shard", stream, stage, arg.tensor)
            self._shards[stage] = (shard, _kept(shard, arg))

    def shard(self, stage):
        """Relayed: the array (or __dlpack__ object) registered for `stage`
        (None before set_shard)."""
        registered = self._shards.get(int(stage))
        return None if registered is None else registered[0]

    def shard_range(self, stage, rank=None):
        """Relayed: slice(begin, end), the elements of `stage` that `rank`
        (default: this rank) owns: c = ceil(n_j / N), [min(rank c, n_j),
        min((rank + 1) c, n_j)), possibly empty. full[h.shard_range(j)] is
        the shard."""
        rank = self.comm.rank if rank is None else int_arg(rank, "rank")
        stage = int_arg(stage, "stage")
        return slice(self._raw.shard_begin(stage, rank), self._raw.shard_end(stage, rank))

    def parameters(self, full, stream=None):
        """Relayed, during a forward or backward, once: wait (<= timeout,
        GIL released) for the relay of the action's stage and copy the full
        stage (version max(0, step - 1), n_j elements) into `full`, of the
        handle's memory (a writable NumPy array; memory="cuda": a __dlpack__
        device tensor, the copy enqueued on `stream`, the cudaStream_t as an
        int, None = the legacy default stream; ignored on the host); returns
        it. Written only on success."""
        stream = stream_arg(stream)
        arg = as_stream_output(full, "full", stream)
        with self._lock:
            call_for_stream(self._raw, "parameters", stream, arg.tensor)
        return full

    def relay_stats(self, first=0, count=None):
        """Relayed: per-time-step parameter bytes held and relay bytes sent
        (CyclicRelayTimeStep), the time steps still kept from `first` on."""
        raw = kept_stats(self, self._raw.load_relay_stats, self._raw.relay_stat, first, count)
        return [CyclicRelayTimeStep(int(s.time_step), int(s.parameter_bytes), int(s.parameter_bytes_scheduled),
                                    int(s.relay_bytes_sent)) for s in raw]

    def relay_summary(self):
        """Relayed: CyclicRelaySummary (shard, replica and staging bytes, peaks, totals)."""
        with self._lock:
            s = self._raw.relay_summary()
        return CyclicRelaySummary(int(s.shard_bytes), int(s.replicated_bytes), int(s.staging_buffers),
                                  int(s.staging_bytes), int(s.peak_parameter_bytes),
                                  int(s.peak_parameter_bytes_scheduled), int(s.relay_bytes_sent),
                                  int(s.relay_messages_sent))

    @property
    def closed(self):
        return not self._raw.is_open()

    def close(self):
        """flatmem_cyclic_destroy: quick when every gradient was applied; with
        reductions in flight it poisons the communicator (the peers fail naming
        this rank), as does a relayed handle closed before "done". Releases the
        communicator, the held gradients and the registered shards."""
        with self._lock:
            self._raw.close()
            self._held.clear()
            self._shards.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"flatmem.Cyclic({self.schedule!r}, rank={self.comm.rank}, {'closed' if self.closed else 'open'})"
