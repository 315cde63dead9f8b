"""The ring losses across processes: 1, 2 and 4 ranks over UCX on loopback,
each a Python process running ring_worker.py under one hard deadline
(ring_launch.py). The values and gradients of every rank's shard are checked
inside the ranks against the float64 loss of the concatenated batch, within
jax_checks.py's bounds; here, that every rank passed every check, that the
loss and ds are the same bits on every rank, and that one rank's error fails
every rank with flatmem's message within the communicator's timeout."""
import pytest

from ring_launch import assert_all_succeeded, free_port, launch

# JAX's start-up (~2-4 s a process, 4 processes on 2 cores) plus the jit
# compilations of the batch; a hang would be killed here.
DEADLINE_S = 150


def checked(rank):
    return {words[0]: tuple(words[1:]) for words in rank.lines("CHECKED")}


def failures(rank):
    """name -> (elapsed seconds, message) of each expected failure."""
    return {words[0]: (float(words[1]), " ".join(words[2:])) for words in rank.lines("FAILED")}


@pytest.mark.parametrize("world_size,how", [(2, "--explicit"), (4, "--env")])
def test_ring_values_and_gradients_match_the_concatenated_batch(world_size, how):
    ranks = launch(world_size, ["values", how], deadline_s=DEADLINE_S)
    assert_all_succeeded(ranks)
    results = [checked(r) for r in ranks]
    # 7 cases x (fp32, bf16), each value_and_grad under jit against the reference.
    assert len(results[0]) == 14, ranks[0].describe()
    for r, result in enumerate(results[1:], 1):
        assert result == results[0], f"rank {r}'s (loss, ds) bits differ from rank 0's:\n{result}\n{results[0]}"
    assert all(r.lines("DONE") for r in ranks)


@pytest.mark.parametrize("world_size", [2, 4])
def test_sigmoid_ring_matches_the_concatenated_batch(world_size):
    ranks = launch(world_size, ["sigmoid"], deadline_s=DEADLINE_S)
    assert_all_succeeded(ranks)
    results = [checked(r) for r in ranks]
    # 5 cases x (fp32, bf16), each value_and_grad of (q, k, s, t) under jit against the reference.
    assert len(results[0]) == 10, ranks[0].describe()
    for r, result in enumerate(results[1:], 1):
        assert result == results[0], f"rank {r}'s (loss, ds, dt) bits differ from rank 0's:\n{result}\n{results[0]}"
    for rank in ranks:
        elapsed, message = failures(rank)["bias"]
        assert "logit_bias" in message, message
    assert all(r.lines("DONE") for r in ranks)


def test_rank_and_size_from_jax_distributed():
    ranks = launch(2, ["jax-distributed", f"127.0.0.1:{free_port()}"], deadline_s=DEADLINE_S)
    assert_all_succeeded(ranks)
    results = [checked(r) for r in ranks]
    assert list(results[0]) == ["clip-uneven-float32"] and results[0] == results[1], results
    assert all(r.lines("DONE") for r in ranks)


def test_ring_of_one_rank_is_the_single_process_loss_and_bad_input_raises():
    ranks = launch(1, ["single"], deadline_s=DEADLINE_S)
    assert_all_succeeded(ranks)
    assert ranks[0].lines("DONE"), ranks[0].describe()


def test_a_refused_argument_on_one_rank_fails_every_rank():
    ranks = launch(2, ["mismatch"], deadline_s=DEADLINE_S)
    assert_all_succeeded(ranks)
    for rank in ranks:
        seen = failures(rank)
        assert set(seen) == {"scale", "labels", "d", "precision"}, rank.describe()
        assert "feature dimension d: rank 0 has 5, rank 1 has 4" in seen["d"][1], seen["d"]
        assert "options.fp32_precision: rank 0 has TF32, rank 1 has FULL" in seen["precision"][1], \
            seen["precision"]
        message = seen["scale"][1]
        assert "FLATMEM_STATUS_INVALID_ARGUMENT" in message and "logit_scale" in message, message
        assert "rank 0 has 10" in message and "rank 1 has 20" in message, message
    # The last rank names its label; the other names that rank.
    assert "labels" in failures(ranks[1])["labels"][1], ranks[1].describe()
    assert "rank 1" in failures(ranks[0])["labels"][1], ranks[0].describe()


def test_a_killed_rank_fails_the_others_within_the_timeout():
    ranks = launch(3, ["killed"], deadline_s=DEADLINE_S)
    assert ranks[2].returncode < 0, ranks[2].describe()  # SIGKILL
    assert_all_succeeded(ranks[:2])
    for rank in ranks[:2]:
        seen = failures(rank)
        elapsed, message = seen["killed-peer"]
        # timeout_ms = 5000: the error comes at the latest at the deadline (+ scheduling).
        assert elapsed < 15, (elapsed, message)
        # PEER_FAILURE / TIMEOUT when the forward itself meets the death; COMM_POISONED when the
        # communicator's progress saw it first (a loaded machine) -- then the reason names the rank.
        assert any(s in message for s in ("FLATMEM_STATUS_PEER_FAILURE", "FLATMEM_STATUS_TIMEOUT")) or (
            "FLATMEM_STATUS_COMM_POISONED" in message and "rank 2" in message), message
        assert "flatmem_contrastive_forward" in message, message
        # Later calls fail at once on the poisoned communicator.
        elapsed, message = seen["after"]
        assert "FLATMEM_STATUS_COMM_POISONED" in message and elapsed < 5, (elapsed, message)
