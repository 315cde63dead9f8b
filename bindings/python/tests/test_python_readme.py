"""The Python snippet of bindings/python/README.md runs as written."""
import pathlib

import numpy as np
from python_support import run_readme_block

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


# The contrastive-loss snippet is the one block with none of these: the reversible one is
# test_python_reversible.py's, the cyclic one test_python_cyclic.py's; the communicator sketch needs
# ranks (its runnable version is examples/python/ring_clip_numpy.py, run by
# scripts/check-launchers.sh); the flatmem.torch one is test_torch_readme.py's.
NOT_CONTRASTIVE = ("ReversibleSegment", "CyclicSchedule", "Communicator", "flatmem.torch")


def test_readme_python_snippet_runs(capsys):
    namespace = run_readme_block(README, excluding=NOT_CONTRASTIVE)
    printed = capsys.readouterr().out
    assert printed.startswith("loss ")
    assert "FLATMEM_STATUS_INVALID_ARGUMENT: q: dtype float64" in printed
    # What the snippet computed is what it says it computed.
    assert namespace["dq"].shape == (256, 64) and np.isfinite(namespace["ds"]).all()
    compact = namespace["flatmem"].contrastive_loss(namespace["q"], namespace["k"], 10.0)[0]
    assert abs(float(namespace["loss_view"]) - float(compact)) <= 1e-6 * abs(float(compact))
