"""The cyclic schedule queries (flatmem.CyclicSchedule, flatmem_cyclic_schedule_*)
against the closed forms of include/flatmem/cyclic.h, the raw capi structs, the
errors, and the README's cyclic snippet."""
import pathlib

import pytest
from python_support import run_concurrently, run_readme_block

import flatmem
from flatmem import capi

RULES = ("delay1", "newest", "sync")
# (N, L, steps): 2L/N whole, not whole, N = 2L, N > 2L, one rank, one stage.
SHAPES = [(1, 1, 2), (2, 1, 3), (3, 2, 2), (4, 2, 3), (8, 4, 3), (5, 3, 2), (7, 2, 2), (6, 4, 1)]


def expected_offset(n, stages, rule, rank):
    return 0 if rule == "sync" else rank * 2 * stages // n


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("n, stages, steps", SHAPES)
def test_actions_follow_the_closed_form(n, stages, steps, rule):
    s = flatmem.CyclicSchedule(n, stages, steps, rule)
    assert (s.world_size, s.stages, s.steps, s.rule) == (n, stages, steps, rule)
    period, length = 2 * stages, s.length()
    last_busy = 0
    for r in range(n):
        offset = s.offset(r)
        assert offset == expected_offset(n, stages, rule, r)
        for t in range(length + 3):
            a = s.action(r, t)
            assert a.time_step == t
            local = t - offset
            if local < 0 or local // period >= steps:
                assert a.kind == ("done" if t >= length else "idle"), (r, t, a)
                assert (a.stage, a.step, a.phase, a.activations_held) == (None, None, None, 0), (r, t, a)
                continue
            last_busy = max(last_busy, t + 1)
            step, p = divmod(local, period)
            kind, stage = ("forward", p) if p < stages else ("backward", 2 * stages - 1 - p)
            assert (a.kind, a.stage, a.step, a.phase) == (kind, stage, step, p), (r, t, a)
            assert a.activations_held == stage + 1, (r, t, a)
    assert length >= last_busy
    assert any(s.action(r, length - 1).kind != "done" for r in range(n))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("n, stages, steps", SHAPES)
def test_delays_and_every_average_applied_once_in_order(n, stages, steps, rule):
    s = flatmem.CyclicSchedule(n, stages, steps, rule)
    last_offset, period = s.offset(n - 1), 2 * stages
    for r in range(n):
        delays = [s.delay(r, j) for j in range(stages)]
        if rule == "delay1":
            assert delays == [1] * stages
        elif rule == "sync":
            assert delays == [0] * stages
        else:  # 0 when offset(N-1) - offset(r) <= 2j
            assert delays == [int(last_offset - s.offset(r) > 2 * j) for j in range(stages)]
        end = s.offset(r) + steps * period
        applied = [[] for _ in range(stages)]
        for a in s.actions(r):
            if a.update_stage is None:
                assert a.update_step is None
                continue
            applied[a.update_stage].append(a.update_step)
            target = a.update_step + 1 + delays[a.update_stage]
            if target < steps:
                assert (a.kind, a.stage, a.step) == ("forward", a.update_stage, target), (r, a)
            else:
                assert a.kind == "idle" and a.time_step >= end, (r, a)
        assert applied == [list(range(steps))] * stages, r


def test_activations_of_2l_cyclic_ranks_sum_to_a_constant():
    stages, steps = 4, 3
    n = 2 * stages
    cyclic = flatmem.CyclicSchedule(n, stages, steps)
    held = lambda s, t: sum(s.action(r, t).activations_held for r in range(n))  # noqa: E731
    for t in range(cyclic.offset(n - 1), steps * 2 * stages):
        assert held(cyclic, t) == n * (stages + 1) // 2, t
    sync = flatmem.CyclicSchedule(n, stages, steps, "sync")
    assert max(held(sync, t) for t in range(sync.length())) == n * stages


def test_capi_structs():
    assert (capi.CYCLIC_DELAY1, capi.CYCLIC_NEWEST, capi.CYCLIC_SYNC) == (0, 1, 2)
    assert (capi.CYCLIC_IDLE, capi.CYCLIC_FORWARD, capi.CYCLIC_BACKWARD, capi.CYCLIC_DONE) == (0, 1, 2, 3)
    raw = capi.CyclicSchedule(8, 4, 3, capi.CYCLIC_NEWEST)
    assert (raw.world_size, raw.stages, raw.steps, raw.rule) == (8, 4, 3, capi.CYCLIC_NEWEST)
    assert raw.struct_size > 0
    with pytest.raises(AttributeError):
        raw.struct_size = 0
    assert capi.CyclicSchedule(2, 2, 2).rule == capi.CYCLIC_DELAY1  # the default
    a = raw.action(5, 7)  # flatmem_cyclic_schedule_action, raw: -1 for none
    assert isinstance(a, capi.CyclicAction)
    assert (a.time_step, a.kind, a.stage, a.step, a.update_stage, a.update_step, a.activations_held, a.phase) == (
        7, capi.CYCLIC_FORWARD, 2, 0, -1, -1, 3, 2)
    with pytest.raises(AttributeError):
        a.stage = 0
    done = raw.action(0, raw.length())
    assert (done.kind, done.stage, done.phase) == (capi.CYCLIC_DONE, -1, -1)
    assert flatmem.CyclicAction.from_capi(a) == flatmem.CyclicSchedule(8, 4, 3, "newest").action(5, 7)
    # A schedule edited after construction is checked again by each query.
    raw.world_size = 0
    with pytest.raises(flatmem.InvalidArgumentError, match=r"schedule\.world_size: 0"):
        raw.length()


def test_errors_name_the_argument():
    with pytest.raises(flatmem.InvalidArgumentError, match=r"schedule\.world_size: 0; expected 1 \.\. 1048576"):
        flatmem.CyclicSchedule(0, 2, 1)
    with pytest.raises(flatmem.InvalidArgumentError, match=r"schedule\.stages: 65536"):
        flatmem.CyclicSchedule(2, 65536, 1)
    with pytest.raises(flatmem.InvalidArgumentError, match=r"schedule\.steps: 0"):
        flatmem.CyclicSchedule(2, 2, 0)
    with pytest.raises(flatmem.InvalidArgumentError, match=r"schedule\.rule: 7"):
        flatmem.CyclicSchedule(2, 2, 1, 7)
    with pytest.raises(ValueError, match="rule: 'fastest' is not one of"):
        flatmem.CyclicSchedule(2, 2, 1, "fastest")
    with pytest.raises(OverflowError):
        flatmem.CyclicSchedule(2**31, 2, 1)
    s = flatmem.CyclicSchedule(4, 2, 3)
    with pytest.raises(flatmem.InvalidArgumentError, match=r"rank: 4; expected 0 \.\. 3") as e:
        s.offset(4)
    assert e.value.status == capi.STATUS_INVALID_ARGUMENT and "rank: 4" in e.value.detail
    with pytest.raises(flatmem.InvalidArgumentError, match=r"stage: 2; expected 0 \.\. 1"):
        s.delay(0, 2)
    with pytest.raises(flatmem.InvalidArgumentError, match=r"time_step: -1; expected >= 0"):
        s.action(0, -1)
    with pytest.raises(flatmem.InvalidArgumentError, match=r"rank: -1"):
        s.action(-1, 0)


def test_queries_from_threads():
    s = flatmem.CyclicSchedule(8, 4, 3, "newest")
    expected = [s.actions(r) for r in range(8)]

    def run(r):
        for _ in range(5):
            assert s.actions(r) == expected[r]
        return True

    assert run_concurrently(run, 8) == [True] * 8


def test_readme_cyclic_snippet_runs(capsys):
    run_readme_block(pathlib.Path(__file__).resolve().parents[1] / "README.md", "CyclicSchedule")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "5 1 39"
    assert lines[1] == "forward 2 0 3"
    count, first = lines[2].split(" ", 1)
    assert int(count) == 4 * 3  # L stages x steps averages
    assert first.startswith("(")
