#!/usr/bin/env bash
# The README's demo command: bash scripts/demo.sh
# Installs the Debian packages, builds Release into build/ and runs the large-batch demo.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"

step "dependencies"
bash scripts/install-deps.sh
step "configure and build (Release, build/)"
flatmem_configure build -DCMAKE_BUILD_TYPE=Release
flatmem_build build --target demo_large_batch reversible_transformer
step "demo: build/examples/demo_large_batch"
build/examples/demo_large_batch "$@"
step "demo: build/examples/reversible_transformer"
build/examples/reversible_transformer
