"""Stage-parallel cyclic training for torch (flatmem/cyclic_stages.h through flatmem.CyclicStages):
L ranks, one per stage, serve N staggered micro-batches per training step.

    stage = flatmem.torch.split_sequential(model, L)[comm.rank]     # this rank's stage
    sp = flatmem.torch.CyclicStageParallel(stage, torch.optim.SGD(stage.parameters(), lr=0.1), loss_fn,
                                           comm, micro_batches=N, steps=S,
                                           boundary_shapes=[(rows, width)] * (L - 1))
    for batches in loader:               # N (inputs, target) micro-batches of one step
        losses = sp.step(batches)        # last stage: {micro-batch: loss} of the step; others: {}
    sp.finish(); sp.close()

Micro-batch m of a step follows the cyclic schedule of data-parallel rank m of N
(flatmem.torch.CyclicDataParallel with N ranks and the same rule), so the training equals it: the
parameters of a stage exist once, on its rank; its gradient is summed over the micro-batches
locally (no all-reduce, averaged as 1/N of the sum) and only boundary tensors travel, activations
forward and their gradients backward, of exactly ``boundary_shapes[j]`` (the activation between
stages j and j+1, one micro-batch; every rank passes the same list) in the parameters' dtype.

Parameter versions: forward and backward of (micro-batch m, step s) at stage j use version
max(0, s - delay) (delay 0 "sync", 1 "delay1", the newest the stagger allows "newest"); the
module's parameters always hold the newest version (updated in place by the optimizer, one step
per training step), and the versions still in use are kept as copies (``schedule.versions_kept``
of them, at most 2 under "delay1").

``step(batches)`` takes the step's N micro-batches ((inputs, target) pairs; stage 0 reads the
inputs, the last stage the targets, the others neither: they may pass None) and runs this stage's
actions until the next one needs a later step's data or this stage finished the step's backwards.
``finish()`` runs the rest (the last update). Stage 0 and the last stage block their neighbours
while the caller is away from step(): call it again within the timeout.

Devices, failure and measured memory as flatmem.torch.CyclicDataParallel (CUDA parameters use
the NCCL device path after ``comm.init_device``; compiled, tested where a GPU exists).
"""
from __future__ import annotations

import math

import torch

from ..cyclic_stages import CyclicStages
from ._stages import CyclicRunner, FlatStage, StageOptimizers


class CyclicStageParallel(CyclicRunner):
    """This rank's stage (comm.rank) of stage-parallel cyclic training; creation is collective.

    stage            this rank's nn.Module (stage j maps the output of stage j - 1)
    optimizer        a torch.optim.Optimizer over its parameters, or a factory params -> Optimizer
    loss_fn          (output, target) -> scalar, used by the last stage
    micro_batches    N per step; steps: S; rule: "delay1" (default), "newest", "sync"
    boundary_shapes  L - 1 shapes: the activation between stages j and j + 1 of one micro-batch
    """

    def __init__(self, stage, optimizer, loss_fn, comm, *, micro_batches, steps, boundary_shapes=(),
                 rule="delay1", timeout_ms=0, history=0):
        self.flat = FlatStage(stage, "stage")
        self.module = stage
        self.loss_fn = loss_fn
        self.stage, self.stages = comm.rank, comm.world_size
        shapes = [tuple(int(d) for d in s) for s in boundary_shapes]
        if len(shapes) != self.stages - 1:
            raise ValueError(f"boundary_shapes: {len(shapes)} shapes; expected {self.stages - 1} (one per boundary "
                             "between stages)")
        self.boundary_shapes = shapes
        item = self.flat.params[0].element_size()
        self._start(CyclicStages(comm, micro_batches=micro_batches, steps=steps,
                                 boundary_bytes=[math.prod(s) * item for s in shapes], rule=rule,
                                 timeout_ms=timeout_ms, history=history,
                                 memory="cuda" if self.flat.device.type == "cuda" else "host"), self.flat.device)
        try:
            self._optim = StageOptimizers(optimizer, [self.flat.params])
        except BaseException:
            self._runtime.close()
            raise
        self.micro_batches, self.steps = int(micro_batches), int(steps)
        self._versions = {0: [p.detach().clone() for p in self.flat.params]}
        self._exclude_parameters()
        self._kept: dict = {}  # (step, micro-batch) -> (input leaf, output, parameter leaves)
        self._data: dict = {}  # step -> the caller's micro-batches
        self._pending = None  # an action taken from next() that waits for a later step's data
        self._backwards_done: dict = {}  # step -> backwards run
        self._losses: dict = {}  # step -> {micro-batch: loss}
        self._given = 0

    def _buffer(self, shape):
        t = torch.empty(shape, dtype=self.flat.dtype, device=self.device)
        return t, (t if t.device.type == "cuda" else t.numpy())

    # ---- the loop ----------------------------------------------------------------------

    def step(self, batches):
        """Give the next step's N micro-batches and run this stage until it needs later data or
        finished the step's backwards; returns {micro-batch: loss} of the step (last stage; {}
        elsewhere)."""
        self._check_usable()
        s = self._given
        if s >= self.steps:
            raise RuntimeError(f"CyclicStageParallel.step: all {self.steps} steps were given (steps= at construction)")
        batches = list(batches)
        if len(batches) != self.micro_batches:
            raise ValueError(f"batches: {len(batches)} micro-batches; expected {self.micro_batches}")
        self._data[s] = batches
        self._given += 1
        self._guarded(lambda: self._run_step(s))
        self._data.pop(s - 1, None)
        return self._losses.pop(s, {}) if self.stage == self.stages - 1 else {}

    def _run_step(self, s):
        while self._backwards_done.get(s, 0) < self.micro_batches:
            a = self._take()
            if a.kind == "done":
                raise RuntimeError("CyclicStageParallel.step: the schedule ended before this step's backwards")
            if a.step is not None and a.step >= self._given and self._needs_data(a):
                self._pending = a  # taken up again by the next step() call, with its data
                return
            self._act(a)

    def _take(self):
        """The action held back for lack of data, else the handle's next one."""
        a, self._pending = self._pending, None
        return a or self._runtime.next()

    def finish(self):
        """Run this stage to the end of the schedule (every step must have been given)."""
        self._check_usable()
        if self._given < self.steps:
            raise RuntimeError(f"CyclicStageParallel.finish: {self._given} of {self.steps} steps were given")
        self._guarded(self._run_to_done)
        self._done = True
        losses, self._losses = dict(sorted(self._losses.items())), {}
        return losses

    def _run_to_done(self):
        while (a := self._take()).kind != "done":
            self._act(a)

    def _needs_data(self, a):
        # stage 0's forward reads the inputs, the last stage's the targets; nothing else reads data
        return a.kind == "forward" and (self.stage == 0 or self.stage == self.stages - 1)

    def _act(self, a):
        if a.update_step is not None:
            self._update(a.update_step)
        if a.kind == "forward":
            self._forward(a)
        elif a.kind == "backward":
            self._backward(a)
        self._traced(a.time_step)

    def _update(self, v):
        average, view = self._buffer((self.flat.numel,))
        self._runtime.average(view, stream=self._stream())
        self.flat.set_grads(self.flat.params, average)
        self._optim.step(0)
        self._versions[v + 1] = [p.detach().clone() for p in self.flat.params]
        keep = self._runtime.schedule.versions_kept(self.stage)
        for old in [u for u in self._versions if u <= v + 1 - keep]:
            del self._versions[old]
        self._exclude_parameters()

    def _exclude_parameters(self):
        """The meter counts activations: the parameter versions the forwards save are not."""
        self.meter.exclude = {t.untyped_storage().data_ptr() for v in self._versions.values() for t in v} | {
            p.untyped_storage().data_ptr() for p in self.flat.params}

    def _forward(self, a):
        key = (a.step, a.micro_batch)
        last = self.stage == self.stages - 1
        if a.receives:
            x, view = self._buffer(self.boundary_shapes[self.stage - 1])
            self._runtime.receive(view, stream=self._stream())
            x.requires_grad_()
        else:
            x = self._data[a.step][a.micro_batch][0]
        leaves = [w.detach().requires_grad_() for w in self._versions[a.version]]
        with torch.enable_grad(), self.meter.record(key):
            y = torch.func.functional_call(self.module, dict(zip(self.flat.names, leaves)), (x,))
            if last:
                y = self.loss_fn(y, self._data[a.step][a.micro_batch][1])
        if last:
            self._losses.setdefault(a.step, {})[a.micro_batch] = y.detach().reshape(())
        else:
            self.meter.add(key, y)
        if a.sends:
            self._runtime.send(y.detach().contiguous(), stream=self._stream())
        self._kept[key] = (x if a.receives else None, y, leaves)

    def _backward(self, a):
        key = (a.step, a.micro_batch)
        x, y, leaves = self._kept.pop(key)
        dy = None
        if a.receives:
            dy, view = self._buffer(self.boundary_shapes[self.stage])
            self._runtime.receive(view, stream=self._stream())
        torch.autograd.backward(y, dy)
        self._runtime.accumulate(self.flat.flat_grad(leaves), stream=self._stream())
        if a.sends:
            self._runtime.send(x.grad.contiguous(), stream=self._stream())
        del x, y, leaves
        self.meter.release(key)
        self._backwards_done[a.step] = self._backwards_done.get(a.step, 0) + 1

    # ---- state -------------------------------------------------------------------------

    def _drop(self):
        self._kept.clear()
        self._pending = None


__all__ = ["CyclicStageParallel"]
