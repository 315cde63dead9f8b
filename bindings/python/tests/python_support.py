"""Helpers shared by the flatmem Python tests (named to stay unique if several
binding test folders run in one pytest session)."""
import contextlib
import gc
import threading

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


_collector_users = 0
_collector_lock = threading.Lock()
_collector_was_enabled = True


@contextlib.contextmanager
def _collector_off():
    """The garbage collector off while any thread is inside (nested and
    concurrent uses count)."""
    global _collector_users, _collector_was_enabled
    with _collector_lock:
        if _collector_users == 0:
            _collector_was_enabled = gc.isenabled()
            gc.disable()
        _collector_users += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_users -= 1
            if _collector_users == 0 and _collector_was_enabled:
                gc.enable()


@contextlib.contextmanager
def raises_flatmem(error_class, status, *fragments):
    """Expects a flatmem error of this class and status whose message is
    "<status name>: <flatmem_last_error()>" and contains every fragment of the
    C library's text. The garbage collector is off meanwhile: a collection
    between the failed call and the flatmem_last_error() read below could run
    a finalizer whose flatmem call (an earlier test's communicator being
    destroyed) succeeds and so clears this thread's last error."""
    with _collector_off():
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
