"""flatmem.jax: the SWIG package's name for flatmem_jax's functions. Skipped
only when the SWIG package flatmem (bindings/python) is not installed;
scripts/check-jax.sh installs it, so these run there."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("flatmem", reason="the SWIG package flatmem (bindings/python) is not installed")
import flatmem.jax  # noqa: E402  (flatmem is installed: a failure here is a test failure)

import flatmem_jax  # noqa: E402
from jax_checks import check_grads, check_loss, check_scale_grad, unit_rows  # noqa: E402


def test_reexports_flatmem_jax():
    assert flatmem.jax.clip_loss is flatmem_jax.clip_loss
    assert flatmem.jax.infonce_loss is flatmem_jax.infonce_loss
    assert flatmem.jax.sigmoid_loss is flatmem_jax.sigmoid_loss
    assert flatmem.jax.FlatmemError is flatmem_jax.FlatmemError
    assert flatmem.jax.has_cuda is flatmem_jax.has_cuda
    assert flatmem.jax.reversible_transformer is flatmem_jax.reversible_transformer
    assert flatmem.jax.RingComm is flatmem_jax.RingComm
    assert flatmem.jax.ring is flatmem_jax.ring
    assert sorted(flatmem.jax.__all__) == ["FlatmemError", "RingComm", "clip_loss", "has_cuda",
                                           "infonce_loss", "reversible_transformer", "ring",
                                           "sigmoid_loss"]


def test_clip_loss_under_jit_and_grad_matches_flatmem_jax():
    b, d, s = 97, 24, 14.3
    q, k = unit_rows(11, b, d), unit_rows(12, b, d)

    def via(f):
        return jax.jit(jax.value_and_grad(lambda q, k, log_s: f(q, k, jnp.exp(log_s)),
                                          argnums=(0, 1, 2)))

    log_s = jnp.log(jnp.float32(s))
    loss, grads = via(flatmem.jax.clip_loss)(q, k, log_s)
    want_loss, want_grads = via(flatmem_jax.clip_loss)(q, k, log_s)
    assert loss == want_loss
    for got, want in zip(grads, want_grads):
        np.testing.assert_array_equal(got, want)
    # and both are the CLIP loss (the float64 reference)
    s = jnp.exp(log_s)  # the scale flatmem saw
    check_loss(loss, q, k, s)
    check_grads(grads[:2], q, k, s)
    check_scale_grad(grads[2], q, k, s, factor=float(s))  # d/dlog_s = s d/ds


def test_infonce_loss_under_jit_and_grad_matches_flatmem_jax():
    q, k = unit_rows(13, 9, 8, jnp.bfloat16), unit_rows(14, 20, 8, jnp.bfloat16)
    labels = jnp.asarray(np.random.default_rng(15).integers(0, 20, 9))
    args = (q, k, jnp.float32(7.0), labels)
    got = jax.jit(jax.value_and_grad(flatmem.jax.infonce_loss, argnums=(0, 1, 2)))(*args)
    want = jax.jit(jax.value_and_grad(flatmem_jax.infonce_loss, argnums=(0, 1, 2)))(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(g, w)


def test_refusal_is_flatmem_jax_error():
    with pytest.raises(flatmem.jax.FlatmemError, match="FLATMEM_STATUS_INVALID_ARGUMENT"):
        flatmem.jax.clip_loss(unit_rows(1, 4, 3), unit_rows(2, 5, 3), 1.0)  # c != b


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")


def test_import_flatmem_does_not_import_jax():
    run = run_python("import sys, flatmem; print(sorted(m for m in sys.modules "
                     "if m.split('.')[0] in ('jax', 'jaxlib', 'flatmem_jax')))")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_missing_flatmem_jax_says_how_to_install_it():
    run = run_python("import sys; sys.modules['flatmem_jax'] = None; import flatmem.jax")
    assert run.returncode != 0
    assert ("ImportError: flatmem.jax needs jax and the flatmem_jax package (flatmem's JAX plugin), "
            "but 'flatmem_jax' is not installed") in run.stderr, run.stderr
    assert "pip install 'jax>=0.7'" in run.stderr, run.stderr
    assert "pip install . gets jaxlib for its build by itself" in run.stderr, run.stderr
