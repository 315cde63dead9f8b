#!/usr/bin/env bash
# The documentation in docs/, built and checked with every warning an error:
#   1. Doxygen (docs/Doxyfile) over include/flatmem/*.h: the C API reference, HTML and XML;
#   2. Sphinx (MyST Markdown guides, the Python API from the docstrings by autodoc) into OUT/html,
#      with Doxygen's HTML copied in as OUT/html/capi/;
#   3. coverage (scripts/check_docs.py): every flatmem_* function the headers declare is in
#      Doxygen's XML with a description (and is what the library exports), and every public name
#      of flatmem, flatmem.jax (flatmem_jax) and flatmem.torch and their public submodules is in
#      Sphinx's objects.inv.
# PYTHON must import flatmem, flatmem.jax and flatmem.torch (e.g. the venv the wheel is installed
# in; PYTHONPATH / FLATMEM_JAX_LIBRARY of the caller pass through) and have sphinx and myst-parser.
# Usage: bash scripts/check-docs.sh PYTHON [OUT]   (default OUT: build/docs; the site: OUT/html)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

fail() { echo "check-docs: FAIL: $*" >&2; exit 1; }

[ $# -ge 1 ] || fail "usage: bash scripts/check-docs.sh PYTHON [OUT]"
python=$1
out=$(realpath -m "${2:-$FLATMEM_ROOT/build/docs}")
command -v doxygen >/dev/null || fail "no doxygen (bash scripts/install-deps.sh installs it)"
"$python" -c "import sphinx, myst_parser" || fail "$python has no sphinx and myst-parser"
"$python" -c "import flatmem, flatmem.jax, flatmem.torch" ||
  fail "$python cannot import flatmem, flatmem.jax and flatmem.torch (install the wheel into it)"

rm -rf "$out"
mkdir -p "$out/doxygen/html"
cd "$FLATMEM_ROOT"

step "doxygen: the C API reference ($out/doxygen)"
# WARN_AS_ERROR=FAIL_ON_WARNINGS: doxygen prints every warning, then exits non-zero.
(cd docs && FLATMEM_DOXYGEN_OUT="$out/doxygen" doxygen Doxyfile) || fail "doxygen warned (above)"

step "sphinx: $out/html"
FLATMEM_DOXYGEN_HTML="$out/doxygen/html" "$python" -m sphinx -W --keep-going -q -b html \
  -d "$out/doctrees" docs "$out/html" || fail "sphinx warned (above)"

step "coverage of the C and Python APIs"
"$python" scripts/check_docs.py "$out/doxygen/xml" "$out/html/objects.inv" ||
  fail "the documentation misses the names or links above"
echo "check-docs: OK: $out/html/index.html (C API: $out/html/capi/index.html)"
