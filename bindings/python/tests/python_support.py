"""Helpers shared by the flatmem Python tests (named to stay unique if several
binding test folders run in one pytest session)."""
import contextlib

import ml_dtypes
import numpy as np
import pytest

import flatmem

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FEATURE_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": BFLOAT16, "float16": np.dtype(np.float16)}


def features(rng, rows, d, dtype, scale=1.0):
    """Unit-norm random rows (as CLIP features are) times `scale`, rounded to
    dtype; the reference then uses exactly these (rounded) values."""
    x = rng.standard_normal((rows, d))
    x *= scale / np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(dtype)


@contextlib.contextmanager
def raises_flatmem(error_class, status, *fragments):
    """Expects a flatmem error of this class and status whose message is
    "<status name>: <flatmem_last_error()>" and contains every fragment of the
    C library's text."""
    with pytest.raises(error_class) as info:
        yield info
    e = info.value
    assert isinstance(e, flatmem.Error)
    assert e.status == status
    assert e.status_name == flatmem.capi.status_string(status)
    # The C message itself: what flatmem_last_error() says now, after the call.
    assert e.detail == flatmem.capi.last_error() != ""
    assert str(e) == f"{e.status_name}: {e.detail}"
    for fragment in fragments:
        assert fragment in e.detail, (fragment, str(e))
