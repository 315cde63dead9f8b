"""The Python snippet of bindings/python/README.md runs as written."""
import pathlib
import re

import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    """The contrastive-loss snippet(s); the reversible one is test_python_reversible.py's, the cyclic
    one test_python_cyclic.py's; the communicator sketch needs ranks (its runnable version is
    examples/python/ring_clip_numpy.py, run by scripts/check-launchers.sh); the flatmem.torch one is
    test_torch_readme.py's."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    return [b for b in blocks if "ReversibleSegment" not in b and "CyclicSchedule" not in b
            and "Communicator" not in b and "flatmem.torch" not in b]


def test_readme_python_snippet_runs(capsys):
    blocks = python_blocks()
    assert len(blocks) == 1, "expected one contrastive ```python block in README.md"
    namespace = {"__name__": "readme"}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    printed = capsys.readouterr().out
    assert printed.startswith("loss ")
    assert "FLATMEM_STATUS_INVALID_ARGUMENT: q: dtype float64" in printed
    # What the snippet computed is what it says it computed.
    assert namespace["dq"].shape == (256, 64) and np.isfinite(namespace["ds"]).all()
    compact = namespace["flatmem"].contrastive_loss(namespace["q"], namespace["k"], 10.0)[0]
    assert abs(float(namespace["loss_view"]) - float(compact)) <= 1e-6 * abs(float(compact))
