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
from any thread). The runtime (flatmem_cyclic_create / next / reduce) runs over
a communicator, which this binding does not wrap yet.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

from . import capi

_RULES = {"delay1": capi.CYCLIC_DELAY1, "newest": capi.CYCLIC_NEWEST, "sync": capi.CYCLIC_SYNC}
_RULE_NAMES = {v: k for k, v in _RULES.items()}
_KINDS = {
    capi.CYCLIC_IDLE: "idle",
    capi.CYCLIC_FORWARD: "forward",
    capi.CYCLIC_BACKWARD: "backward",
    capi.CYCLIC_DONE: "done",
}


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


class CyclicSchedule:
    """The shape of a cyclic schedule: world_size ranks, `stages` stages, `steps`
    training steps per rank, and the update rule: "delay1" (default; every stage
    applies the previous step's average), "newest" (this step's where the
    schedule allows) or "sync" (no stagger: plain data parallelism). The library
    checks the ranges at once (flatmem.InvalidArgumentError naming the field)."""

    def __init__(self, world_size, stages, steps, rule="delay1"):
        if isinstance(rule, str):
            try:
                code = _RULES[rule.lower()]
            except KeyError:
                raise ValueError(f"rule: '{rule}' is not one of {sorted(_RULES)}") from None
        else:
            code = int(rule)  # the library judges numbers it does not know
        self._raw = capi.CyclicSchedule(int(world_size), int(stages), int(steps), code)

    @property
    def world_size(self):
        return self._raw.world_size

    @property
    def stages(self):
        return self._raw.stages

    @property
    def steps(self):
        return self._raw.steps

    @property
    def rule(self):
        """The rule's name ("delay1", "newest", "sync")."""
        return _RULE_NAMES.get(self._raw.rule, self._raw.rule)

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
