#!/usr/bin/env bash
# The snippets of README.md and docs/**/*.md: each equals (or begins) a block that its
# binding's tests execute, or is compiled and run here against the installed library
# (scripts/check_readme.py).
# Usage: bash scripts/check-readme.sh [PREFIX]   (default $FLATMEM_PREFIX)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$FLATMEM_PYTHON" "$FLATMEM_ROOT/scripts/check_readme.py" "${1:-$FLATMEM_PREFIX}"
