"""The ZeRO relay mode of flatmem.Cyclic (parameters="relayed"): an MLP
(python_stage_mlp.py) trained with each of N ranks holding shard r of every
stage equals the replicated "delay1" training bit for bit on every rank's
shard ranges, over threads of an in-process group (N = 2, 3; float32 and
float64; a stage smaller than N, which leaves a rank an empty shard) and two
UCX processes; the relay summary's shard, replica and staging bytes; calls
the relay refuses. Every thread and process has a deadline."""
import numpy as np
import pytest
from python_ranks import run
from python_stage_mlp import StageMlp, train_data_parallel, train_relayed
from python_support import raises_flatmem
from test_python_comm import local_group, run_threads  # noqa: F401 (fixture)

import flatmem
from flatmem import capi

LR, STEPS = 0.25, 3


def check_rank(result, mlp, rank, world):
    """Rank `rank`'s relayed shards against its ranges of the replicated parameters."""
    replicated, relayed = result["replicated"], result["relayed"]
    for j in range(mlp.stages):
        c = -(-mlp.count(j) // world)  # ceil(n_j / N)
        want = replicated[j][min(rank * c, mlp.count(j)):min((rank + 1) * c, mlp.count(j))]
        got = relayed["shards"][j]
        assert got.dtype == want.dtype and got.shape == want.shape, (rank, j)
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (
            f"rank {rank} stage {j}: relayed {got} vs replicated {want}")
    summary, item = relayed["summary"], mlp.dtype.itemsize
    assert summary.shard_bytes == sum(s.size for s in relayed["shards"]) * item
    assert summary.replicated_bytes == sum(mlp.count(j) for j in range(mlp.stages)) * item
    assert summary.staging_bytes == summary.staging_buffers * max(mlp.count(j) for j in range(mlp.stages)) * item
    assert max(s.parameter_bytes_scheduled for s in relayed["stats"]) == summary.peak_parameter_bytes_scheduled
    assert sum(s.relay_bytes_sent for s in relayed["stats"]) == summary.relay_bytes_sent


def both(comm, mlp):
    return {"replicated": train_data_parallel(comm, mlp, STEPS, "delay1", LR),
            "relayed": train_relayed(comm, mlp, STEPS, LR)}


@pytest.mark.parametrize("widths, rows, dtype, world", [([3, 5, 4, 2], 3, "float64", 3),
                                                         ([4, 3, 2], 2, "float32", 2),
                                                         ([3, 1, 1], 2, "float32", 3)])
def test_local_group_relayed_equals_replicated(local_group, widths, rows, dtype, world):
    mlp = StageMlp(widths, rows, seed=7, dtype=dtype)
    results = run_threads(local_group(world), lambda c, _: both(c, mlp))
    for rank, result in enumerate(results):
        check_rank(result, mlp, rank, world)


def test_processes_relayed_equals_replicated(tmp_path):
    params = {"widths": [4, 3, 2], "rows": 2, "seed": 7, "dtype": "float64", "steps": STEPS, "lr": LR}
    mlp = StageMlp(params["widths"], params["rows"], params["seed"], params["dtype"])
    for rank, result in enumerate(run(tmp_path, "relayed", 2, params)):
        check_rank(result, mlp, rank, 2)


def test_the_comparison_can_fail():
    """A shard updated with the wrong range of the average differs."""
    mlp = StageMlp([4, 3, 2], 2, seed=7, dtype="float64")
    w, g = mlp.initial(0), np.arange(mlp.count(0), dtype=np.float64)
    assert not np.array_equal(w[4:8] - 0.25 * g[4:8], w[4:8] - 0.25 * g[0:4])


def test_relay_refusals_name_what_is_wrong(local_group):
    comms = local_group(2, timeout_ms=5000)

    def job(comm, _):
        with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT):
            flatmem.Cyclic(comm, stages=1, steps=1, rule="sync", parameters="relayed", parameter_count=[4])
        with pytest.raises(ValueError, match=r"parameter_count: shape \(1,\); expected \(2,\)"):
            flatmem.Cyclic(comm, stages=2, steps=1, parameters="relayed", parameter_count=[4])
        with pytest.raises(ValueError, match="parameters: 'sharded' is not one of"):
            flatmem.Cyclic(comm, stages=1, steps=1, parameters="sharded")
        with flatmem.Cyclic(comm, stages=1, steps=1) as replicated:
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT):
                replicated.set_shard(0, np.zeros(2))
            assert replicated.shard(0) is None
        with flatmem.Cyclic(comm, stages=1, steps=1, parameters="relayed", parameter_count=[5]) as cyc:
            rng = cyc.shard_range(0)
            assert (rng.start, rng.stop) == ((0, 3) if comm.rank == 0 else (3, 5))
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT,
                                str(rng.stop - rng.start), str(rng.stop - rng.start + 1)):
                cyc.set_shard(0, np.zeros(rng.stop - rng.start + 1))
            with pytest.raises(ValueError, match="shard: expected a writable C-contiguous"):
                cyc.set_shard(0, np.zeros(4)[::2])
            with raises_flatmem(flatmem.InvalidArgumentError, capi.STATUS_INVALID_ARGUMENT):
                cyc.parameters(np.zeros(5))  # not during a forward / backward
            cyc.set_shard(0, np.zeros(rng.stop - rng.start))
            assert cyc.shard(0) is not None

    run_threads(comms, job)
