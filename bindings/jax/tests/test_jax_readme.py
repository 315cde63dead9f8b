"""The README's Python snippets run as written: the test executes the
```python blocks of bindings/jax/README.md (the ring's as two processes), so
the two cannot drift apart.
The snippet uses `import flatmem.jax`: skipped only when the SWIG package
flatmem (bindings/python) is not installed (scripts/check-jax.sh installs it)."""
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import pytest

from jax_checks import fp32, widened
from python_reference import contrastive_reference, forward_tolerance
from python_support import readme_python_blocks, run_readme_block
from ring_launch import assert_all_succeeded, launch

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
# The contrastive-loss snippet is the one block with neither: the reversible one is
# test_jax_reversible.py's, the ring's (comm=) runs as several processes below.
NOT_CONTRASTIVE = ("reversible_transformer", "comm=")


def ring_block():
    (block,) = readme_python_blocks(README, "comm=")
    return block


def test_readme_has_a_python_snippet():
    assert len(readme_python_blocks(README, excluding=NOT_CONTRASTIVE)) == 1


def test_readme_snippet_runs(capsys):
    pytest.importorskip("flatmem", reason="the SWIG package flatmem (bindings/python) is not installed")
    namespace = run_readme_block(README, excluding=NOT_CONTRASTIVE)
    out = capsys.readouterr().out
    assert re.search(r"^CLIP loss \d+\.\d{4}, \|dq\| \S+, d/dlog_s -?\d+\.\d{4}$", out, re.M), out
    assert re.search(r"^InfoNCE \d+\.\d+$", out, re.M), out
    assert re.search(r"^per-element CLIP losses \[\S+ +\S+\]$", out, re.M), out
    # The snippet's numbers are the CLIP loss of its features (float64 reference).
    from jax_checks import check_loss, check_sigmoid
    check_loss(namespace["loss"], namespace["q"], namespace["k"], 14.3)
    assert re.search(r"^SigLIP loss \d+\.\d{4}, d/dlog_s -?\d+\.\d{4}, d/dbias -?\d+\.\d{4}$", out, re.M), out
    s = jnp.exp(jnp.log(jnp.float32(10.0)))  # the scale the snippet's loss saw
    check_sigmoid(namespace["siglip"], (), namespace["q"], namespace["k"], s, -10.0)
    check_sigmoid(None, (None, None, None, namespace["dbias"]), namespace["q"], namespace["k"], s, -10.0)



def test_readme_ring_snippet_runs_as_two_ranks():
    # Each rank runs the block as written; its loss is the CLIP loss of both
    # shards concatenated (rank order), checked against the float64 reference.
    ranks = launch(2, [], deadline_s=90, command=[sys.executable, "-c", ring_block()])
    assert_all_succeeded(ranks)
    pattern = r"^rank (\d): CLIP loss (\d+\.\d{4}) of 16 pairs, d/dlog_s (-?\d+\.\d{4})$"
    found = [re.search(pattern, r.stdout, re.M) for r in ranks]
    assert all(found), [r.stdout for r in ranks]
    assert [m.group(1) for m in found] == ["0", "1"]
    assert found[0].group(2, 3) == found[1].group(2, 3), "the loss and d/dlog_s differ between ranks"

    def unit(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    shards = []
    for rank in range(2):  # the snippet's shards, made here the same way
        kq, kk = jax.random.split(jax.random.key(rank))
        q = unit(jax.random.normal(kq, (8, 64)))
        shards.append((q, unit(q + 0.5 * jax.random.normal(kk, (8, 64)))))
    q, k = (widened(jnp.concatenate(x)) for x in zip(*shards))
    s = fp32(jnp.exp(jnp.log(jnp.float32(14.3))))  # the scale the snippet passes
    want = contrastive_reference(q, k, s)[0]
    # flatmem's bound, plus half a unit of the 4th decimal the snippet prints.
    tol = forward_tolerance(q, k, s, want) + 0.5e-4
    assert abs(float(found[0].group(2)) - want) <= tol, (found[0].group(2), want, tol)
