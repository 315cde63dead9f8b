"""Helpers shared by the flatmem Python tests (named to stay unique if several
binding test folders run in one pytest session). The JAX binding's tests import
it too (bindings/jax/tests/conftest.py puts this folder on sys.path), where the
SWIG package flatmem may be absent: only raises_flatmem() imports it."""
import contextlib
import gc
import pathlib
import re
import threading

import ml_dtypes
import numpy as np
import pytest

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
    import flatmem

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


_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_python_blocks(readme, containing=None, excluding=()):
    """The ```python blocks of the file `readme`, in order: those that contain
    the text `containing` (when given) and none of the texts in `excluding`."""
    blocks = _PYTHON_BLOCK.findall(pathlib.Path(readme).read_text())
    return [b for b in blocks
            if (containing is None or containing in b) and not any(x in b for x in excluding)]


def run_readme_block(readme, containing=None, excluding=()):
    """Runs, as written, the one ```python block of `readme` that
    readme_python_blocks() selects (asserting that exactly one does), as a
    module named "readme"; returns its namespace (the snippet's variables)."""
    blocks = readme_python_blocks(readme, containing, excluding)
    assert len(blocks) == 1, (f"expected one ```python block in {readme} containing {containing!r}"
                              f" and none of {list(excluding)}; found {len(blocks)}")
    namespace = {"__name__": "readme"}
    exec(compile(blocks[0], str(readme), "exec"), namespace)
    return namespace


def run_concurrently(work, threads):
    """Runs work(0) .. work(threads - 1) at once, each on its own thread, and
    waits for all; re-raises the first failed thread's exception (with its
    traceback), else returns the results in thread order."""
    results, errors = [None] * threads, [None] * threads

    def run(i):
        try:
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[i] = e

    started = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in started:
        t.start()
    for t in started:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results


def main_thread_steps_during(call):
    """Runs call() on a worker thread while the main thread counts loop steps
    in Python; returns how many steps the main thread made while the worker
    was inside the call (no clocks involved)."""
    steps = [0]
    started = threading.Event()
    inside = {}

    def work():
        started.wait()
        inside["before"] = steps[0]
        call()
        inside["after"] = steps[0]

    worker = threading.Thread(target=work)
    worker.start()
    started.set()
    while worker.is_alive():
        steps[0] += 1
    worker.join()
    return inside["after"] - inside["before"]


def assert_main_thread_runs_during(call, attempts=3):
    """call() releases the GIL: while a worker thread is inside it, the main
    thread keeps running Python bytecode. Were the GIL held for the call, the
    main thread could only step between the worker's own bytecodes: a few
    steps at most, not the hundreds of thousands a released GIL allows. No
    clock is read; up to `attempts` tries absorb the OS not scheduling the
    main thread at all."""
    made = []
    for _ in range(attempts):
        made.append(main_thread_steps_during(call))
        if made[-1] > 10_000:
            return
    raise AssertionError(f"the main thread made almost no progress during the calls: {made}")
