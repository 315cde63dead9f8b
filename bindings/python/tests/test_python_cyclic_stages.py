"""flatmem.CyclicStages (flatmem_cyclic_stages_t): one rank per stage of an
L-stage NumPy MLP (python_stage_mlp.py) serving N micro-batches, over 2 and 3
processes (UCX on loopback) and threads of an in-process group, against

* a single-process NumPy simulation of the schedule's math (every rule,
  bitwise: the same NumPy operations in the same order), and
* flatmem.Cyclic data-parallel training on N ranks ("delay1", "newest":
  bitwise, as the C tests compare them);

the pure schedule queries against the header's closed forms; the statistics
against the schedule; errors (a stage that stops or is killed, bad options,
calls out of order) as the binding's exception classes. Every thread and
process has a deadline (run_threads, python_ranks)."""
import pathlib
import time

import numpy as np
import pytest
from python_ranks import launch, run
from python_stage_mlp import StageMlp, delay, simulate, train_data_parallel, train_stage, train_stages
from python_support import raises_flatmem, run_readme_block
from test_python_comm import assert_waits_without_gil, local_group, run_threads  # noqa: F401 (fixture)

import flatmem
from flatmem import capi

LR = 0.25


def mlp_of(case):
    widths, rows, dtype = case
    return StageMlp(widths, rows, seed=7, dtype=dtype)


def assert_bitwise(got, want, what):
    assert len(got) == len(want)
    for j, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (what, j)
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), (
            f"{what}: stage {j} differs in {np.count_nonzero(g != w)} of {g.size} parameters; "
            f"max |diff| {np.max(np.abs(g.astype(np.float64) - w))}")


# ---------------------------------------------------------------------------
# the pure schedule
# ---------------------------------------------------------------------------

# (L, N, S): N = L, N = 2L, N not dividing 2L, N prime, N = 1, L = 1, N > 2L.
SCHEDULE_SHAPES = [(2, 2, 3), (2, 4, 2), (3, 5, 3), (3, 7, 2), (4, 1, 3), (1, 3, 3), (2, 9, 2), (4, 6, 3)]
RULES = ("delay1", "newest", "sync")


def expected_timeline(L, N, S, rule, j):
    """The header's closed forms: every (time step, kind, m, s, version) of stage j,
    backwards first, then forwards, each by ascending micro-batch."""
    offset = [m * 2 * L // N for m in range(N)]
    period = 2 * L + (offset[-1] if rule == "sync" else 0)
    events = []
    for s in range(S):
        for m in range(N):
            version = max(0, s - delay(rule, N, L, m, j))
            events.append((offset[m] + period * s + j, 1, "forward", m, s, version))
            events.append((offset[m] + period * s + 2 * L - 1 - j, 0, "backward", m, s, version))
    return [(t, kind, m, s, v) for t, _, kind, m, s, v in sorted(events)]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("L, N, S", SCHEDULE_SHAPES)
def test_schedule_matches_the_closed_forms(L, N, S, rule):
    sched = flatmem.CyclicStagesSchedule(L, N, S, rule)
    assert (sched.stages, sched.micro_batches, sched.steps, sched.rule) == (L, N, S, rule)
    offsets = [m * 2 * L // N for m in range(N)]
    assert [sched.offset(m) for m in range(N)] == offsets
    period = 2 * L + (offsets[-1] if rule == "sync" else 0)
    assert sched.period() == period
    assert sched.length() == offsets[-1] + period * (S - 1) + 2 * L - 1 + 2  # B(0, N-1, S-1) + 2
    for j in range(L):
        timeline = sched.timeline(j)
        work = [a for a in timeline if a.kind != "idle"]
        assert [(a.time_step, a.kind, a.micro_batch, a.step, a.version) for a in work] == \
            expected_timeline(L, N, S, rule, j), (j, rule)
        for a in work:
            assert a.stage == j
            assert a.receives == ((a.kind == "forward" and j > 0) or (a.kind == "backward" and j < L - 1))
            assert a.sends == ((a.kind == "forward" and j < L - 1) or (a.kind == "backward" and j > 0))
            assert a.accumulates == (a.kind == "backward")
        # Every version 1 .. S is formed once, in order, before its first use.
        updates = [a.update_step for a in timeline if a.update_step is not None]
        assert updates == list(range(S)), (j, updates)
        formed = 0
        K = sched.versions_kept(j)
        assert K in (1, 2)
        alive = {0}
        for a in timeline:
            if a.update_step is not None:
                formed = a.update_step + 1
                alive = {v for v in alive if v > formed - K} | {formed}
            if a.version is not None:
                assert a.version <= formed and a.version in alive, (j, a, K)  # slot version % K holds it
        # Actions of one time step are numbered.
        for t in {a.time_step for a in timeline}:
            here = sched.actions(j, t)
            assert [a.index_in_time_step for a in here] == list(range(len(here)))
            assert {a.actions_in_time_step for a in here} == {len(here)}
        assert sched.actions(j, sched.length()) == []


def test_occupancy_of_n_equals_l_is_full():
    """N = L: every stage runs exactly one action per time step in steady state."""
    for L in (2, 4):
        sched = flatmem.CyclicStagesSchedule(L, L, 6)
        for j in range(L):
            o = sched.occupancy(j)
            assert isinstance(o, flatmem.CyclicStagesOccupancy)
            assert (o.busy_fraction, o.peak_actions) == (1.0, 1)
            assert o.mean_activations_held == pytest.approx(L * (2 * L - 2 * j) / (2 * L))
    sync = flatmem.CyclicStagesSchedule(4, 4, 6, "sync")
    assert sync.occupancy(0).busy_fraction < 1.0  # the pipeline drains every step


def test_schedule_errors_name_the_field():
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "schedule.micro_batches: 0"):
        flatmem.CyclicStagesSchedule(2, 0, 1)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "schedule.stages: 65536"):
        flatmem.CyclicStagesSchedule(65536, 2, 1)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "schedule.steps: 0"):
        flatmem.CyclicStagesSchedule(2, 2, 0)
    with pytest.raises(ValueError, match="rule: 'fastest' is not one of"):
        flatmem.CyclicStagesSchedule(2, 2, 1, "fastest")
    sched = flatmem.CyclicStagesSchedule(2, 3, 2)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "micro_batch: 3"):
        sched.offset(3)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "stage: 2"):
        sched.versions_kept(2)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "time_step: -1"):
        sched.actions(0, -1)
    with pytest.raises(flatmem.InvalidArgumentError, match="index 1; stage 0 has 1 action"):  # the binding's
        sched._raw.action(0, 0, 1)


# ---------------------------------------------------------------------------
# training: against the simulation and the data-parallel runtime
# ---------------------------------------------------------------------------

# (widths, rows, dtype): 3 stages, 2 stages, 1 stage; odd widths and rows.
MLP_3 = ([3, 5, 4, 2], 3, "float64")
MLP_2 = ([4, 3, 2], 2, "float32")
MLP_1 = ([3, 2], 1, "float64")


def check_training(results, mlp, N, S, rule):
    """Each stage's trained parameters equal the simulation's bitwise; the
    statistics agree with the schedule."""
    want = simulate(mlp, N, S, rule, LR)
    assert_bitwise([r["params"] for r in results], want, f"stage-parallel {rule} vs simulation")
    sched = flatmem.CyclicStagesSchedule(mlp.stages, N, S, rule)
    bounds = mlp.boundary_bytes()
    for j, r in enumerate(results):
        assert r["versions_kept"] == sched.versions_kept(j)
        assert [a for a in r["actions"]] == sched.timeline(j)
        summary, stats = r["summary"], r["stats"]
        assert summary.actions == len(r["actions"])
        assert summary.time_steps == len(stats) and [s.time_step for s in stats] == list(range(len(stats)))
        assert [s.actions for s in stats] == [len(sched.actions(j, t)) for t in range(len(stats))]
        # Each send carries boundary_bytes of its boundary + a 32-byte header.
        sent = {t: 0 for t in range(len(stats))}
        for a in r["actions"]:
            if a.sends:
                sent[a.time_step] += bounds[j if a.kind == "forward" else j - 1] + 32
        assert [s.bytes_sent for s in stats] == [sent[t] for t in range(len(stats))]
        assert summary.bytes_sent == sum(sent.values()) and summary.messages_sent == sum(a.sends for a in r["actions"])
        assert summary.steady_busy_fraction == sched.occupancy(j).busy_fraction
        if j == mlp.stages - 1:
            assert sorted(r["losses"]) == [(s, m) for s in range(S) for m in range(N)]


def stage_params(case, N, S, rule):
    widths, rows, dtype = case
    return {"widths": widths, "rows": rows, "seed": 7, "dtype": dtype, "micro_batches": N, "steps": S,
            "rule": rule, "lr": LR}


@pytest.mark.parametrize("case, N, S, rule", [(MLP_3, 5, 3, "newest"), (MLP_3, 3, 3, "sync"),
                                              (MLP_2, 4, 4, "delay1"), (MLP_2, 3, 3, "newest"),
                                              (MLP_1, 3, 3, "delay1")])
def test_local_group_stages_equal_the_simulation(local_group, case, N, S, rule):
    mlp = mlp_of(case)
    results = run_threads(local_group(mlp.stages), lambda c, _: train_stages(c, mlp, N, S, rule, LR))
    check_training(results, mlp, N, S, rule)


@pytest.mark.parametrize("case, N, rule", [(MLP_3, 5, "newest"), (MLP_2, 4, "delay1"), (MLP_2, 3, "newest")])
def test_local_group_stages_equal_data_parallel_cyclic(local_group, case, N, rule):
    """L stage ranks serving N micro-batches train exactly what flatmem.Cyclic
    trains on N ranks (rank m <-> micro-batch m)."""
    mlp, S = mlp_of(case), 3
    stages = run_threads(local_group(mlp.stages), lambda c, _: train_stages(c, mlp, N, S, rule, LR))
    replicas = run_threads(local_group(N), lambda c, _: train_data_parallel(c, mlp, S, rule, LR))
    for w in replicas:
        assert_bitwise(w, replicas[0], "data-parallel ranks")
    assert_bitwise([r["params"] for r in stages], replicas[0], f"stage-parallel vs data-parallel {rule}")


def test_the_references_tell_the_rules_apart():
    """The comparisons above can fail: the simulation under another rule, or
    with one gradient dropped, gives other parameters."""
    mlp = mlp_of(MLP_3)
    newest, delay1 = simulate(mlp, 5, 3, "newest", LR), simulate(mlp, 5, 3, "delay1", LR)
    assert all(not np.array_equal(a, b) for a, b in zip(newest, delay1))
    assert not np.array_equal(simulate(mlp, 4, 3, "sync", LR)[0], simulate(mlp, 5, 3, "sync", LR)[0])


@pytest.mark.parametrize("case, N, rule", [(MLP_2, 3, "newest"), (MLP_3, 4, "delay1")])
def test_processes_stages_equal_the_simulation(tmp_path, case, N, rule):
    """2 and 3 stage processes over UCX."""
    mlp, S = mlp_of(case), 3
    check_training(run(tmp_path, "stages", mlp.stages, stage_params(case, N, S, rule)), mlp, N, S, rule)


# ---------------------------------------------------------------------------
# failures
# ---------------------------------------------------------------------------

def test_a_stage_that_stops_times_out_the_other_naming_what_it_waited_for(local_group):
    """Stage 1 stops calling next() after its first action: stage 0 waits for
    the output gradient of micro-batch 0 and raises CommTimeoutError (a
    TimeoutError) within the timeout, naming stage, micro-batch, step and peer;
    its next call raises CommPoisonedError."""
    timeout_ms = 1500
    mlp = mlp_of(MLP_2)
    comms = local_group(2, timeout_ms=10000)
    out = {}

    def job(comm, _):
        h = flatmem.CyclicStages(comm, micro_batches=2, steps=2, boundary_bytes=mlp.boundary_bytes(),
                                 timeout_ms=timeout_ms)
        if comm.rank == 1:
            h.next()
            time.sleep(timeout_ms / 1000 + 1.0)  # stopped (the handle is still open)
            h.close()
            return
        start = time.monotonic()
        with pytest.raises(flatmem.CommTimeoutError) as info:
            train_stage(h, mlp, LR)
        out["elapsed"], out["message"] = time.monotonic() - start, str(info.value)
        assert isinstance(info.value, TimeoutError)
        with pytest.raises(flatmem.CommPoisonedError):
            h.next()
        h.close()

    run_threads(comms, job)
    assert out["elapsed"] < timeout_ms / 1000 + 1.0, out
    assert "cyclic stages, stage 0, micro-batch 0, step 0" in out["message"], out
    assert "stage 1 (rank 1)" in out["message"], out


def test_killed_stage_process_fails_its_neighbour(tmp_path):
    """SIGKILL of stage 1 of 2 mid-run: stage 0 raises PeerFailureError or
    CommTimeoutError within the timeout, naming itself and the dead stage;
    later calls raise CommPoisonedError."""
    timeout_ms = 5000
    params = dict(stage_params(MLP_2, 3, 3, "delay1"), victim=1, timeout_ms=timeout_ms)
    ranks = launch(tmp_path, "stages_killed", 2, params)
    ranks.wait_ready(range(2), 30)
    time.sleep(0.5)
    ranks.kill(1)
    res = ranks.results(30, expect_killed=(1,))[0]
    name, message = res["first"]
    assert name in ("PeerFailureError", "CommTimeoutError"), res
    assert "cyclic stages, stage 0" in message and "rank 1" in message, message
    assert res["elapsed"] < timeout_ms / 1000 + 1.5, res
    assert res["later"] == "CommPoisonedError", res


def test_bad_options_name_the_field(local_group):
    (c,) = local_group(1)
    (c2a, c2b) = local_group(2)
    with pytest.raises(ValueError, match=r"boundary_bytes: shape \(2,\); expected \(1,\)"):
        flatmem.CyclicStages(c2a, micro_batches=2, steps=1, boundary_bytes=[8, 8])
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "options.micro_batches: 0"):
        flatmem.CyclicStages(c, micro_batches=0, steps=1)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "options.steps: 0"):
        flatmem.CyclicStages(c, micro_batches=1, steps=0)
    with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                        "options.stages: 2 but the communicator has 1 ranks"):
        flatmem.CyclicStages(c, micro_batches=1, steps=1, stages=2, boundary_bytes=[8])
    with pytest.raises(ValueError, match="rule: 'slow' is not one of"):
        flatmem.CyclicStages(c, micro_batches=1, steps=1, rule="slow")
    with pytest.raises(ValueError, match=r"activation_bytes: shape \(2,\); expected \(1,\)"):
        flatmem.CyclicStages(c, micro_batches=1, steps=1, activation_bytes=[1, 2])

    def job(comm, _):  # boundary_bytes that differ between the ranks
        with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                            "options.boundary_bytes[0]: rank 1 has 16 but rank 0 has 8"):
            flatmem.CyclicStages(comm, micro_batches=2, steps=1, boundary_bytes=[8 * (comm.rank + 1)])

    run_threads([c2a, c2b], job)
    assert c._raw.users() == 0  # nothing was kept by the refused creates


def test_calls_out_of_order_are_refused_and_change_nothing(local_group):
    """Stage 0 of 2 with N = 1, S = 1: forward (sends), backward (receives,
    accumulates), then the update-only action, then done. Stage 1 plays its
    part correctly."""
    mlp = mlp_of(MLP_2)
    comms = local_group(2, timeout_ms=5000)
    bytes0 = mlp.boundary_bytes()

    def job(comm, _):
        with flatmem.CyclicStages(comm, micro_batches=1, steps=1, boundary_bytes=bytes0,
                                  timeout_ms=5000) as h:
            if comm.rank == 1:
                return train_stage(h, mlp, LR)["params"]
            y = np.ones((mlp.rows, mlp.widths[1]), mlp.dtype)
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                                "tensor: the current action"):
                h.send(y)  # before the first next()
            a = h.next()
            assert (a.kind, a.sends, a.receives, a.update_step) == ("forward", True, False, None)
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                                "needs flatmem_cyclic_stages_send first"):
                h.next()
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "receives nothing"):
                h.receive(np.empty_like(y))
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "carries no update"):
                h.average(np.empty(mlp.count(0), mlp.dtype))
            with pytest.raises(flatmem.InvalidArgumentError, match="no gradient was accumulated yet"):
                h.average()
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "more than"):
                h.send(np.ones(bytes0[0] + 1, np.uint8))
            h.send(y)
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "already sent"):
                h.send(y)
            b = h.next()
            assert (b.kind, b.receives, b.accumulates, b.sends) == ("backward", True, True, False)
            with pytest.raises(TypeError, match="into: an output must be a NumPy array"):
                h.receive([0.0])
            dy = h.receive(np.empty_like(y))
            g = np.ones(mlp.count(0), mlp.dtype)
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "gradient: dtype"):
                h.accumulate(g.astype(np.int32))
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                                "needs flatmem_cyclic_stages_accumulate first"):
                h.next()
            h.accumulate(g)
            u = h.next()
            assert (u.kind, u.update_step) == ("idle", 0)
            avg = h.average()
            assert avg.dtype == mlp.dtype and avg.tolist() == g.tolist()  # one micro-batch: the mean is g
            assert h.next().kind == "done" and h.next().kind == "done"
            return dy

    run_threads(comms, job)


def test_next_and_receive_release_the_gil(local_group):
    c0, c1 = local_group(2, timeout_ms=3000)
    handles = run_threads([c0, c1], lambda c, _: flatmem.CyclicStages(c, micro_batches=1, steps=1,
                                                                        boundary_bytes=[8], timeout_ms=3000))
    h0, h1 = handles
    assert h1.next().kind == "forward"
    got = np.zeros(1)
    assert_waits_without_gil(lambda: h1.receive(got), lambda: (h0.next(), h0.send(np.full(1, 2.5))))
    assert got.tolist() == [2.5]
    for h in handles:
        h.close()  # before done: poisons the group (the fixture aborts it)


def test_close_is_refused_while_cyclic_stages_uses_the_communicator(local_group):
    (c,) = local_group(1)
    h = flatmem.CyclicStages(c, micro_batches=1, steps=1)
    assert c._raw.users() == 1 and "stage=0" in repr(h)
    with pytest.raises(flatmem.InvalidArgumentError, match="still used by 1 handle"):
        c.close()
    h.close()
    assert h.closed and c._raw.users() == 0
    with pytest.raises(flatmem.InvalidArgumentError, match="the CyclicStages handle is closed"):
        h.next()
    c.close()


def test_readme_stage_parallel_snippet_runs(capsys):
    namespace = run_readme_block(pathlib.Path(__file__).resolve().parents[1] / "README.md", "CyclicStages(")
    lines = capsys.readouterr().out.splitlines()
    sched = flatmem.CyclicStagesSchedule(2, 4, 3)
    assert lines[0] == f"{sched.period()} {sched.length()} {sched.versions_kept(0)} {sched.occupancy(0).busy_fraction}"
    assert lines[1] == str([(a.kind, a.micro_batch, a.step) for a in sched.actions(1, 5)])
    assert sorted(line.split()[1] for line in lines[2:]) == ["0", "1"]
    for j, w in enumerate(namespace["trained"]):  # trained: moved away from the initial parameters
        assert w.shape == (3, 3) and not np.array_equal(w, np.eye(3) * (j + 1))


def test_a_receive_of_the_wrong_size_names_both_and_fails_the_neighbour(local_group):
    """Stage 1 receives stage 0's 24-byte activation into 16 bytes: InvalidArgumentError
    naming both sizes, nothing written, and both handles fail from then on."""
    comms = local_group(2, timeout_ms=3000)

    def job(comm, _):
        with flatmem.CyclicStages(comm, micro_batches=1, steps=1, boundary_bytes=[24], timeout_ms=3000) as h:
            a = h.next()
            if comm.rank == 0:
                h.send(np.arange(3.0))
                start = time.monotonic()
                with pytest.raises(ConnectionError, match="rank 1"):  # PeerFailureError / CommPoisonedError
                    assert h.next().receives  # the backward: the gradient from stage 1 never comes
                    h.receive(np.empty(3))
                assert time.monotonic() - start < 2.5  # at once, not at the 3 s timeout
                return
            assert a.receives
            into = np.full(2, -1.0)
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT, "24", "16"):
                h.receive(into)
            assert into.tolist() == [-1.0, -1.0]
            with pytest.raises(flatmem.CommPoisonedError):
                h.next()

    run_threads(comms, job)
