"""flatmem.torch.CyclicDataParallel and CyclicStageParallel, the ranks as threads of this process
(torch_cyclic_support.py): the rules against one process on the concatenated batch, relayed
against replicated, stage-parallel against data-parallel, the measured activations of the stagger,
failures and bad input. test_torch_cyclic_torchrun.py runs real processes under torchrun.

Tolerances. float64 runs are held to 1e-12 (absolute, parameters of magnitude ~1): the only
differences from the reference are summation orders (the average over ranks, (g_0 + g_1 + ...) *
fl(1/N), against one gradient of the concatenated rows), a few ulps per step over 5 steps. float32
runs (Adam) to 2e-5: per step each gradient element carries ~(rows * N + width) * 2^-24 ~ 3e-6
relative error, times lr and 5 steps, plus Adam's division by sqrt(v) ~ |g| (relative errors pass
through at O(1)), lr 1e-2: ~1e-6, a 20x margin; a wrong parameter version moves parameters by
~lr |g| ~ 1e-2. Where both sides run the same operations in the same order (stage-parallel against
data-parallel under "delay1" / "newest", relayed SGD against replicated SGD) they must be bitwise.
"""
import pytest
import torch
from torch import nn

import flatmem
import flatmem.torch as fmt
from torch_cyclic_support import (adam, data, in_threads, loss_fn, mlp, reference, sgd, train_data_parallel,
                                  train_stage_parallel)

STEPS = 5
F64 = dict(dtype=torch.float64)


def flat_of(run):
    return torch.cat(run[0]["flat"])


def close(a, b, tol):
    return (a - b).abs().max().item() <= tol


@pytest.mark.parametrize("world,stages", [(1, 1), (1, 3), (2, 2), (3, 3), (4, 2), (4, 3)])
def test_sync_equals_one_process_on_the_concatenated_batch(world, stages):
    got = train_data_parallel(world, stages, STEPS, "sync", sgd(0.1), **F64)
    want_losses, want = reference(world, STEPS, 0, sgd(0.1), **F64)
    for r in range(world):  # every replica the same, and the reference's
        assert close(torch.cat(got[r]["flat"]), want, 1e-12), r
    mean_losses = [sum(float(got[r]["losses"][s]) for r in range(world)) / world for s in range(STEPS)]
    assert all(abs(a - b) <= 1e-12 for a, b in zip(mean_losses, want_losses)), (mean_losses, want_losses)
    assert not close(want, reference(world, STEPS, 1, sgd(0.1), **F64)[1], 1e-6)  # the rules differ here


@pytest.mark.parametrize("world,stages", [(1, 2), (2, 3), (3, 2), (4, 4)])
def test_delay1_is_the_same_optimizer_one_step_late(world, stages):
    hidden = (16, 16, 16)  # four layers with parameters: up to four stages
    got = train_data_parallel(world, stages, STEPS, "delay1", sgd(0.1), hidden=hidden, **F64)
    _, want = reference(world, STEPS, 1, sgd(0.1), hidden=hidden, **F64)
    for r in range(world):
        assert close(torch.cat(got[r]["flat"]), want, 1e-12), r


@pytest.mark.parametrize("rule,delay", [("sync", 0), ("delay1", 1)])
def test_adam_one_optimizer_over_every_stage_float32(rule, delay):
    # one torch.optim.Adam over the whole model, stepped once per stage update
    got = train_data_parallel(3, 3, STEPS, rule, adam(1e-2), shared_optimizer=True)
    _, want = reference(3, STEPS, delay, adam(1e-2))
    assert close(flat_of(got), want, 2e-5)
    assert not close(want, reference(3, STEPS, 1 - delay, adam(1e-2))[1], 1e-4)


@pytest.mark.parametrize("world,stages", [(2, 2), (3, 3), (4, 2), (4, 3)])
def test_relayed_equals_replicated(world, stages):
    replicated = train_data_parallel(world, stages, STEPS, "delay1", sgd(0.1))
    relayed = train_data_parallel(world, stages, STEPS, "delay1", sgd(0.1), parameters="relayed")
    for r in range(world):
        assert [float(x) for x in relayed[r]["losses"]] == [float(x) for x in replicated[r]["losses"]]
        for j, (where, shard) in relayed[r]["shards"].items():
            assert torch.equal(shard, replicated[r]["flat"][j][where]), (r, j)
        # the relayed graph saves no parameter tensor (it would count as an activation here): the
        # weights the backward needs are re-read from the relay's copy for the backward
        assert relayed[r]["peak"] == replicated[r]["peak"]
        relay = relayed[r]["relay"]
        # each rank keeps ~1/N of the parameters (ceil(n_j / N) elements of every stage at most), plus
        # the relay's staging of full stages (K buffers of the largest; bench/torch_cdp_bench.py weighs it)
        assert relay.shard_bytes <= relay.replicated_bytes / world + 4 * stages
        assert relay.peak_parameter_bytes_scheduled <= relay.shard_bytes + relay.staging_bytes


def test_relayed_adam_equals_replicated_float32():
    replicated = train_data_parallel(3, 3, STEPS, "delay1", adam(1e-2))
    relayed = train_data_parallel(3, 3, STEPS, "delay1", adam(1e-2), parameters="relayed")
    for j, (where, shard) in relayed[1]["shards"].items():
        assert close(shard, replicated[1]["flat"][j][where], 1e-6), j


@pytest.mark.parametrize("rule", ["delay1", "newest", "sync"])
@pytest.mark.parametrize("micro_batches,stages", [(1, 2), (3, 3), (4, 2), (5, 3)])
def test_stage_parallel_equals_data_parallel(rule, micro_batches, stages):
    dp = train_data_parallel(micro_batches, stages, STEPS, rule, sgd(0.1))
    sp = train_stage_parallel(micro_batches, stages, STEPS, rule, sgd(0.1))
    for j in range(stages):
        if rule == "sync":  # the data-parallel all-reduce adds in its own order
            assert close(sp[j]["flat"], dp[0]["flat"][j], 1e-6), j
        else:
            assert torch.equal(sp[j]["flat"], dp[0]["flat"][j]), j
    last = sp[stages - 1]["losses"]
    for s in range(STEPS):
        assert sorted(last[s]) == list(range(micro_batches))
        for m in range(micro_batches):
            if rule == "sync":  # parameters a few ulps apart (above)
                assert abs(float(last[s][m]) - float(dp[m]["losses"][s])) <= 1e-6, (s, m)
            else:
                assert float(last[s][m]) == float(dp[m]["losses"][s]), (s, m)
    assert all(sp[j]["losses"] == [{}] * STEPS for j in range(stages - 1))


def summed_peak(runs):
    """The most activation bytes all ranks held at one global time step (measured traces)."""
    total = {}
    for run in runs:
        held = dict(run["trace"])  # the last action of each time step
        for t, b in held.items():
            total[t] = total.get(t, 0) + b
    return max(total.values())


def test_the_stagger_lowers_the_summed_activation_peak():
    # N = 4, L = 4: the ranks in lockstep ("sync") all hold every stage's activations at once; staggered
    # by 2L / N time steps they hold (N + 1) / 2N of that at most (the schedule's 0.625 at N = 4)
    sync = train_data_parallel(4, 4, 4, "sync", sgd(0.1), hidden=(32, 32, 32))
    staggered = train_data_parallel(4, 4, 4, "delay1", sgd(0.1), hidden=(32, 32, 32))
    per_rank = max(run["peak"] for run in sync)
    assert summed_peak(sync) == 4 * per_rank
    assert max(run["peak"] for run in staggered) == per_rank  # one rank holds as much as before
    assert summed_peak(staggered) <= 0.65 * summed_peak(sync), (summed_peak(staggered), summed_peak(sync))


def test_a_rank_that_leaves_fails_the_others_and_the_wrapper_stays_failed():
    world = 3
    comms = flatmem.Communicator.create_local(world, timeout_ms=5000)
    models = [mlp(0) for _ in range(world)]

    def rank(r):
        cdp = fmt.CyclicDataParallel(fmt.split_sequential(models[r], 2), sgd(0.1), loss_fn, comms[r], steps=4,
                                     rule="delay1", timeout_ms=5000)
        if r == 1:
            cdp.step(*data(0, r))
            cdp.close()  # before the end of its schedule: the peers fail naming it
            return "left"
        try:
            for s in range(4):
                cdp.step(*data(s, r))
            cdp.finish()
        except flatmem.Error as e:
            with pytest.raises(RuntimeError, match="failed earlier"):
                cdp.step(*data(3, r))
            cdp.close()
            return e
        return "no error"

    out, errors = in_threads(world, rank)
    assert errors == [None] * world, errors
    assert out[1] == "left"
    for r in (0, 2):
        assert isinstance(out[r], flatmem.Error), out[r]
        assert "1" in str(out[r]), str(out[r])


def test_bad_input_is_refused_naming_the_argument():
    comm = flatmem.Communicator.create_local(1)[0]
    stages = fmt.split_sequential(mlp(0), 2)
    with pytest.raises(TypeError, match="optimizer"):
        fmt.CyclicDataParallel(stages, "sgd", loss_fn, comm, steps=1)
    with pytest.raises(TypeError, match="relayed"):
        fmt.CyclicDataParallel(stages, torch.optim.SGD([p for s in stages for p in s.parameters()], lr=0.1),
                               loss_fn, comm, steps=1, parameters="relayed")
    with pytest.raises(ValueError, match="parameters"):
        fmt.CyclicDataParallel(stages, sgd(0.1), loss_fn, comm, steps=1, parameters="sharded")
    with pytest.raises(ValueError, match="does not hold parameter 0 of stage 1"):
        fmt.CyclicDataParallel(stages, torch.optim.SGD(stages[0].parameters(), lr=0.1), loss_fn, comm, steps=1)
    with pytest.raises(TypeError, match=r"stages\[0\].*bfloat16"):
        fmt.CyclicDataParallel([nn.Linear(2, 2, dtype=torch.bfloat16)], sgd(0.1), loss_fn, comm, steps=1)
    with pytest.raises(ValueError, match=r"stages\[1\]: has no parameter"):
        fmt.CyclicDataParallel([nn.Linear(2, 2), nn.Tanh()], sgd(0.1), loss_fn, comm, steps=1)
    with pytest.raises(ValueError, match="rule: 'sometimes'"):
        fmt.CyclicDataParallel(stages, sgd(0.1), loss_fn, comm, steps=1, rule="sometimes")
    with pytest.raises(ValueError, match=r"split_sequential: stages: 4; expected 1 \.\. 3"):
        fmt.split_sequential(mlp(0), 4)  # three Linear layers
    with pytest.raises(ValueError, match="boundary_shapes"):
        fmt.CyclicStageParallel(stages[0], sgd(0.1), loss_fn, comm, micro_batches=2, steps=1,
                                boundary_shapes=[(5, 16)])
    assert not comm.closed  # nothing above took the communicator
    with fmt.CyclicDataParallel(stages, sgd(0.1), loss_fn, comm, steps=1) as cdp:
        with pytest.raises(RuntimeError, match="0 of 1 steps"):
            cdp.finish()
        cdp.step(*data(0, 0))
        with pytest.raises(RuntimeError, match="all 1 steps"):
            cdp.step(*data(1, 0))
        cdp.finish()
    per_row = lambda y, t: (y - t).square().mean(dim=1)  # noqa: E731 - a loss that is not a scalar
    with fmt.CyclicDataParallel(stages, sgd(0.1), per_row, comm, steps=1) as cdp:
        with pytest.raises(ValueError, match=r"loss_fn: returned shape \(5,\)"):
            cdp.step(*data(0, 0))
        with pytest.raises(RuntimeError, match="failed earlier.*loss_fn"):
            cdp.step(*data(0, 0))


def test_split_sequential_balances_parameters_and_keeps_activations_with_their_layer():
    model = nn.Sequential(nn.Tanh(), nn.Linear(4, 100), nn.ReLU(), nn.Linear(100, 4), nn.Linear(4, 4), nn.Tanh())
    parts = fmt.split_sequential(model, 2)
    assert [len(p) for p in parts] == [3, 3]  # [Tanh, Linear 500, ReLU] [Linear 404, Linear 20, Tanh]
    assert parts[0][1] is model[1]  # the layers themselves, not copies
    assert len(fmt.split_sequential(model, 3)) == 3


def test_stage_parallel_counts_no_parameter_as_an_activation():
    # one stage, one micro-batch: the stage rank saves what a data-parallel rank saves, except that
    # its weights are kept versions (copies); neither counts them
    dp = train_data_parallel(1, 1, 2, "delay1", sgd(0.1), hidden=(64, 64))
    sp = train_stage_parallel(1, 1, 2, "delay1", sgd(0.1), hidden=(64, 64))
    assert sp[0]["peak"] == dp[0]["peak"] > 0
