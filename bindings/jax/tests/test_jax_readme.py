"""The README's Python snippet runs as written: the test executes the
```python blocks of bindings/jax/README.md, so the two cannot drift apart.
The snippet uses `import flatmem.jax`: skipped only when the SWIG package
flatmem (bindings/python) is not installed (scripts/check-jax.sh installs it)."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    """The contrastive-loss snippet; the reversible one is test_jax_reversible.py's."""
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), re.M | re.S)
    return [b for b in blocks if "reversible_transformer" not in b]


def test_readme_has_a_python_snippet():
    assert len(python_blocks()) == 1


def test_readme_snippet_runs(capsys):
    pytest.importorskip("flatmem", reason="the SWIG package flatmem (bindings/python) is not installed")
    namespace = {"__name__": "readme"}
    exec(compile(python_blocks()[0], str(README), "exec"), namespace)
    out = capsys.readouterr().out
    assert re.search(r"^CLIP loss \d+\.\d{4}, \|dq\| \S+, d/dlog_s -?\d+\.\d{4}$", out, re.M), out
    assert re.search(r"^InfoNCE \d+\.\d+$", out, re.M), out
    assert re.search(r"^per-element CLIP losses \[\S+ +\S+\]$", out, re.M), out
    # The snippet's numbers are the CLIP loss of its features (float64 reference).
    from jax_checks import check_loss
    check_loss(namespace["loss"], namespace["q"], namespace["k"], 14.3)
