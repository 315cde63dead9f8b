"""Cyclic data parallelism for torch training loops (flatmem/cyclic.h through flatmem.Cyclic).

    stages = flatmem.torch.split_sequential(model, 4)          # or your own L nn.Modules
    cdp = flatmem.torch.CyclicDataParallel(stages, torch.optim.AdamW(model.parameters()), loss_fn,
                                           comm, steps=len(loader), rule="delay1")
    for inputs, target in loader:                              # this rank's micro-batch
        loss = cdp.step(inputs, target)
    cdp.finish()                                               # the last updates; then cdp.close()

Every rank holds the model cut into L stages and trains on its own micro-batch; a training step is
2L time steps (forward of stages 0 .. L-1, then backward of L-1 .. 0), and rank r starts
floor(r 2L / N) time steps after rank 0, so at any time the ranks hold different numbers of stage
activations and their sum stays near (N + 1) / 2N of what N ranks in lockstep hold at their peak.
A stage's gradient goes to its reduce chain as soon as its backward ran (point-to-point, spread
over the step instead of one all-reduce at its end); the average (1/N of the sum over ranks, as
DistributedDataParallel's) comes back and is applied with the optimizer at the time step the rule
names:

    rule="sync"    step s uses the parameters after the averages of steps 0 .. s-1: plain data
                   parallelism (no stagger); equals one process on the concatenated batch.
    rule="delay1"  step s uses those after steps 0 .. s-2 (version max(0, s-1)): the same optimizer
                   one step late, on every stage.
    rule="newest"  per stage, the newest average the stagger allows (flatmem.CyclicSchedule.delay).

``step(inputs, target)`` runs this rank's time steps up to the backward of stage 0 of that
training step (stage 0 gets `inputs`, the last stage's output and `target` go to
``loss_fn(output, target)``, a scalar) and returns the loss (detached). Updates of earlier steps
arrive inside it; ``finish()`` applies the last ones. `steps` is fixed when the wrapper is made
(every rank passes the same).

Parameters, ``parameters=``:

    "replicated"  every rank holds every stage (the modules' own parameters, updated in place by
                  the optimizer: a torch.optim.Optimizer over all of them, one per stage, or a
                  factory ``params -> Optimizer`` called per stage).
    "relayed"     ZeRO-style, rule "delay1" only: rank k keeps shard k (a contiguous 1/N of the
                  stage's flat parameters) of every stage, and the optimizer (a factory, called
                  per stage with [that shard as an nn.Parameter]) updates only it. Before each
                  forward and backward of a stage its full parameters arrive from the previous
                  rank in stagger order; the autograd graph keeps no reference to them between
                  the forward and the backward (saved parameters are re-read from the copy that
                  arrives for the backward), so a rank holds its shards plus the stages in its
                  hands at the time step. The modules' own parameters are released (empty) at
                  construction; ``shards()`` gives this rank's trained shards.

Gradients are reduced in the parameters' dtype (float32 or float64); every stage's parameters
that require gradients take part (one that got none counts as zeros). A stage module must not
change its parameters or hold state across calls that the backward needs (dropout is fine: its
masks are saved tensors).

Devices: CPU parameters use flatmem's host transport; CUDA parameters its NCCL device path (call
``comm.init_device(torch.cuda.current_device())`` on every rank first), each gradient handed over
on torch's current stream without a host wait. The CUDA path compiles and is tested only where a
GPU exists (tests labelled gpu).

Failure: a dead or wedged rank makes every other rank's step() raise flatmem's error
(PeerFailureError, CommTimeoutError, ...) within the communicator's timeout, never a hang. The
wrapper is then failed: later calls raise RuntimeError naming the first error. Each stage keeps
the parameters of the last update it applied; gradients in flight are dropped.

Memory measured: ``activation_peak_bytes`` / ``activation_trace()`` count the distinct storages
autograd saves for the stages in flight (parameters excluded), per time step; ``summary()``,
``stats()`` and, relayed, ``relay_summary()`` are the runtime's (bytes sent per time step, ...).
"""
from __future__ import annotations

import torch
from torch import nn

from .._header import NAMES
from .._options import enum_value
from ..cyclic import Cyclic
from ._stages import CyclicRunner, FlatStage, StageOptimizers, split_sequential

_RELAYED = NAMES["flatmem_cyclic_parameter_mode"]["relayed"]


class _RelayedWeights:
    """Stands in for a stage's relayed parameters in its saved tensors: a saved tensor in the full
    stage's storage becomes (size, stride, offset), read back from the copy the relay delivers for
    the backward (the same version)."""

    def __init__(self, leaf: torch.Tensor):
        self.leaf = leaf
        self.ptr = leaf.untyped_storage().data_ptr()
        self.buffer = None

    def pack(self, t):
        if self.ptr and t.untyped_storage().data_ptr() == self.ptr:
            return (tuple(t.size()), tuple(t.stride()), t.storage_offset())
        return None

    def unpack(self, marker):
        return self.buffer.as_strided(*marker)


class CyclicDataParallel(CyclicRunner):
    """One rank of cyclic data-parallel training of `stages` (a list of L nn.Modules: stage j+1
    takes stage j's output) with `optimizer` and `loss_fn(output, target) -> scalar`, over the
    flatmem.Communicator `comm` (flatmem.torch.communicator()). Creation is collective.

    steps       training steps (every rank the same)
    rule        "delay1" (default), "newest" or "sync"
    parameters  "replicated" (default) or "relayed" (see the module's doc)
    timeout_ms  deadline of every wait (0: the communicator's)
    nonfinite   "error" (a NaN/Inf gradient fails every rank) or "propagate"
    """

    def __init__(self, stages, optimizer, loss_fn, comm, *, steps, rule="delay1", parameters="replicated",
                 timeout_ms=0, nonfinite="error", history=0):
        if isinstance(stages, nn.Module) and not isinstance(stages, nn.Sequential):
            raise TypeError("stages: a list of nn.Modules expected (flatmem.torch.split_sequential cuts an nn.Sequential)")
        self.stages = list(stages)
        if not self.stages:
            raise ValueError("stages: at least one stage expected")
        if not callable(loss_fn):
            raise TypeError("loss_fn: a callable (output, target) -> scalar tensor expected")
        self.loss_fn = loss_fn
        self._flat = [FlatStage(m, f"stages[{j}]") for j, m in enumerate(self.stages)]
        devices = {f.device for f in self._flat}
        if len(devices) != 1:
            raise TypeError(f"stages: every stage on one device expected, got {sorted(map(str, devices))}")
        device = devices.pop()
        self.relayed = enum_value(parameters, "flatmem_cyclic_parameter_mode", "parameters") == _RELAYED
        if self.relayed and (isinstance(optimizer, torch.optim.Optimizer) or not callable(optimizer)):
            raise TypeError("optimizer: parameters='relayed' needs a factory params -> Optimizer (it is made "
                            "over this rank's shards)")
        self._start(Cyclic(comm, stages=len(self.stages), steps=steps, rule=rule, timeout_ms=timeout_ms,
                           nonfinite=nonfinite, history=history, parameters=parameters,
                           parameter_count=[f.numel for f in self._flat] if self.relayed else None,
                           memory="cuda" if device.type == "cuda" else "host"), device)
        self.comm, self.steps, self.rule = comm, int(steps), rule
        try:
            if self.relayed:
                self._shards = self._make_shards()
                self._optim = StageOptimizers(optimizer, [[s] for s in self._shards])
            else:
                self._optim = StageOptimizers(optimizer, [f.params for f in self._flat])
        except BaseException:
            self._runtime.close()
            raise
        self.meter.exclude = {p.untyped_storage().data_ptr() for f in self._flat for p in f.params}
        self._kept: dict = {}  # stage -> (input leaf or None, output, relayed stand-in)
        self._held: dict = {}  # (stage, step) -> the flat gradient the runtime averages
        self._input = self._target = None
        self._dy = None
        self._loss = None
        self._started = 0

    # ---- setup -------------------------------------------------------------------------

    def _make_shards(self):
        shards = []
        for j, f in enumerate(self._flat):
            full = f.flat()
            shard = nn.Parameter(full[self._runtime.shard_range(j)].clone())
            self._runtime.set_shard(j, shard.detach(), stream=self._stream())
            shards.append(shard)
            for p in f.params:  # the module's copy is the relay's now
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        return shards

    # ---- the loop ----------------------------------------------------------------------

    def step(self, inputs, target):
        """Train one step on this rank's micro-batch; returns its loss (a detached scalar)."""
        self._check_usable()
        if self._started >= self.steps:
            raise RuntimeError(f"CyclicDataParallel.step: all {self.steps} steps were run (steps= at construction)")
        self._input, self._target = inputs, target
        try:
            self._guarded(self._run_step)
        finally:
            self._input = self._target = None
        self._started += 1
        loss, self._loss = self._loss, None
        return loss

    def _run_step(self):
        while True:
            a = self._advance()
            if a.kind == "done":
                raise RuntimeError("CyclicDataParallel.step: the schedule ended before this step's backward")
            if a.kind == "backward" and a.stage == 0:
                return

    def finish(self):
        """Run the time steps after this rank's last backward: the last updates (every step() must
        have run). Returns self; close() follows."""
        self._check_usable()
        if self._started < self.steps:
            raise RuntimeError(f"CyclicDataParallel.finish: {self._started} of {self.steps} steps were run")
        self._guarded(lambda: self._advance_to("done"))
        self._done = True
        return self

    def _advance_to(self, kind):
        while self._advance().kind != kind:
            pass

    def _advance(self):
        a = self._runtime.next()
        if a.update_stage is not None:
            self._update(a.update_stage, a.update_step)
        if a.kind == "forward":
            self._forward(a.stage, a.step)
        elif a.kind == "backward":
            self._backward(a.stage, a.step)
        if a.kind != "done":
            self._traced(a.time_step)
        return a

    def _update(self, j, v):
        flat = self._held.pop((j, v))
        if self.relayed:
            self._shards[j].grad = flat[self._runtime.shard_range(j)]
        else:
            self._flat[j].set_grads(self._flat[j].params, flat)
        self._optim.step(j)

    def _forward(self, j, s):
        last = j == len(self.stages) - 1
        if j == 0:
            x, leaf = self._input, None
        else:
            leaf = self._kept[j - 1][1].detach().requires_grad_()
            x = leaf
        stand_in = None
        with torch.enable_grad():
            if self.relayed:
                full = torch.empty(self._flat[j].numel, dtype=self._flat[j].dtype, device=self.device)
                self._runtime.parameters(full, stream=self._stream())
                full.requires_grad_()
                stand_in = _RelayedWeights(full)
                with self.meter.record((j, s), stand_in):
                    y = torch.func.functional_call(self.stages[j], self._flat[j].views(full), (x,))
                    if last:
                        y = self.loss_fn(y, self._target)
                full.data = torch.empty(0, dtype=full.dtype, device=full.device)  # the graph keeps none of it
                stand_in.ptr = None
            else:
                with self.meter.record((j, s)):
                    y = self.stages[j](x)
                    if last:
                        y = self.loss_fn(y, self._target)
        if last:
            if y.numel() != 1:
                raise ValueError(f"loss_fn: returned shape {tuple(y.shape)}; a scalar expected")
            self._loss = y.detach().reshape(())
        else:
            self.meter.add((j, s), y)
        self._kept[j] = (leaf, y, stand_in)

    def _backward(self, j, s):
        leaf, y, stand_in = self._kept.pop(j)
        grad_out = None if j == len(self.stages) - 1 else self._dy
        if self.relayed:
            full = stand_in.leaf
            buffer = torch.empty(self._flat[j].numel, dtype=self._flat[j].dtype, device=self.device)
            self._runtime.parameters(buffer, stream=self._stream())
            full.data = buffer
            stand_in.buffer = buffer
            torch.autograd.backward(y, grad_out)
            flat = full.grad if full.grad is not None else torch.zeros_like(buffer)
            full.grad = None
            full.data = torch.empty(0, dtype=full.dtype, device=full.device)
        else:
            torch.autograd.backward(y, grad_out)
            flat = self._flat[j].flat_grad()
            for p in self._flat[j].params:
                p.grad = None
        self._dy = leaf.grad if leaf is not None else None
        del leaf, y
        self.meter.release((j, s))
        self._runtime.reduce(j, flat, stream=self._stream())
        self._held[(j, s)] = flat

    # ---- state -------------------------------------------------------------------------

    def _drop(self):
        self._kept.clear()
        self._held.clear()
        self._dy = None

    def shards(self):
        """Relayed: {stage: (slice of the stage's flat parameters, this rank's shard)}."""
        if not self.relayed:
            raise RuntimeError("CyclicDataParallel.shards: parameters='relayed' only")
        return {j: (self._runtime.shard_range(j), s.detach()) for j, s in enumerate(self._shards)}

    def flat_parameters(self, stage):
        """Replicated: stage `stage`'s parameters end to end (a copy)."""
        if self.relayed:
            raise RuntimeError("CyclicDataParallel.flat_parameters: replicated only (relayed: shards())")
        return self._flat[stage].flat()

    @property
    def optimizers(self):
        """The optimizer of each stage (the same object L times for a shared one)."""
        return [self._optim[j] for j in range(len(self.stages))]

    def relay_summary(self):
        """Relayed: flatmem.CyclicRelaySummary (shard, replica and staging bytes, peaks)."""
        return self._runtime.relay_summary()

    def relay_stats(self, first=0, count=None):
        """Relayed: per time step parameter bytes held and relay bytes sent (flatmem.CyclicRelayTimeStep)."""
        return self._runtime.relay_stats(first, count)


__all__ = ["CyclicDataParallel", "split_sequential"]
