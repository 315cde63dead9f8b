#!/usr/bin/env bash
# Installs, from Debian 12's archive, everything the CPU build, the tests, the sanitizer
# build, the install check and the benchmark plots need. The one set-up step of both README
# commands (scripts/demo.sh, scripts/test.sh). Run it as root; it is idempotent: when every
# package is already installed it changes nothing and needs no root.
set -euo pipefail

packages=(
  cmake make gcc g++          # the build (C99 examples, C++20 library)
  pkg-config                  # examples and the install check use `pkg-config --cflags --libs flatmem`
  libopenblas-dev             # CBLAS sgemm (FLATMEM_BLAS=SYSTEM)
  libopenblas-pthread-dev     # the OpenBLAS archive linked privately into libflatmem (FLATMEM_BLAS=AUTO)
  libdlpack-dev               # <dlpack/dlpack.h>, included by the public header
  doctest-dev                 # the unit tests
  libsimde-dev                # the bf16 kernel tests: AVX512_BF16 intrinsics emulated on any x86-64
  binutils                    # nm/readelf: exported-symbol test, SONAME check
  libasan8 libubsan1          # ASan/UBSan runtimes for build-asan/ (g++ normally pulls them in)
  python3 python3-numpy python3-matplotlib   # bench plots and Python-side checks (use /usr/bin/python3)
  python3-venv python3-dev    # the bindings' venv (scripts/python-env.sh) and the SWIG extension's headers
  libucx-dev                  # the communicators: UCX bootstrap + host transport (ucx.pc)
  swig                        # bindings/swig/flatmem.i -> Python and Java
  openjdk-17-jdk-headless     # the Java SWIG module and its test (javac, JNI headers)
  openmpi-bin                 # mpirun: the launcher check runs the Python multi-process example under it
  bindgen                     # the Rust -sys crate's declarations are checked against a fresh bindgen run
  iproute2 iptables           # the multi-host network check: namespaces, veth, tbf, NFQUEUE rules
  libnetfilter-queue-dev      # tests/net/nfq_shaper: delay / loss where the kernel has no netem
  clang libclang-rt-14-dev    # the libFuzzer targets (build-fuzz/; libFuzzer is only a Recommends of clang)
  valgrind                    # memcheck over the examples and a two-rank UCX run
  doxygen                     # docs/: the C API reference from include/flatmem/*.h
  abigail-tools               # tests/abi/: abidiff of the library against the ABI baseline
  librust-cmake-dev           # flatmem-sys's `bundled` feature: the cmake crate (and cc), offline
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${missing[*]}; run this script as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp /tmp/flatmem-install-deps.XXXXXX.log)
apt_opts=(-q -y -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=300 -o Acquire::Retries=5)
if ! { apt-get "${apt_opts[@]}" update &&
       apt-get "${apt_opts[@]}" install --no-install-recommends "${packages[@]}"; } >"$log" 2>&1; then
  echo "install-deps: apt-get failed; its output:" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
rm -f "$log"
echo "install-deps: done"
