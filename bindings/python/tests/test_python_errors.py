"""Refused inputs: every failing status is a Python exception carrying the C
library's message (flatmem_last_error()), and the version check at import."""
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from python_support import features, raises_flatmem

import flatmem
from flatmem import capi

INVALID = capi.STATUS_INVALID_ARGUMENT


@pytest.fixture
def qk():
    rng = np.random.default_rng(0)
    return features(rng, 4, 8, np.float32), features(rng, 4, 8, np.float32)


def test_float64_features(qk):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "q: dtype float64",
                        "expected float32 or bfloat16 or float16") as info:
        flatmem.contrastive_loss(q.astype(np.float64), k, 10.0)
    assert isinstance(info.value, ValueError)  # the Pythonic base class as well


def test_mixed_dtypes(qk):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "k: dtype float16 differs from q's float32"):
        flatmem.contrastive_loss(q, k.astype(np.float16), 10.0)


def test_feature_dimension_mismatch(qk):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "k: feature dimension d = 6", "q's d = 8"):
        flatmem.contrastive_loss(q, k[:, :6], 10.0)


@pytest.mark.parametrize("bad", [99, -1])
def test_labels_out_of_range(qk, bad):
    q, k = qk
    labels = np.array([0, 1, bad, 2], dtype=np.int64)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, f"labels[2] = {bad} is outside [0, c = 4)"):
        flatmem.contrastive_loss(q, k, 10.0, labels=labels, symmetric=False)


def test_labels_refused_for_symmetric_and_checked_for_dtype_and_shape(qk):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "labels: must be NULL for the symmetric loss"):
        flatmem.contrastive_loss(q, k, 10.0, labels=np.arange(4))
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "labels: dtype int32", "int64"):
        flatmem.contrastive_loss(q, k, 10.0, labels=np.arange(4, dtype=np.int32), symmetric=False)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "labels: shape (3,); expected (4,)"):
        flatmem.contrastive_loss(q, k, 10.0, labels=np.arange(3), symmetric=False)


def test_shapes(qk):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "symmetric loss pairs row i", "c = b = 4"):
        flatmem.contrastive_loss(q, np.vstack([k, k]), 10.0)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "k: 3 rows is fewer than q's b = 4"):
        flatmem.contrastive_loss(q, k[:3], 10.0, symmetric=False)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "q: ndim is 1 with shape (8,); expected 2"):
        flatmem.contrastive_loss(q[0], k, 10.0)


def test_columns_must_be_contiguous(qk):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "q: inner stride is 2 elements; expected 1"):
        flatmem.contrastive_loss(np.hstack([q, q])[:, ::2], k, 10.0)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "k: inner stride is 4 elements"):
        flatmem.contrastive_loss(q, np.asfortranarray(k), 10.0)


@pytest.mark.parametrize("where,value,text", [
    ("q", np.nan, "q: element (2, 5) is nan"),
    ("k", np.inf, "k: element (2, 5) is inf"),
    ("k", -np.inf, "k: element (2, 5) is -inf"),
], ids=["q-nan", "k-inf", "k-minus-inf"])
def test_non_finite_features(qk, where, value, text):
    q, k = (a.copy() for a in qk)
    (q if where == "q" else k)[2, 5] = value
    with raises_flatmem(flatmem.NonFiniteError, capi.STATUS_NON_FINITE, text, "FLATMEM_NONFINITE_ERROR") as info:
        flatmem.contrastive_loss(q, k, 10.0)
    assert str(info.value).startswith("FLATMEM_STATUS_NON_FINITE: ")


@pytest.mark.parametrize("scale,text", [
    (0.0, "logit_scale: 0; expected a finite value > 0"),
    (-3.0, "logit_scale: -3; expected a finite value > 0"),
    (float("nan"), "logit_scale: nan"),
    (np.ones(2), "logit_scale: shape (2,); expected one element"),
], ids=["zero", "negative", "nan", "two-elements"])
def test_bad_logit_scale(qk, scale, text):
    q, k = qk
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, text):
        flatmem.contrastive_loss(q, k, scale)


def test_bad_dloss(qk):
    q, k = qk
    _, backward = flatmem.contrastive_loss(q, k, 10.0)
    with raises_flatmem(flatmem.NonFiniteError, capi.STATUS_NON_FINITE, "dloss: inf"):
        backward(dloss=np.inf)


@pytest.mark.parametrize("options,text", [
    (dict(loss=7), "options.loss: 7 is not a flatmem_contrastive_loss"),
    (dict(tile_rows=5000), "options.tile_rows: 5000; expected 0 (default 512) to 4096"),
    (dict(tile_cols=-2), "options.tile_cols: -2"),
    (dict(num_threads=-1), "options.num_threads: -1; expected 0 (all processors) to 256"),
    (dict(nonfinite=9), "options.nonfinite: 9 is not a flatmem_nonfinite_policy"),
], ids=["loss", "tile_rows", "tile_cols", "num_threads", "nonfinite"])
def test_bad_options_at_create(options, text):
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, text):
        flatmem.Contrastive(**options)


def test_option_names_checked_in_python():
    with pytest.raises(ValueError, match="'bogus' is not one of"):
        flatmem.Contrastive(loss="bogus")


def test_workspace_too_small_and_bad_gradient_dtype(qk):
    q, k = qk
    h = flatmem.Contrastive()
    needed = h.forward_workspace_size(q, k)
    with raises_flatmem(flatmem.WorkspaceTooSmallError, capi.STATUS_WORKSPACE_TOO_SMALL,
                        f"workspace: {needed - 1} bytes given; {needed} bytes needed"):
        h.forward(q, k, 10.0, workspace=np.empty(needed - 1, np.uint8))
    saved = h.forward(q, k, 10.0)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "dq: dtype float64"):
        h.backward(q, k, 10.0, saved.row_lse, saved.col_lse, grad_dtype=np.float64)
    with raises_flatmem(flatmem.InvalidArgumentError, INVALID, "col_lse"):
        h.backward(q, k, 10.0, saved.row_lse, None)


def test_cuda_tensor_is_unsupported(qk):
    """A kDLCUDA tensor reaches the library (through the capi layer) and gets
    FLATMEM_STATUS_UNSUPPORTED: this release has no CUDA backend."""
    q, k = qk
    t_q = capi.Tensor(q.__array_interface__["data"][0], 2, capi.kDLFloat, 32)
    t_q.set_shape(0, 4)
    t_q.set_shape(1, 8)
    t_q.set_device(capi.kDLCUDA, 0)
    t_k = capi.Tensor(k.__array_interface__["data"][0], 2, capi.kDLFloat, 32)
    t_k.set_shape(0, 4)
    t_k.set_shape(1, 8)
    h = capi.Contrastive()
    with raises_flatmem(flatmem.UnsupportedError, capi.STATUS_UNSUPPORTED, "q: device is kDLCUDA"):
        h.forward_workspace_size(t_q, t_k)


def test_binding_level_errors():
    """Errors found by the binding itself use the same classes (no C message)."""
    t = capi.Tensor(0, 2, capi.kDLFloat, 32)
    with pytest.raises(flatmem.InvalidArgumentError, match="dimension 2 is out of range for ndim 2"):
        t.set_shape(2, 1)
    with pytest.raises(flatmem.InvalidArgumentError, match="ndim 9 is out of range"):
        capi.Tensor(0, 9, capi.kDLFloat, 32)
    with pytest.raises(flatmem.InvalidArgumentError, match='unconsumed PyCapsule named "dltensor"'):
        capi.tensor_from_dlpack(object())
    with pytest.raises(TypeError, match="q: NumPy dtype bool has no DLPack equivalent"):
        flatmem.contrastive_loss(np.ones((2, 2), bool), np.ones((2, 2), np.float32), 1.0)
    h = flatmem.Contrastive()
    with pytest.raises(ValueError, match="read-only"):
        q = np.ones((2, 2), np.float32)
        saved = h.forward(q, q, 1.0)
        out = np.zeros((2, 2), np.float32)
        out.flags.writeable = False
        h.backward(q, q, 1.0, saved.row_lse, saved.col_lse, dq=out)


def test_versions_agree():
    assert capi.VERSION == capi.version() == (
        capi.VERSION_MAJOR * 10000 + capi.VERSION_MINOR * 100 + capi.VERSION_PATCH)
    assert capi.version_mismatch() == ""
    assert flatmem.library_version() == f"{capi.VERSION_MAJOR}.{capi.VERSION_MINOR}.{capi.VERSION_PATCH}"
    assert flatmem.__version__ == flatmem.library_version()


def test_import_refuses_a_library_of_another_version(tmp_path):
    """Interpose a flatmem_version() that reports 9.9.9 (LD_PRELOAD): importing
    flatmem must fail with an ImportError that says what to do."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake library")
    source = tmp_path / "fake_version.c"
    source.write_text(textwrap.dedent("""
        int flatmem_version(void) { return 90909; }
        const char *flatmem_version_string(void) { return "9.9.9"; }
    """))
    fake = tmp_path / "libfake_flatmem_version.so"
    subprocess.run([cc, "-shared", "-fPIC", str(source), "-o", str(fake)], check=True)
    env = dict(os.environ, LD_PRELOAD=str(fake))
    done = subprocess.run([sys.executable, "-c", "import flatmem"], env=env, capture_output=True, text=True)
    assert done.returncode != 0
    header = f"{capi.VERSION_MAJOR}.{capi.VERSION_MINOR}.{capi.VERSION_PATCH}"
    assert (f"ImportError: flatmem: this binding was built with flatmem.h {header} "
            f"(FLATMEM_VERSION {capi.VERSION})") in done.stderr
    assert "the loaded libflatmem is 9.9.9 (flatmem_version() = 90909)" in done.stderr
    assert "rebuild the binding against the installed library" in done.stderr


@pytest.mark.parametrize("name, status, builtin", [
    ("InvalidArgumentError", "INVALID_ARGUMENT", ValueError),
    ("UnsupportedError", "UNSUPPORTED", NotImplementedError),
    ("OutOfMemoryError", "OUT_OF_MEMORY", MemoryError),
    ("WorkspaceTooSmallError", "WORKSPACE_TOO_SMALL", ValueError),
    ("NonFiniteError", "NON_FINITE", FloatingPointError),
    ("InternalError", "INTERNAL", None),
    ("CommTimeoutError", "TIMEOUT", TimeoutError),
    ("PeerFailureError", "PEER_FAILURE", ConnectionError),
    ("CommPoisonedError", "COMM_POISONED", ConnectionError),
])
def test_every_status_has_its_exception_class(name, status, builtin):
    """Each failing status of the header has a flatmem.Error subclass (also the
    closest built-in exception), exported by flatmem and flatmem.capi."""
    cls = getattr(flatmem, name)
    assert cls is getattr(capi, name) and name in flatmem.__all__
    assert issubclass(cls, flatmem.Error) and issubclass(cls, RuntimeError)
    if builtin is not None:
        assert issubclass(cls, builtin)
    code = getattr(capi, "STATUS_" + status)
    assert capi.status_string(code) == "FLATMEM_STATUS_" + status
    assert cls.__module__ == "flatmem" and cls.__name__ == name


def test_statuses_are_those_of_the_header():
    assert (capi.STATUS_TIMEOUT, capi.STATUS_PEER_FAILURE, capi.STATUS_COMM_POISONED) == (7, 8, 9)
    assert capi.status_string(capi.STATUS_COMM_POISONED + 1) == "FLATMEM_STATUS_UNKNOWN"
    # the communicator is not an options field: Contrastive(options, comm) takes it
    assert not hasattr(capi.ContrastiveOptions(), "comm")
