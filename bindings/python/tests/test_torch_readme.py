"""The flatmem.torch snippet of bindings/python/README.md runs as written and computes what it says."""
import pathlib

import torch
from python_support import run_readme_block

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_torch_snippet_runs(capsys):
    namespace = run_readme_block(README, "flatmem.torch")
    printed = capsys.readouterr().out
    assert printed.startswith("clip ") and "ClipLoss {'contrastive_loss': tensor(" in printed
    assert "reversible backward ran" in printed and "built-in blocks: 299904 parameters" in printed
    # the loss printed is the one a plain materialised computation gives
    image, text, s = namespace["image"].detach(), namespace["text"].detach(), namespace["log_scale"].exp().item()
    logits = s * image.double() @ text.double().T
    labels = torch.arange(logits.shape[0])
    plain = 0.5 * (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels))
    assert abs(namespace["loss"].item() - plain.item()) <= 1e-5 * plain.item()
    assert namespace["x1"].grad is not None and all(p.grad is not None for p in namespace["seq"].parameters())
