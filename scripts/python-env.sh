#!/usr/bin/env bash
# The Python environment of the bindings' tests: a venv made from Debian's
# /usr/bin/python3 with NumPy, ml_dtypes, pytest, JAX (CPU jaxlib) and the
# build tools of the SWIG extension, from PyPI. Idempotent: a stamp file
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
)
stamp=$FLATMEM_VENV/.flatmem-requirements
if [ -x "$FLATMEM_VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${requirements[*]}" ]; then
  echo "python-env: $FLATMEM_VENV is up to date"
  exit 0
fi
echo "python-env: creating $FLATMEM_VENV"
rm -rf "$FLATMEM_VENV"
"$FLATMEM_PYTHON" -m venv "$FLATMEM_VENV"
"$FLATMEM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$FLATMEM_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
echo "${requirements[*]}" >"$stamp"
"$FLATMEM_VENV/bin/python" -c "import numpy, jax, ml_dtypes; print('python-env: numpy', numpy.__version__, 'jax', jax.__version__)"
