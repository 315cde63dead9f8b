"""Makes flatmem_jax importable when pytest runs straight from the checkout:
bindings/jax/python on sys.path, and build/jax/libflatmem_jax.so as the
handler library unless FLATMEM_JAX_LIBRARY names one (scripts/check-jax.sh
sets both explicitly)."""
import os
import pathlib
import sys

_JAX_DIR = pathlib.Path(__file__).resolve().parents[1]
_REPO = _JAX_DIR.parents[1]

sys.path.insert(0, str(_JAX_DIR / "python"))
if not os.environ.get("FLATMEM_JAX_LIBRARY"):
    _built = _REPO / "build" / "jax" / "libflatmem_jax.so"
    if _built.exists():
        os.environ["FLATMEM_JAX_LIBRARY"] = str(_built)
