#!/usr/bin/env bash
# The panel engine's pass kernels (src/contrastive/panels/cuda/kernels.cu) compile for
# ARCH without register spills: ptxas -v reports every entry function; each must say
# "0 bytes spill stores, 0 bytes spill loads", and all ten entry functions must be reported
# (fold, merge, reset, store, and the gradient kernel per loss kind x Gt type; a build that
# compiled nothing would otherwise pass).
#   check_panel_spills.sh NVCC SOURCE_ROOT ARCH
set -euo pipefail
nvcc=$1 root=$2 arch=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$nvcc" -std=c++17 -O3 -I"$root/include" -I"$root/src" --generate-code=arch=compute_$arch,code=sm_$arch \
  -Xptxas -v -c "$root/src/contrastive/panels/cuda/kernels.cu" -o "$out/kernels.o" 2>"$out/ptxas.txt"
kernels=$(grep -c "Compiling entry function" "$out/ptxas.txt" || true)
reports=$(grep -c "bytes spill stores" "$out/ptxas.txt" || true)
spilling=$(grep "bytes spill stores" "$out/ptxas.txt" | grep -vc " 0 bytes spill stores, 0 bytes spill loads" || true)
echo "ptxas sm_$arch: $kernels entry functions, $reports spill reports, $spilling with spills"
[ "$kernels" -ge 10 ] && [ "$reports" -eq "$kernels" ] && [ "$spilling" -eq 0 ] || { cat "$out/ptxas.txt"; exit 1; }
