"""Stage-parallel cyclic training (flatmem/cyclic_stages.h): L ranks, one per
model stage, serve N staggered micro-batches back to back.

Micro-batch m of a training step follows the cyclic schedule of data-parallel
rank m of N (flatmem.Cyclic with N ranks), so the micro-batches reach stage j
one after another and rank j serves all of them: L ranks do what data
parallelism times model parallelism does on N * L. Each stage's parameters
live once, on its rank; its gradient is summed locally (no all-reduce); only
the boundary tensors (activations forward, their gradients backward) travel.

The schedule (pure, thread-safe: ``CyclicStagesSchedule``), all times global
time steps, L stages, N micro-batches, S steps:

    offset(m) = floor(m * 2L / N)          (every rule, "sync" included)
    period P  = 2L ("delay1", "newest"); 2L + offset(N - 1) ("sync": the pipeline drains)
    forward  of stage j for (m, s) at  offset(m) + P s + j
    backward of stage j for (m, s) at  offset(m) + P s + 2L - 1 - j

Stage j runs every action scheduled for it at a time step (0, 1 or more),
backwards first, then forwards, each by ascending micro-batch. Forward and
backward of (m, s) at stage j use parameter version
``max(0, s - delay)``, delay = 0 ("sync"), 1 ("delay1"), or flatmem.Cyclic's
"newest" delay of rank m at stage j (``CyclicSchedule(N, L, S, "newest").delay(m, j)``),
so the training equals flatmem.Cyclic on N ranks bit for bit ("delay1",
"newest"; "sync" where that runtime's all-reduce adds in micro-batch order).
Version v = the parameters after the averages of steps 0 .. v-1; keep
K = ``versions_kept(stage)`` of them (version v in slot v % K).

One stage rank's loop (``Cyclic`` is the data-parallel twin):

    with flatmem.CyclicStages(comm, micro_batches=N, steps=S, boundary_bytes=[...]) as h:
        K = h.schedule.versions_kept(comm.rank)
        while (a := h.next()).kind != "done":         # may wait (GIL released)
            if a.update_step is not None:               # version v + 1 from v
                v = a.update_step
                slot[(v + 1) % K] = slot[v % K] - lr * h.average()
            if a.kind == "forward":
                x = h.receive(np.empty(...)) if a.receives else first_input(a.micro_batch, a.step)
                y = forward(slot[a.version % K], x)     # keep what the backward needs
                if a.sends: h.send(y)
            elif a.kind == "backward":
                dy = h.receive(np.empty(...)) if a.receives else loss_gradient(...)
                grad, dx = backward(slot[a.version % K], ...)
                h.accumulate(grad)
                if a.sends: h.send(dx)

Tensors are C-contiguous NumPy arrays on the CPU (or ``__dlpack__`` CPU
objects for send / accumulate): ``send`` and ``accumulate`` copy theirs,
``receive`` and ``average`` write theirs before returning, so the handle
keeps no caller array. Every wait is bounded by ``timeout_ms``; a dead or
wedged neighbour raises PeerFailureError / CommTimeoutError naming the stage,
micro-batch and step ("cyclic stages, stage 1, micro-batch 0, step 2: receive
the activation from stage 0 (rank 0): ..."), and poisons the communicator
(later calls: CommPoisonedError). Calls out of order (``next()`` while the
current action's receive, send or accumulate is missing; a second send;
``average()`` outside an update) raise InvalidArgumentError and change
nothing.

Device tensors: ``CyclicStages(..., memory="cuda")`` on a communicator whose
device transport is up (``comm.init_device(cuda_device)`` on every rank
first) takes kDLCUDA ``__dlpack__`` tensors (PyTorch, CuPy, JAX, ...) on that
device for all four calls, moved over NCCL. ``send`` / ``receive`` /
``accumulate`` / ``average`` take ``stream=``: the cudaStream_t (an int) the
copies are enqueued on, None = the legacy default stream; the DLPack producer
is asked to make its data ready for that stream. ``receive`` waits on the
host for the arrival, the rest does not wait. The handle keeps no tensor
either way. A tensor of the other kind than the handle's memory raises
InvalidArgumentError naming options.memory.
"""
from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import numpy as np

from . import capi
from ._options import enum_value
from ._tensors import as_arg, as_stream_arg, as_stream_output
from .comm import check_communicator, int_arg
from .cyclic import (_KINDS, _Schedule, _rule_code, call_for_stream, int64_entries, kept_stats,
                     stream_arg)
from .reversible import _invalid


def _input(tensor, name, stream):
    """send / accumulate: a NumPy array or __dlpack__ object (on a CUDA
    device: asked for the call's stream), anything else through np.asarray."""
    return as_stream_arg(tensor if hasattr(tensor, "__dlpack__") else np.asarray(tensor), name, stream)


def _none_if_negative(v):
    return None if v < 0 else int(v)


class CyclicStagesAction(NamedTuple):
    """One action of one stage rank (flatmem_cyclic_stages_action; C's -1 is None)."""

    time_step: int  # the global time step it belongs to (several actions may share one)
    kind: str  # "forward", "backward", "idle" (an update only, after the last step) or "done"
    stage: Optional[int]  # this rank's stage; None for "done"
    micro_batch: Optional[int]  # forward / backward: 0 .. N-1
    step: Optional[int]  # forward / backward: 0 .. S-1
    version: Optional[int]  # forward / backward: the parameter version to use (slot version % K)
    update_step: Optional[int]  # before the action form version update_step + 1 (average of that step)
    receives: bool  # call receive() before computing
    sends: bool  # call send() after computing
    accumulates: bool  # (every backward) call accumulate()
    activations_held: int  # micro-batches whose activations the stage holds in the time step
    index_in_time_step: int  # this action's place among the time step's actions
    actions_in_time_step: int  # and their number (0 and 0 for "done")

    @classmethod
    def from_capi(cls, a):
        """From a capi.CyclicStagesAction."""
        try:
            kind = _KINDS[a.kind]
        except KeyError:
            raise RuntimeError(f"flatmem: unknown cyclic action kind {a.kind}") from None
        some = _none_if_negative
        return cls(int(a.time_step), kind, some(a.stage), some(a.micro_batch), some(a.step), some(a.version),
                   some(a.update_step), bool(a.receives), bool(a.sends), bool(a.accumulates),
                   int(a.activations_held), int(a.index_in_time_step), int(a.actions_in_time_step))


class CyclicStagesOccupancy(NamedTuple):
    """Steady-state occupancy of one stage rank (flatmem_cyclic_stages_occupancy)."""

    busy_fraction: float  # fraction of a period's time steps with at least one action
    peak_actions: int  # actions per time step, largest
    peak_activations_held: int  # micro-batches whose activations the stage holds, largest
    mean_activations_held: float  # and mean over a period: N (2L - 2j) / P


class CyclicStagesSchedule(_Schedule):
    """The shape of a stage-parallel schedule: `stages` L (= ranks), N
    `micro_batches` per training step, `steps` S, and the rule ("delay1"
    default, "newest", "sync"). The library checks the ranges at once
    (InvalidArgumentError naming the field). The queries are the library's
    flatmem_cyclic_stages_schedule_* functions (closed forms, any thread)."""

    def __init__(self, stages, micro_batches, steps, rule="delay1"):
        self._raw = capi.CyclicStagesSchedule(int(stages), int(micro_batches), int(steps), _rule_code(rule))

    @property
    def micro_batches(self):
        return self._raw.micro_batches

    def offset(self, micro_batch):
        """offset(m) = floor(m * 2L / N) time steps."""
        return self._raw.offset(micro_batch)

    def period(self):
        """P: time steps per training step (2L; "sync": 2L + offset(N - 1))."""
        return self._raw.period()

    def length(self):
        """Time steps of the whole run, B(0, N-1, S-1) + 2: time steps 0 .. length() - 1."""
        return self._raw.length()

    def versions_kept(self, stage):
        """K: parameter versions `stage` keeps (version v in slot v % K), 1 or 2."""
        return self._raw.versions_kept(stage)

    def actions(self, stage, time_step):
        """The actions of `stage` at `time_step`, in the order the handle
        returns them (an empty list when there are none, and at and after
        length())."""
        raw = self._raw
        return [CyclicStagesAction.from_capi(raw.action(stage, time_step, i))
                for i in range(raw.action_count(stage, time_step))]

    def timeline(self, stage):
        """Every action of `stage` over the run, time step after time step
        (what CyclicStages.next() returns on that rank, "done" excluded)."""
        return [a for t in range(self.length()) for a in self.actions(stage, t)]

    def occupancy(self, stage):
        """Steady-state occupancy of `stage` (CyclicStagesOccupancy)."""
        o = self._raw.occupancy(stage)
        return CyclicStagesOccupancy(float(o.busy_fraction), int(o.peak_actions), int(o.peak_activations_held),
                                     float(o.mean_activations_held))

    def __repr__(self):
        return (f"flatmem.CyclicStagesSchedule(stages={self.stages}, micro_batches={self.micro_batches}, "
                f"steps={self.steps}, rule={self.rule!r})")


class CyclicStagesTimeStepStats(NamedTuple):
    """What happened in one time step of this stage rank
    (flatmem_cyclic_stages_time_step_stats; bytes, seconds)."""

    time_step: int
    actions: int  # actions run (0: a time step without any, recorded too)
    activations_held: int
    activation_bytes: int
    bytes_sent: int  # boundary bytes posted (headers and padding included)
    seconds: float
    wait_seconds: float


class CyclicStagesSummary(NamedTuple):
    """Totals since the handle was created (flatmem_cyclic_stages_summary)."""

    time_steps: int
    actions: int
    bytes_sent: int
    messages_sent: int
    max_bytes_sent_per_time_step: int
    peak_activations_held: int
    peak_activation_bytes: int
    mean_activations_held: float
    busy_fraction: float  # time steps with >= 1 action / time steps begun
    steady_busy_fraction: float  # the schedule's steady-state busy fraction of this stage
    wait_seconds: float
    seconds: float


class CyclicStages:
    """This stage rank's stage-parallel runtime (flatmem_cyclic_stages_t) over
    a flatmem.Communicator: rank j runs stage j. Creation is collective (every
    rank passes the same stages, micro_batches, steps, rule and boundary_bytes;
    checked, InvalidArgumentError on every rank naming the first difference).

    comm              the Communicator (kept referenced; comm.close() raises
                      until this handle is closed). One cyclic handle
                      (Cyclic or CyclicStages) per communicator at a time.
    micro_batches     N micro-batches per training step, 1 .. 65535
    steps             S training steps
    boundary_bytes    L - 1 ints (required when L > 1): [j] = the largest
                      bytes crossing the boundary between stages j and j + 1
                      (an activation or its gradient); staging is sized by it
    rule              "delay1" (default), "newest" or "sync"
    activation_bytes  None or L ints: bytes of activations stage j keeps per
                      micro-batch (accounting only; None = 1)
    timeout_ms        deadline of every wait (0 = the communicator's default)
    history           time steps of stats() kept (0 = 65536)
    stages            L; None = comm.world_size (the library requires equality)
    memory            "host" (default: NumPy / kDLCPU tensors over the host
                      transport) or "cuda" (kDLCUDA __dlpack__ tensors on the
                      communicator's device, over NCCL: needs
                      comm.init_device(...) on every rank first;
                      UnsupportedError from a flatmem built without NCCL).
                      Every rank passes the same.

    next() -> CyclicStagesAction, send(tensor, stream=None), receive(into,
    stream=None) -> into, accumulate(gradient, stream=None), average(out=None,
    stream=None) -> out, stats(), summary(),
    schedule (CyclicStagesSchedule), close() / with-block. Thread rule: one
    thread drives the handle (a lock enforces it); every call that may wait
    releases the GIL.
    """

    def __init__(self, comm, *, micro_batches, steps, boundary_bytes=None, rule="delay1",
                 activation_bytes=None, timeout_ms=0, history=0, stages=None, memory="host"):
        check_communicator(comm, "comm")
        memory = enum_value(memory, "flatmem_cyclic_memory", "memory")
        stages = comm.world_size if stages is None else int_arg(stages, "stages")
        boundaries = int64_entries(boundary_bytes, max(stages - 1, 0), "boundary_bytes",
                                    "bytes per boundary between stages j and j + 1 (stages - 1 entries)")
        if boundaries is not None and boundaries.size == 0:
            boundaries = None  # one stage: no boundary (the C API's NULL)
        accounting = int64_entries(activation_bytes, stages, "activation_bytes", "bytes per stage")
        self.comm = comm
        self._lock = threading.Lock()
        self._gradient = None  # (dtype, size) of the first accumulate: average()'s default output
        boundary_arg = as_arg(boundaries, "boundary_bytes")
        accounting_arg = as_arg(accounting, "activation_bytes")
        self._raw = capi.CyclicStages(comm._raw, stages, int_arg(micro_batches, "micro_batches"),
                                      int_arg(steps, "steps"), _rule_code(rule),
                                      boundary_arg and boundary_arg.tensor,
                                      accounting_arg and accounting_arg.tensor,
                                      int_arg(timeout_ms, "timeout_ms"), int_arg(history, "history"), memory)
        self._on_device = memory == capi.CYCLIC_MEMORY_CUDA
        self.schedule = CyclicStagesSchedule._from_capi(self._raw.schedule())
        self.stage = comm.rank

    def next(self):
        """The next action of this stage (time steps without actions are
        skipped). Raises InvalidArgumentError, without advancing, while the
        current action's receive, send or accumulate is missing. Before
        "done" it waits (<= timeout) until this rank's sends have left;
        "done" again on every later call."""
        with self._lock:
            return CyclicStagesAction.from_capi(self._raw.next())

    # The *_stream calls: `stream` is the cudaStream_t (an int, as
    # torch.cuda.Stream.cuda_stream or cupy's Stream.ptr) device copies are
    # enqueued on, None = the legacy default stream; ignored for host tensors.
    # The handle copies, so no tensor is kept past a call (device: the copies
    # are ordered like the caller's own work on that stream).

    def _call(self, name, arg, stream):
        """capi's name(tensor), or name_stream(tensor, stream) when a stream is given."""
        with self._lock:
            call_for_stream(self._raw, name, stream, arg.tensor)

    def send(self, tensor, stream=None):
        """Send the current action's boundary tensor (its `sends`, once):
        compact, at most boundary_bytes of its boundary, of the handle's
        memory. Copied: the tensor is the caller's again on return (device:
        for the work enqueued after the call on `stream`)."""
        stream = stream_arg(stream)
        arg = _input(tensor, "tensor", stream)
        self._call("send", arg, stream)

    def receive(self, into, stream=None):
        """Receive the current action's boundary tensor (its `receives`,
        once) into `into` (a writable C-contiguous NumPy array, or on a
        "cuda" handle a __dlpack__ device tensor, of exactly the sent bytes;
        else InvalidArgumentError naming both sizes, which poisons the handle
        and communicator). Waits at most the timeout (device: for the
        arrival, on the host; the copy into `into` is enqueued on `stream`);
        nothing is written on error. Returns `into`."""
        stream = stream_arg(stream)
        arg = as_stream_output(into, "into", stream)
        self._call("receive", arg, stream)
        return into

    def accumulate(self, gradient, stream=None):
        """Add the current backward's stage gradient (once) into its step's
        accumulator: float32 or float64, compact, at least one element, the
        same dtype and size every time. Copied (device: enqueued on `stream`)."""
        stream = stream_arg(stream)
        arg = _input(gradient, "gradient", stream)
        self._call("accumulate", arg, stream)
        if self._gradient is None and arg.dtype is not None:
            t = arg.tensor
            self._gradient = (arg.dtype, int(np.prod([t.shape(i) for i in range(t.ndim())], dtype=np.int64)))

    def average(self, out=None, stream=None):
        """The average of the current action's update_step (only while it is
        not None): ((g_0 + g_1) + ... + g_{N-1}) * (1/N rounded to the dtype),
        copied into `out` (the accumulate dtype and size; None: a new 1-d
        NumPy array, host handles only). Device: a __dlpack__ device tensor,
        the copy enqueued on `stream` (order it after the accumulates: the
        same stream, or your own synchronisation). Returns `out`."""
        stream = stream_arg(stream)
        if out is None:
            if self._on_device:
                raise _invalid("CyclicStages.average: out is None; with memory='cuda' pass out= (a kDLCUDA "
                               "__dlpack__ tensor of the accumulate dtype and size)")
            if self._gradient is None:
                raise _invalid("CyclicStages.average: no gradient was accumulated yet, so there is no "
                               "average (and its dtype is unknown); pass out=")
            out = np.empty(self._gradient[1], self._gradient[0])
        arg = as_stream_output(out, "out", stream)
        self._call("average", arg, stream)
        return out

    def stats(self, first=0, count=None):
        """Per-time-step statistics still kept (the last `history` begun),
        from time step `first` on, as CyclicStagesTimeStepStats."""
        raw = kept_stats(self, self._raw.load_stats, self._raw.stat, first, count)
        return [CyclicStagesTimeStepStats(int(s.time_step), int(s.actions), int(s.activations_held),
                                          int(s.activation_bytes), int(s.bytes_sent), float(s.seconds),
                                          float(s.wait_seconds)) for s in raw]

    def summary(self):
        with self._lock:
            s = self._raw.summary()
        return CyclicStagesSummary(int(s.time_steps), int(s.actions), int(s.bytes_sent), int(s.messages_sent),
                                   int(s.max_bytes_sent_per_time_step), int(s.peak_activations_held),
                                   int(s.peak_activation_bytes), float(s.mean_activations_held),
                                   float(s.busy_fraction), float(s.steady_busy_fraction), float(s.wait_seconds),
                                   float(s.seconds))

    @property
    def closed(self):
        return not self._raw.is_open()

    def close(self):
        """flatmem_cyclic_stages_destroy: local and quick after "done" (or a
        failure); before it the neighbours cannot finish, so the communicator
        is poisoned (they fail naming this stage). Releases the communicator."""
        with self._lock:
            self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"flatmem.CyclicStages({self.schedule!r}, stage={self.stage}, "
                f"{'closed' if self.closed else 'open'})")

