"""Where flatmem_jax comes from.

scripts/check-jax.sh pip-installs the package (libflatmem_jax.so inside it) and
runs these tests against the INSTALLED flatmem_jax, with no path settings.
Only when no flatmem_jax is installed (pytest straight from a checkout) does
this fall back to the source tree: bindings/jax/python on sys.path, and
build/jax/libflatmem_jax.so as the handler library unless FLATMEM_JAX_LIBRARY
names one.

The float64 reference and its error bounds are the Python binding's
(bindings/python/tests/python_reference.py, NumPy only): its folder goes on
sys.path so that jax_checks.py imports it."""
import importlib.util
import os
import pathlib
import sys

_JAX_DIR = pathlib.Path(__file__).resolve().parents[1]
_REPO = _JAX_DIR.parents[1]

sys.path.insert(0, str(_REPO / "bindings" / "python" / "tests"))

if importlib.util.find_spec("flatmem_jax") is None:
    sys.path.insert(0, str(_JAX_DIR / "python"))
    if not os.environ.get("FLATMEM_JAX_LIBRARY"):
        _built = _REPO / "build" / "jax" / "libflatmem_jax.so"
        if _built.exists():
            os.environ["FLATMEM_JAX_LIBRARY"] = str(_built)
