# Sourced by the scripts in this folder: where the checkout is, which Python, how to configure.
# shellcheck shell=bash
FLATMEM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Debian's interpreter, the one with python3-numpy/-matplotlib (python3 on PATH may be another).
FLATMEM_PYTHON=/usr/bin/python3
FLATMEM_JOBS=$(nproc)

# step "what": a visible marker between the stages of a script's output.
step() { printf '\n==> %s  [%ds]\n' "$*" "$SECONDS"; }

# CUDA kernels (built whenever nvcc is found) for Hopper only in these scripts: the CI
# machine has no GPU and compiles every kernel once per architecture; the library's own
# default is "80;90". Override with FLATMEM_CUDA_ARCHITECTURES=... in the environment.
FLATMEM_CUDA_ARCHS=${FLATMEM_CUDA_ARCHITECTURES:-90}

# apt_install PACKAGE...: Debian packages a check found missing, as root or through sudo (the
# calling script's fail() reports when neither is possible).
apt_install() {
  local sudo=
  if [ "$(id -u)" -ne 0 ]; then
    sudo=$(command -v sudo) || fail "not root and no sudo: install $* first"
  fi
  $sudo apt-get -o Acquire::Retries=5 update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get -o Acquire::Retries=5 install -y --no-install-recommends "$@"
}

# pip_fetching PYTHON PIP-ARGS...: `PYTHON -m pip PIP-ARGS` for commands that download from
# PyPI (torch alone is ~3 GB of wheels), made to survive a flaky network: pip's own retries and
# timeout raised, an interrupted wheel resumed where pip supports it (>= 25.1), and the whole
# command tried up to 4 times, 30 s apart (wheels fetched by a failed try stay in pip's cache).
pip_fetching() {
  local python=$1; shift
  local opts=(--disable-pip-version-check --retries 10 --timeout 60)
  if "$python" -m pip install --help 2>/dev/null | grep -q -- --resume-retries; then
    opts+=(--resume-retries 20)
  fi
  local try
  for try in 1 2 3 4; do
    "$python" -m pip "${opts[@]}" "$@" && return 0
    [ "$try" -lt 4 ] || break
    echo "pip_fetching: try $try of 4 failed; again in 30 s" >&2
    sleep 30
  done
  return 1
}

# flatmem_configure BUILD_DIR [cmake -D...]: configure the checkout into BUILD_DIR.
flatmem_configure() {
  local dir=$1
  shift
  cmake -S "$FLATMEM_ROOT" -B "$dir" --no-warn-unused-cli -DPython3_EXECUTABLE="$FLATMEM_PYTHON" \
        -DFLATMEM_CUDA_ARCHITECTURES="$FLATMEM_CUDA_ARCHS" "$@"
}

# flatmem_build BUILD_DIR [cmake --build args]: build with every core.
flatmem_build() {
  local dir=$1
  shift
  cmake --build "$dir" -j "$FLATMEM_JOBS" "$@"
}

# The bindings' Python environment (scripts/python-env.sh makes it).
FLATMEM_VENV=${FLATMEM_VENV:-$FLATMEM_ROOT/build/venv}
# The fresh venv the wheel is installed into and tested in (scripts/build-wheel.sh makes it).
FLATMEM_WHEEL_VENV=${FLATMEM_WHEEL_VENV:-$FLATMEM_ROOT/build/wheel-venv}
# Where scripts/test.sh installs the Release build for the bindings' tests.
FLATMEM_PREFIX=${FLATMEM_PREFIX:-$FLATMEM_ROOT/build/prefix}

# flatmem_cpu_isas PREFIX: the CPU instruction sets this processor runs (amx avx512bf16 avx512
# avx2 baseline, best first), as the libflatmem installed in PREFIX reports them
# (flatmem_cpu_isa_get's best and everything below it). The bindings' checks run their
# numeric tests once per ISA with FLATMEM_CPU_ISA set, as ctest -L isa does for the C++ ones.
flatmem_cpu_isas() {
  local library
  library=$(find "$1" -name 'libflatmem.so.[0-9]*' -print -quit)
  [ -n "$library" ] || { echo "flatmem_cpu_isas: no libflatmem.so.* under $1" >&2; return 1; }
  env -u FLATMEM_CPU_ISA "$FLATMEM_PYTHON" - "$library" <<'PYTHON'
import ctypes
import sys

library = ctypes.CDLL(sys.argv[1])
best = ctypes.c_int(0)
if library.flatmem_cpu_isa_get(None, ctypes.byref(best)) != 0:
    sys.exit("flatmem_cpu_isa_get failed")
print(" ".join(["baseline", "avx2", "avx512", "avx512bf16", "amx"][: best.value][::-1]))
PYTHON
}
