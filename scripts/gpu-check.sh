#!/usr/bin/env bash
# The GPU check: the one command to run when a machine with an NVIDIA GPU is lent (an H100 or
# H200 with 16 cores; at most 10 minutes a command), so that its minutes go to measuring.
#
#   bash scripts/gpu-check.sh [OUTDIR]            OUTDIR: default $OUT if set, else build-gpu/check
#   bash scripts/gpu-check.sh --dry-run [OUTDIR]  print the steps and their time limits, run nothing
#   bash scripts/gpu-check.sh --steps ctest,reversible [OUTDIR]   only these (the build always runs)
#   bash scripts/gpu-check.sh --fetch-deps        on Debian 12 with apt: the .debs into .gpu-deps/
#   bash scripts/gpu-check.sh --pack              HERE, without a GPU: build the sm_90 binaries into
#                  build-gpu and pack what the GPU steps run into .gpu-carry/ (git-ignored, ~15 MiB),
#                  with the Inf-CL wheel when pip can fetch it, so that device minutes go to running
#   Through the device tool: run, command `bash scripts/gpu-check.sh $OUT`, carry [".gpu-carry"]
#   (prebuilt; or carry [".gpu-deps"] to configure and build there instead).
#
# Without a GPU (`nvidia-smi -L` lists none) it prints "no GPU on this machine: nothing to check"
# and exits 0 without building. With one, the steps, in order of value, each under `timeout`, each
# appending its output to a log in OUTDIR, going on when one fails:
#   1. unpack      when .gpu-carry/build-gpu.tar.xz exists (--pack): the prebuilt build-gpu, its
#                  absolute paths kept valid by a symbolic link from the root it was built in;
#                  configure and build are then skipped. Otherwise:
#      deps        when .gpu-deps/*.deb exist (--fetch-deps; the GPU image may lack them and has
#                  no network): unpacked into BUILD/deps, and configure is pointed at them
#      configure   flatmem_configure BUILD, Release, FLATMEM_WITH_CUDA=ON, sm_90 (skipped when
#                  BUILD is already configured: a warm machine keeps it between calls)
#      build       flatmem_build BUILD, every core, only the library, the GPU tests and the CUDA
#                  benchmarks
#   2. probe       the CUDA runtime must see the device (else every GPU test would just skip);
#                  libcublasLt.so.13 and libnccl.so.2 (dlopen()ed) are looked up in the image
#                  (CUDA toolkit, the Python venv's nvidia wheels) and put on LD_LIBRARY_PATH
#   3. ctest       ctest -L gpu (the compute-sanitizer tests run in step 8 instead); with NCCL this
#                  includes gpu/nccl-stand-in/*: the multi-rank cases with 2-4 ranks as threads on
#                  the one GPU over the NCCL stand-in (FLATMEM_NCCL_LIBRARY set by ctest; not NCCL:
#                  docs/nccl-stand-in.md)
#   4. contrastive bench/cuda/contrastive_cuda_bench --d 768 --b 16384,65536 (a symmetric-loss and a
#                  sigmoid-loss row each, against four / three cuBLASLt GEMMs and the naive loss, and
#                  each through a one-rank ring over NCCL: the ring's overhead, target <= 1.05x)
#   5. panels      the same bench --shapes at d 768, b 65536: the panel engine at forced extents
#                  (2048 x 1024 .. 16384 x 8192), dials 64M and 1G, each row split into its GEMMs
#                  timed alone at that panel shape and the rest (passes, launches, host work)
#   6. torch       the Python package built there (the carried SWIG wheel, the image's Python)
#                  and flatmem.torch's CUDA tests, bindings/python/tests/test_torch_cuda.py and
#                  test_torch_cyclic_cuda.py (into ctest.log)
#   7. infcl       bench/infcl_compare.py (d 768, b 16384 and 65536) when python3 imports inf_cl,
#                  into contrastive_cuda.log
#                  (the carried wheel is installed into a private folder first)
#   8. sanitizer   compute-sanitizer memcheck and racecheck on three GPU test executables, filtered
#                  to small cases
#   9. jax         bindings/jax/tests/gpu_check.py: the XLA:CUDA handlers (losses, reversible
#                  segments) under jit and grad against references on the GPU (into ctest.log); --pack
#                  builds libflatmem_jax.so against the XLA FFI headers of the image's jaxlib
#  10. reversible  reversible_cuda_bench, width 768, 12 heads, MLP 3072, depths 12 and 24,
#                  batches 8..128, TF32 then FP32 (rows of both in one CSV)
#  11. contrastive-large  the same bench at d 768, b 262144 and d 512, b 16384..262144
#  12. cpu-bf16    the GPU machine's CPU (a Xeon or EPYC of the AVX512_BF16 / AMX generation):
#                  test_contrastive_bf16_gemm on the hardware, then contrastive_bench's fp32 and
#                  bf16 rows at b 4096 and 16384 under each ISA level it has, G split (default)
#                  and rounded once (--precision tf32), into contrastive_cuda.log (issue 32's
#                  figures: no other machine of this project has AVX512_BF16)
#  13. profile     Nsight Compute (ncu, --clock-control none) on the first launches of the panel
#                  engine's fold and gradient kernels (d 768, b 16384, default dial), then of the tile
#                  kernels: speed of light, occupancy, memory and compute workload (profile.log)
#  14. sanitizer-all  only when named (--steps sanitizer-all, in calls of its own): every test of
#                  ctest -L gpu under compute-sanitizer memcheck, then racecheck, with each test's
#                  environment (scripts/gpu_sanitize.py); resumable: a warm machine keeps its state
#                  file and the next call goes on (exit 2 = clean so far, not finished)
# The whole run is held to FLATMEM_GPU_CHECK_BUDGET seconds (default 530): a step gets the smaller
# of its own limit and what is left; one that would get under 10 s is skipped. A warm rerun reuses
# the build, so `--steps` can finish what ran out of time.
#
# OUTDIR gets at most 8 files (the device tool returns no more): summary.txt (the machine: GPU,
# driver, nvcc, revision, CPU; then one line per step: status and seconds), build.log (unpack or
# deps + configure + build), ctest.log (ctest, torch, jax), sanitizer.log, contrastive_cuda.log
# (contrastive, panels, infcl, contrastive-large, cpu-bf16), reversible_cuda.log,
# reversible_cuda.csv, profile.log; each log cut to its
# last 6 MiB. Exit status: 0 when no step failed, timed out or ran out of time.
# Environment: FLATMEM_GPU_CHECK_BUDGET, FLATMEM_GPU_CHECK_BUILD_DIR (default build-gpu),
# FLATMEM_CUDA_ARCHITECTURES (default 90), FLATMEM_GPU_CHECK_CTEST_JOBS (default 8).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

self=${BASH_SOURCE[0]}
usage() { sed -n '2,/^set -euo pipefail/p' "$self" | sed '$d; s/^# \{0,1\}//'; }

dry_run=false
fetch_deps=false
pack=false
steps=all
outdir=
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry_run=true ;;
    --fetch-deps) fetch_deps=true ;;
    --pack) pack=true ;;
    --steps) [ $# -ge 2 ] || { echo "gpu-check: --steps needs a list" >&2; exit 2; }; steps=$2; shift ;;
    --steps=*) steps=${1#--steps=} ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu-check: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$outdir" ] || { echo "gpu-check: one OUTDIR only" >&2; exit 2; }; outdir=$1 ;;
  esac
  shift
done
for s in ${steps//,/ }; do
  case $s in all|ctest|contrastive|panels|infcl|sanitizer|jax|torch|reversible|contrastive-large|cpu-bf16|profile|sanitizer-all) ;;
    *) echo "gpu-check: unknown step '$s' in --steps (all ctest contrastive panels infcl sanitizer jax torch reversible contrastive-large cpu-bf16 profile sanitizer-all)" >&2
       exit 2 ;;
  esac
done
want() { [ "$steps" = all ] || [[ ",$steps," == *",$1,"* ]]; }
# Steps that run only when named (longer than one call): not part of "all".
named() { [[ ",$steps," == *",$1,"* ]]; }

# The Debian 12 packages of the build that the GPU machine's image is not known to have (its list:
# CUDA, CMake, ninja, PyTorch; it cannot fetch anything): dlpack's header, doctest's CMake package,
# OpenBLAS (the library links its static archive; bench/ wants the shared one too, whose link
# check needs libgfortran). Fetched here, carried there, unpacked into BUILD/deps (step 1).
deps_packages=(libdlpack-dev doctest-dev libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0)
deps_src=$FLATMEM_ROOT/.gpu-deps
if $fetch_deps; then
  mkdir -p "$deps_src"
  rm -f "$deps_src"/*.deb
  cd "$deps_src"
  apt-get download "${deps_packages[@]}"
  ls -l "$deps_src"
  echo "gpu-check: carry .gpu-deps with the run (it is git-ignored): run with carry [\".gpu-deps\"]"
  exit 0
fi

build_rel=${FLATMEM_GPU_CHECK_BUILD_DIR:-build-gpu}
case $build_rel in /*) build=$build_rel ;; *) build=$FLATMEM_ROOT/$build_rel ;; esac
budget=${FLATMEM_GPU_CHECK_BUDGET:-530}
reserve=5     # seconds kept for the summary
min_step=10   # a step that would get less is skipped
ctest_jobs=${FLATMEM_GPU_CHECK_CTEST_JOBS:-8}
log_cap=$((6 * 1024 * 1024))
outdir=${outdir:-${OUT:-$build/check}}
# Relative to where the script was called from (it works in the checkout's root).
case $outdir in /*) ;; *) outdir=$PWD/$outdir ;; esac
cd "$FLATMEM_ROOT"

targets=(flatmem test_gpu_contrastive_values test_gpu_contrastive_determinism test_gpu_contrastive_bad_input test_gpu_contrastive_panels test_gpu_sigmoid_panels
         test_gpu_sigmoid test_gpu_sigmoid_bad_input test_gpu_reversible_segment test_gpu_reversible_blocks
         contrastive_cuda_bench reversible_cuda_bench contrastive_bench)
# The bf16 kernel test is configured where SIMDe (libsimde-dev) is found: here, when packing.
[ -f /usr/include/simde/x86/avx512/dpbf16.h ] && targets+=(test_contrastive_bf16_gemm)
# The device transport, the ring contrastive loss on CUDA tensors, cyclic device gradients,
# stage-parallel device tensors and the device ZeRO relay: built when configure found NCCL; the
# NCCL stand-in that runs their multi-rank cases on one GPU (ctest gpu/nccl-stand-in/*) with them.
nccl_targets=(test_gpu_comm test_gpu_contrastive_ring test_gpu_cyclic test_gpu_cyclic_stages test_gpu_cyclic_relay
              flatmem_nccl_standin)

# --- prebuilt binaries: --pack here, unpacked there --------------------------------------------
carry=$FLATMEM_ROOT/.gpu-carry
prebuilt_tar=$carry/build-gpu.tar.xz
swig_version=${FLATMEM_GPU_CHECK_SWIG:-4.5.1}
# The GPU image's jaxlib (KINDS.md of the device tool: jax 0.11.2 with its CUDA 13 plugins).
jaxlib_version=${FLATMEM_GPU_CHECK_JAXLIB:-0.11.2}
# build_jax_plugin: bindings/jax's libflatmem_jax.so (CPU and CUDA handlers) into $build/jax,
# against build-gpu's libflatmem (a pkg-config file naming the build tree) and the XLA FFI
# headers of jaxlib $jaxlib_version (its Python 3.12 wheel, fetched here; the headers are
# plain C/C++, so the interpreter that runs CMake needs no jax: a stand-in module answers
# jax.ffi.include_dir() and jax.__version__ for bindings/jax/CMakeLists.txt).
build_jax_plugin() {
  local dir=$build/jax-deps version
  version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$build/CMakeCache.txt")
  rm -rf "$dir" "$build/jax"
  mkdir -p "$dir/wheel" "$dir/py/jax" "$dir/lib/pkgconfig"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 -d "$dir/wheel" \
    "jaxlib==$jaxlib_version" || return 1
  unzip -q "$dir"/wheel/jaxlib-*.whl 'jaxlib/include/*' -d "$dir" || return 1
  printf '__version__ = "%s"\n' "$jaxlib_version" >"$dir/py/jax/__init__.py"
  printf 'def include_dir():\n    return "%s"\n' "$dir/jaxlib/include" >"$dir/py/jax/ffi.py"
  printf '%s\n' "Name: flatmem" "Description: flatmem's build tree $build (the GPU check's JAX plugin)" \
    "Version: ${version:-0.2.0}" "Cflags: -I$FLATMEM_ROOT/include" "Libs: -L$build/src -lflatmem" \
    >"$dir/lib/pkgconfig/flatmem.pc"
  PYTHONPATH=$dir/py PKG_CONFIG_PATH=$dir/lib/pkgconfig cmake -S "$FLATMEM_ROOT/bindings/jax" -B "$build/jax" \
    -DFLATMEM_JAX_USE_PKGCONFIG=ON -DFLATMEM_JAX_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$FLATMEM_CUDA_ARCHS" -DPython3_EXECUTABLE="$(command -v python3)" &&
    cmake --build "$build/jax" -j "$FLATMEM_JOBS" --target flatmem_jax
}

if $pack; then
  # The build the device runs: Release, CUDA for $FLATMEM_CUDA_ARCHS, UCX off (the GPU image has no
  # libucp; the GPU tests use in-process communicators), cuBLASLt and NCCL dlopen()ed there.
  build=$FLATMEM_ROOT/build-gpu
  if [ ! -f "$build/CMakeCache.txt" ]; then
    step "configure $build"
    pack_flags=(-DCMAKE_BUILD_TYPE=Release -DFLATMEM_WITH_CUDA=ON -DFLATMEM_WITH_NCCL=ON -DFLATMEM_WITH_UCX=OFF)
    command -v ninja >/dev/null 2>&1 && pack_flags+=(-G Ninja)
    flatmem_configure "$build" "${pack_flags[@]}"
  fi
  targets+=("${nccl_targets[@]}")
  step "build ${targets[*]}"
  flatmem_build "$build" --target "${targets[@]}"
  step "the JAX plugin against jaxlib $jaxlib_version's XLA FFI headers"
  if build_jax_plugin; then
    echo "JAX plugin: $build/jax/libflatmem_jax.so"
  else
    echo "gpu-check: the JAX plugin was not built (see above): the jax step will skip" >&2
  fi
  step "pack $prebuilt_tar"
  mkdir -p "$carry"
  rm -f "$carry"/*
  printf '%s\n' "$FLATMEM_ROOT" >"$carry/ROOT"
  { git rev-parse HEAD; git status --porcelain --untracked-files=no | sed 's/^/  /'; } >"$carry/REVISION"
  (
    cd "$FLATMEM_ROOT"
    {
      find build-gpu -name CTestTestfile.cmake
      find build-gpu/tests -maxdepth 1 -name '*_include-*.cmake'
      find build-gpu/tests -maxdepth 1 \( -name 'test_gpu_*_tests-*.cmake' -o -name 'test_gpu_*' -type f -perm -u+x \)
      find build-gpu/src -maxdepth 1 -name 'libflatmem.so*'
      find build-gpu/tests -maxdepth 1 -name 'libflatmem_nccl_standin.so'
      echo build-gpu/bench/contrastive_cuda_bench
      echo build-gpu/bench/reversible_cuda_bench
      [ ! -f build-gpu/jax/libflatmem_jax.so ] || echo build-gpu/jax/libflatmem_jax.so
    } | sort -u >"$carry/files"
    tar -cJf "$prebuilt_tar" -T "$carry/files"
  )
  # SWIG (PyPI's wheel carries the binary): the torch step builds the Python package there, for
  # the image's Python 3.12.
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$carry" "swig==$swig_version"; then
    echo "SWIG wheel: $(ls "$carry"/swig-*.whl)"
  else
    echo "gpu-check: pip could not fetch swig: the torch step will skip" >&2
  fi
  # Inf-CL (pure Python; its needs, torch, triton and numpy, are in the GPU image).
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d "$carry" inf-cl==1.2.1; then
    echo "Inf-CL wheel: $(ls "$carry"/inf_cl-*.whl)"
  else
    echo "gpu-check: pip could not fetch inf-cl: the infcl step will skip" >&2
  fi
  ls -l "$carry"
  echo "gpu-check: carry .gpu-carry (git-ignored) and run: bash scripts/gpu-check.sh \$OUT"
  exit 0
fi
prebuilt=false
[ -f "$prebuilt_tar" ] && prebuilt=true
if $prebuilt; then build=$FLATMEM_ROOT/build-gpu build_rel=build-gpu; fi

# --- is there a GPU? ---------------------------------------------------------------------------
gpu_list=
have_gpu=false
why_not="nvidia-smi not found"
if command -v nvidia-smi >/dev/null 2>&1; then
  if gpu_list=$(timeout 30 nvidia-smi -L 2>&1) && grep -q '^GPU [0-9]' <<<"$gpu_list"; then
    have_gpu=true
  else
    why_not="nvidia-smi -L lists no GPU: $(head -n 3 <<<"$gpu_list" | tr '\n' ' ')"
  fi
fi
if ! $have_gpu && ! $dry_run; then
  echo "no GPU on this machine: nothing to check ($why_not)"
  exit 0
fi

# --- steps -------------------------------------------------------------------------------------
names=() results=() seconds=()
failed=0
# record NAME STATUS SECS: one summary line, in summary.txt at once (it survives a kill).
record() {
  names+=("$1") results+=("$2") seconds+=("$3")
  # Failures: a step that failed, timed out or ran out of time (not one skipped because of another).
  case $2 in FAILED*|TIMEOUT*|skipped\ \(out\ of\ time*) failed=$((failed + 1)) ;; esac
  $dry_run || printf '%-30s %-52s %5ss\n' "$1" "$2" "$3" >>"$outdir/summary.txt"
  $dry_run || printf '    -> %s (%ss)\n' "$2" "$3"
}
quoted() { printf '%q ' "$@"; }
# cap_log FILE: keep the last $log_cap bytes.
cap_log() {
  local f=$1
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt "$log_cap" ] || return 0
  { echo "[gpu-check: cut to the last $log_cap bytes]"; tail -c "$log_cap" "$f"; } >"$f.cut" && mv "$f.cut" "$f"
}
# run_step NAME LIMIT LOG CMD...: CMD (a program or an exported function) under timeout, for the
# smaller of LIMIT and what is left of the budget, its output appended to OUTDIR/LOG.
# Sets step_status (ok, FAILED (rc N), TIMEOUT (...), skipped (...)). Never fails itself.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((budget - SECONDS - reserve))
  [ "$limit" -le "$left" ] || limit=$left
  if $dry_run; then
    step "$name  (limit ${limit}s, log $log)"
    printf '    $ %s\n' "$(quoted "$@")"
    step_status=planned
    return 0
  fi
  step "$name  (limit ${limit}s, log $log)"
  if [ "$limit" -lt "$min_step" ]; then
    step_status="skipped (out of time: ${left}s of ${budget}s left)"
    record "$name" "$step_status" 0
    return 0
  fi
  printf '\n==> %s  [%s UTC, limit %ss]\n$ %s\n' "$name" "$(date -u +%T)" "$limit" "$(quoted "$@")" >>"$outdir/$log"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$limit" bash -c '"$@"' run_step "$@" >>"$outdir/$log" 2>&1 </dev/null || rc=$?
  case $rc in
    0) step_status=ok ;;
    124|137) step_status="TIMEOUT (limit ${limit}s)" ;;
    *) step_status="FAILED (rc $rc)" ;;
  esac
  printf '==> %s: %s (%ss)\n' "$name" "$step_status" "$((SECONDS - start))" >>"$outdir/$log"
  cap_log "$outdir/$log"
  if [ "$step_status" != ok ]; then
    echo "    last lines of $log:"
    tail -n 15 "$outdir/$log" | sed 's/^/    | /'
  fi
  record "$name" "$step_status" "$((SECONDS - start))"
}
# skip NAME WHY: a step not run.
skip() {
  if $dry_run; then step "$1"; echo "    (skipped when $2)"; return 0; fi
  step "$1"
  record "$1" "skipped ($2)" 0
}

# unpack_deps PREFIX DEB...: the carried Debian packages into PREFIX (dpkg-deb, else ar + tar),
# doctest's CMake package pointed at PREFIX/usr instead of /usr.
unpack_deps() {
  local prefix=$1 deb member
  shift
  mkdir -p "$prefix"
  for deb in "$@"; do
    echo "unpack $(basename "$deb")"
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix"
    else
      member=$(ar t "$deb" | grep '^data\.tar')
      (cd "$prefix" && ar x "$deb" "$member" && tar -xf "$member" && rm -f "$member")
    fi
  done
  sed -i "s|^set(_IMPORT_PREFIX \"/usr\")|set(_IMPORT_PREFIX \"$prefix/usr\")|" \
    "$prefix/usr/lib/cmake/doctest/doctestTargets.cmake"
  ls -l "$prefix/usr/include/dlpack/dlpack.h" "$prefix/usr/lib/cmake/doctest/doctestConfig.cmake" \
        "$prefix"/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.{a,so}
}
# probe_device EXE: the GPU tests' main answers whether the CUDA runtime sees a device.
probe_device() {
  local rc=0
  "$1" --probe-device || rc=$?
  case $rc in
    0) echo "the CUDA runtime sees a device" ;;
    77) echo "nvidia-smi lists a GPU but the CUDA runtime sees none: every GPU test would only skip"; return 1 ;;
    *) echo "$1 --probe-device failed (rc $rc)"; return 1 ;;
  esac
}
# with_deps CMD...: CMD with the unpacked libraries on LD_LIBRARY_PATH when there are some (FindBLAS
# finds libopenblas.so there, and its link check libgfortran.so.5); configure and build only.
with_deps() {
  if [ -n "${GPU_CHECK_DEPS_LIB:-}" ]; then
    export LD_LIBRARY_PATH=$GPU_CHECK_DEPS_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
  "$@"
}
export -f flatmem_configure flatmem_build unpack_deps probe_device with_deps
export FLATMEM_ROOT FLATMEM_PYTHON FLATMEM_CUDA_ARCHS FLATMEM_JOBS

# --- the machine ---------------------------------------------------------------------------------
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
sanitizer=$(command -v compute-sanitizer || true)
for candidate in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -n "$sanitizer" ] || { [ -x "$candidate" ] && sanitizer=$candidate; }
done
try() { timeout 20 "$@" 2>&1 || echo "($1 failed)"; }
machine_info() {
  echo "flatmem gpu-check, $(date -u '+%Y-%m-%d %H:%M:%S') UTC; budget ${budget}s; steps: $steps"
  local rev
  rev=$(git rev-parse HEAD 2>/dev/null) || rev="unknown (no git checkout here)"
  if git status --porcelain --untracked-files=no 2>/dev/null | grep -q .; then rev+=" with uncommitted changes"; fi
  echo "revision: $rev"
  # The device's copy of the checkout may carry an older .git than the tree; the packed binaries
  # name the commit they were built from.
  if $prebuilt; then echo "prebuilt binaries: $(tr '\n' ' ' <"$carry/REVISION")"; fi
  echo "host: $(uname -srm); $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB, " $7 " GiB available"}')"
  echo "gpu: $(try nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader)"
  echo "nvcc: $(try "$nvcc" --version | tail -n 2 | tr '\n' ' ')"
  echo "compiler: $(try "${CXX:-c++}" --version | head -n 1); cmake: $(try cmake --version | head -n 1); ninja: $(try ninja --version)"
  echo "compute-sanitizer: ${sanitizer:-not found} $( [ -z "$sanitizer" ] || try "$sanitizer" --version | tail -n 1)"
  echo "python3: $(try python3 --version) at $(command -v python3 || echo -)"
  echo "build dir: $build; CUDA architectures: $FLATMEM_CUDA_ARCHS; jobs: $FLATMEM_JOBS"
  echo
  try nvidia-smi
  echo
  printf '%-30s %-52s %6s\n' step status time
}

if $dry_run; then
  cat <<EOF
gpu-check, dry run: the steps a GPU machine runs, in order, each under timeout with its output
appended to OUTDIR/<log>, going on when one fails. The whole run is held to ${budget}s: a step gets
the smaller of its limit and what is left; one that would get under ${min_step}s is skipped.
OUTDIR: $outdir    build dir: $build    CUDA architectures: $FLATMEM_CUDA_ARCHS    steps: $steps
GPU here: $($have_gpu && echo yes || echo "none ($why_not): a real run stops here with \"no GPU on this machine: nothing to check\"")
EOF
  step "machine -> summary.txt (nvidia-smi, nvcc --version, git rev-parse HEAD, CPU, memory)"
else
  mkdir -p "$outdir"
  rm -f "$outdir"/{summary.txt,build.log,ctest.log,sanitizer.log,contrastive_cuda.log,reversible_cuda.log,reversible_cuda.csv,libraries.txt,profile.log}
  step "machine -> $outdir/summary.txt"
  machine_info >"$outdir/summary.txt"
  grep -E "^(revision|prebuilt binaries|host|gpu|nvcc):" "$outdir/summary.txt" | sed 's/^/    /'
fi

# --- unpack, or deps + configure + build -------------------------------------------------------
# unpack_prebuilt TAR ROOTFILE: the packed build-gpu into the checkout; the root it was built in
# (its CTest files and RUNPATHs name absolute paths there) becomes a link to this checkout.
unpack_prebuilt() {
  local tar=$1 built_root
  built_root=$(cat "$2")
  if [ "$built_root" = "$FLATMEM_ROOT" ] && [ -f "$FLATMEM_ROOT/build-gpu/CMakeCache.txt" ]; then
    echo "the checkout that packed $tar: its build-gpu is used as it is"
    return 0
  fi
  rm -rf "$FLATMEM_ROOT/build-gpu"
  tar -xJf "$tar" -C "$FLATMEM_ROOT"
  echo "unpacked $(tar -tJf "$tar" | wc -l) files of $tar (built in $built_root, revision $(head -n 1 "$(dirname "$2")/REVISION"))"
  if [ "$built_root" != "$FLATMEM_ROOT" ]; then
    if [ ! -e "$built_root" ]; then
      mkdir -p "$(dirname "$built_root")"
      ln -s "$FLATMEM_ROOT" "$built_root"
      echo "link $built_root -> $FLATMEM_ROOT"
    elif [ "$(cd "$built_root" && pwd -P)" != "$(cd "$FLATMEM_ROOT" && pwd -P)" ]; then
      echo "$built_root exists and is not this checkout: the prebuilt paths would point elsewhere"
      return 1
    fi
  fi
  ls -l "$FLATMEM_ROOT/build-gpu/src" "$FLATMEM_ROOT/build-gpu/bench"
}
export -f unpack_prebuilt

if $prebuilt; then
  run_step unpack 60 build.log unpack_prebuilt "$prebuilt_tar" "$carry/ROOT"
  build_ok=$([ "$step_status" = ok ] || [ "$step_status" = planned ] && echo true || echo false)
else
  deps_prefix=$build/deps
  debs=()
  for deb in "$deps_src"/*.deb; do [ -e "$deb" ] && debs+=("$deb"); done
  configure_flags=(-DCMAKE_BUILD_TYPE=Release -DFLATMEM_WITH_CUDA=ON)
  if [ ${#debs[@]} -gt 0 ]; then
    arch_lib=$deps_prefix/usr/lib/x86_64-linux-gnu
    blas_inc=$deps_prefix/usr/include/x86_64-linux-gnu/openblas-pthread
    export GPU_CHECK_DEPS_LIB=$arch_lib:$arch_lib/openblas-pthread
    configure_flags+=(-DCMAKE_PREFIX_PATH="$deps_prefix/usr" -DDLPACK_INCLUDE_DIR="$deps_prefix/usr/include"
                      -DFLATMEM_OPENBLAS_ARCHIVE="$arch_lib/openblas-pthread/libopenblas.a"
                      -DFLATMEM_OPENBLAS_INCLUDE_DIR="$blas_inc" -DBENCH_CBLAS_INCLUDE_DIR="$blas_inc"
                      -DCMAKE_LIBRARY_PATH="$arch_lib/openblas-pthread")
  fi
  command -v ninja >/dev/null 2>&1 && configure_flags+=(-G Ninja)

  configured=false
  [ -f "$build/CMakeCache.txt" ] && { [ -f "$build/build.ninja" ] || [ -f "$build/Makefile" ]; } && configured=true
  if $configured; then
    skip deps "not needed: $build_rel is configured"
    skip configure "reused: $build_rel is configured"
    configure_ok=true
  else
    if [ ${#debs[@]} -gt 0 ]; then
      run_step deps 60 build.log unpack_deps "$deps_prefix" "${debs[@]}"
    else
      skip deps "none carried (.gpu-deps/*.deb): the system's are used"
    fi
    run_step configure 120 build.log with_deps flatmem_configure "$build" "${configure_flags[@]}"
    configure_ok=$([ "$step_status" = ok ] || [ "$step_status" = planned ] && echo true || echo false)
  fi

  for nccl_test in "${nccl_targets[@]}"; do
    if grep -qs "$nccl_test" "$build/tests/CTestTestfile.cmake"; then targets+=("$nccl_test"); fi
  done
  if $dry_run; then echo "    (+ ${nccl_targets[*]} when configure found NCCL)"; fi
  if $configure_ok; then
    run_step build 300 build.log with_deps flatmem_build "$build" --target "${targets[@]}"
    build_ok=$([ "$step_status" = ok ] || [ "$step_status" = planned ] && echo true || echo false)
  else
    skip build "no configure"
    build_ok=false
  fi
fi

# --- the libraries flatmem dlopen()s and the bench links ----------------------------------------
# libcublasLt.so.13 and libnccl.so.2: the loader's own search first, then the CUDA toolkit, then the
# nvidia-* wheels of python3's environment (where the GPU image keeps NCCL).
runtime_library_dirs() {
  local lib dir
  local -a roots=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib)
  local site
  site=$(timeout 30 python3 -c 'import os, nvidia; print(" ".join(os.path.realpath(p) for p in nvidia.__path__))' \
         2>/dev/null) || site=
  for lib in libcublasLt.so.13 libnccl.so.2; do
    if ldconfig -p 2>/dev/null | grep " $lib " >/dev/null; then echo "$lib: the loader finds it"; continue; fi
    dir=
    for root in "${roots[@]}"; do [ -e "$root/$lib" ] && { dir=$root; break; }; done
    if [ -z "$dir" ] && [ -n "$site" ]; then
      # shellcheck disable=SC2086
      dir=$(find $site -maxdepth 4 -name "$lib" -printf '%h\n' 2>/dev/null | head -n 1)
    fi
    if [ -n "$dir" ]; then
      echo "$lib: $dir"
      case ":${LD_LIBRARY_PATH:-}:" in *":$dir:"*) ;; *) export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;; esac
    else
      echo "$lib: not found (the tests that need it will fail naming it)"
    fi
  done
}
if ! $dry_run && $build_ok; then
  step "runtime libraries"
  runtime_library_dirs >"$outdir/libraries.txt" 2>&1
  sed 's/^/    /' "$outdir/libraries.txt"
  { echo; echo "runtime libraries:"; sed 's/^/  /' "$outdir/libraries.txt"; echo; } >>"$outdir/summary.txt"
  rm -f "$outdir/libraries.txt"
fi

# --- the GPU: tests, benchmarks, sanitizer -------------------------------------------------------
tests_dir=$build/tests
bench_dir=$build/bench
gpu_ok=false
if $build_ok; then
  run_step probe 30 ctest.log probe_device "$tests_dir/test_gpu_contrastive_values"
  gpu_ok=$([ "$step_status" = ok ] || [ "$step_status" = planned ] && echo true || echo false)
else
  skip probe "no build"
fi
# gated STEP: whether STEP runs (selected, the build and the device there); records why not.
gated() {
  if ! want "$1"; then skip "$1" "not selected: --steps $steps"; return 1; fi
  if ! $build_ok; then skip "$1" "no build"; return 1; fi
  if ! $gpu_ok; then skip "$1" "the probe failed"; return 1; fi
}

if gated ctest; then
  run_step ctest 150 ctest.log ctest --test-dir "$build" -L gpu -E compute-sanitizer --output-on-failure \
    --no-tests=error -j "$ctest_jobs" --timeout 100
fi

if gated contrastive; then
  run_step contrastive 150 contrastive_cuda.log "$bench_dir/contrastive_cuda_bench" --d 768 --b 16384,65536
fi

if gated panels; then
  # Appended to contrastive_cuda.log: the panel engine at forced extents and both dials, each row
  # split into its GEMMs timed alone at that panel shape and the rest (passes, launches, host).
  run_step panels 120 contrastive_cuda.log "$bench_dir/contrastive_cuda_bench" --shapes --d 768 --b 65536
fi

# torch_step SITE: the Python package for this machine's python3, built with the standalone
# CMake build of bindings/python (the carried SWIG) against build-gpu's libflatmem installed into
# SITE/prefix, then flatmem.torch's CUDA tests.
torch_step() {
  local site=$1 wheel
  wheel=$(ls "$carry"/swig-*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || { echo "no carried SWIG wheel (.gpu-carry/swig-*.whl)"; return 1; }
  rm -rf "$site" && mkdir -p "$site/tools"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site/tools" "$wheel" || return 1
  cmake --install "$build" --prefix "$site/prefix" >/dev/null || return 1
  PYTHONPATH=$site/tools cmake -S "$FLATMEM_ROOT/bindings/python" -B "$site/cmake" \
    -DCMAKE_PREFIX_PATH="$site/prefix" -DSWIG_EXECUTABLE="$site/tools/bin/swig" \
    -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null || return 1
  PYTHONPATH=$site/tools cmake --build "$site/cmake" -j "$(nproc)" >/dev/null || return 1
  cmake --install "$site/cmake" --prefix "$site/py" >/dev/null || return 1
  (cd "$FLATMEM_ROOT/bindings/python/tests" &&
     PYTHONPATH=$site/py python3 -m pytest -q -p no:cacheprovider -rs test_torch_cuda.py test_torch_cyclic_cuda.py)
}
export -f torch_step
export carry build

if gated torch; then
  run_step torch 150 ctest.log torch_step /tmp/flatmem-gpu-check-torch
fi

# install_infcl DIR: the carried Inf-CL wheel into DIR (no deps: torch, triton and numpy are there).
install_infcl() {
  local wheel
  wheel=$(ls "$carry"/inf_cl-*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || return 0
  timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --target "$1" "$wheel"
}
if gated infcl; then
  infcl_site=/tmp/flatmem-gpu-check-site
  $dry_run || { install_infcl "$infcl_site" >/dev/null 2>&1 && export PYTHONPATH=$infcl_site${PYTHONPATH:+:$PYTHONPATH}; }
  if $dry_run || timeout 60 python3 -c 'import inf_cl' >/dev/null 2>&1; then
    run_step infcl 90 contrastive_cuda.log env PYTHONUNBUFFERED=1 python3 bench/infcl_compare.py \
      --lib "$build/src/libflatmem.so" --d 768 --b 16384 65536 --reps 3
    if $dry_run; then echo "    (only when python3 -c 'import inf_cl' works; the carried wheel is installed first)"; fi
  else
    skip infcl "inf_cl not importable by $(command -v python3 || echo python3) (carry .gpu-carry/inf_cl-*.whl)"
  fi
fi

if gated sanitizer; then
  if [ -z "$sanitizer" ] && ! $dry_run; then
    skip sanitizer "compute-sanitizer not found (PATH, /usr/local/cuda)"
  else
    san=${sanitizer:-compute-sanitizer}
    for tool in memcheck racecheck; do
      # The contrastive loss's small case (what ctest's gpu/contrastive/compute-sanitizer/* run) ...
      run_step "sanitizer $tool contrastive" 45 sanitizer.log "$san" --tool "$tool" --error-exitcode 1 \
        "$tests_dir/test_gpu_contrastive_determinism" '--test-case=*sanitizer-case*'
      # ... the sigmoid loss's small case (both passes, every call) ...
      run_step "sanitizer $tool sigmoid" 45 sanitizer.log "$san" --tool "$tool" --error-exitcode 1 \
        "$tests_dir/test_gpu_sigmoid" '--test-case=*sanitizer-case*'
      # ... and attention + MLP blocks of (2, 31, 96) in FP32 and TF32 (flatmem's kernels, cuBLASLt).
      run_step "sanitizer $tool blocks" 45 sanitizer.log "$san" --tool "$tool" --error-exitcode 1 \
        "$tests_dir/test_gpu_reversible_blocks" '--test-case=gpu/blocks/math/*'
    done
  fi
fi

if gated jax; then
  if [ -f "$build/jax/libflatmem_jax.so" ] || $dry_run; then
    run_step jax 150 ctest.log env PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false \
      FLATMEM_JAX_LIBRARY="$build/jax/libflatmem_jax.so" \
      PYTHONPATH="$FLATMEM_ROOT/bindings/jax/python:$FLATMEM_ROOT/bindings/jax/tests" \
      python3 "$FLATMEM_ROOT/bindings/jax/tests/gpu_check.py"
  else
    skip jax "no $build_rel/jax/libflatmem_jax.so (--pack builds it)"
  fi
fi


if gated reversible; then
  parts=$build/check-parts
  $dry_run || mkdir -p "$parts"
  for math in tf32 fp32; do
    rm -f "$parts/reversible_$math.csv"
    run_step "reversible $math" 120 reversible_cuda.log "$bench_dir/reversible_cuda_bench" --width 768 --heads 12 \
      --hidden 3072 --depths 12,24 --batches 8,16,32,64,128 --math "$math" --csv "$parts/reversible_$math.csv"
    # One CSV, both maths (the rows name theirs); the bench writes its CSV only when it finishes.
    if ! $dry_run && [ -s "$parts/reversible_$math.csv" ]; then
      if [ -s "$outdir/reversible_cuda.csv" ]; then
        tail -n +2 "$parts/reversible_$math.csv" >>"$outdir/reversible_cuda.csv"
      else
        cp "$parts/reversible_$math.csv" "$outdir/reversible_cuda.csv"
      fi
    fi
  done
fi

if gated contrastive-large; then
  # Appended to contrastive_cuda.log: b = 262144 at d 768, then the d = 512 sweep.
  run_step "contrastive-large d768" 90 contrastive_cuda.log "$bench_dir/contrastive_cuda_bench" --d 768 --b 262144
  run_step "contrastive-large d512" 120 contrastive_cuda.log "$bench_dir/contrastive_cuda_bench" --d 512 \
    --b 16384,65536,262144
fi

if gated cpu-bf16; then
  # Appended to contrastive_cuda.log: the CPU's bf16 kernels (issue 32), which only the GPU machines'
  # CPUs can run among this project's machines.
  if [ -x "$tests_dir/test_contrastive_bf16_gemm" ] || $dry_run; then
    run_step "cpu-bf16 kernels" 60 contrastive_cuda.log "$tests_dir/test_contrastive_bf16_gemm"
  fi
  run_step "cpu-bf16 bench" 150 contrastive_cuda.log "$bench_dir/contrastive_bench" --sizes 4096,16384 \
    --dtypes fp32,bf16 --variants flatmem,gemm4 --min-time 2 --rounds 1 --ref-max-batch 16384
  run_step "cpu-bf16 bench tf32" 90 contrastive_cuda.log "$bench_dir/contrastive_bench" --sizes 4096,16384 \
    --dtypes bf16 --variants flatmem --precision tf32 --min-time 2 --rounds 1 --ref-max-batch 16384
fi

if gated profile; then
  ncu=$(command -v ncu || true)
  for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [ -n "$ncu" ] || { [ -x "$candidate" ] && ncu=$candidate; }
  done
  if [ -z "$ncu" ] && ! $dry_run; then
    skip profile "ncu not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"
  else
    # The panel engine's fold and gradient kernels first (its default dial at b 16384: 4096 x 2048
    # panels; the bench's tile rows come first but their kernels do not match; one ncu run per
    # kernel, as the forward's folds would use up a shared launch count), then the tile kernels.
    # --clock-control none: the clocks are left as they are (METHOD.md).
    for kernel in fold_kernel gradient_kernel; do
      run_step "profile $kernel" 60 profile.log "${ncu:-ncu}" --clock-control none --target-processes all \
        -k "regex:$kernel" --launch-count 2 --section SpeedOfLight --section Occupancy \
        --section MemoryWorkloadAnalysis "$bench_dir/contrastive_cuda_bench" --d 768 --b 16384
    done
    run_step profile 120 profile.log "${ncu:-ncu}" --clock-control none --target-processes all \
      -k 'regex:forward_tiles|backward_pass|sigmoid_pass' --launch-count 4 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis "$bench_dir/contrastive_cuda_bench" --d 768 --b 16384
  fi
fi

if ! named sanitizer-all; then
  skip sanitizer-all "runs only when named: --steps sanitizer-all (longer than one call, resumable)"
elif gated sanitizer-all; then
  if [ -z "$sanitizer" ] && ! $dry_run; then
    skip sanitizer-all "compute-sanitizer not found (PATH, /usr/local/cuda)"
  else
    # Every test of ctest -L gpu under memcheck, then racecheck (scripts/gpu_sanitize.py), one line
    # per (tool, test) in $build_rel/sanitize-state.tsv: the next call on a warm machine goes on
    # where this one stopped (exit 2: clean so far, not finished). It stops 20 s before the step's
    # limit so that its summary is written.
    left=$((budget - SECONDS - reserve - 20))
    run_step sanitizer-all 590 sanitizer.log python3 "$FLATMEM_ROOT/scripts/gpu_sanitize.py" --build "$build" \
      --sanitizer "${sanitizer:-compute-sanitizer}" --log "$outdir/sanitizer.log" --budget "$left"
  fi
fi

# --- summary -------------------------------------------------------------------------------------
if $dry_run; then
  echo
  echo "gpu-check, dry run: nothing was run. Files in OUTDIR (8, as many as the device tool returns): summary.txt,"
  echo "build.log, ctest.log, sanitizer.log, contrastive_cuda.log, reversible_cuda.log, reversible_cuda.csv, profile.log."
  exit 0
fi
{
  echo
  echo "total: ${SECONDS}s of ${budget}s; $failed step(s) failed, timed out or ran out of time"
  [ "$failed" -eq 0 ] || echo "a warm machine keeps $build: rerun with --steps <names> to finish or repeat steps"
} >>"$outdir/summary.txt"
step "summary ($outdir/summary.txt)"
printf '%-30s %-52s %6s\n' step status time
for i in "${!names[@]}"; do
  printf '%-30s %-52s %5ss\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}"
done
tail -n 2 "$outdir/summary.txt"
echo "files: $(cd "$outdir" && printf '%s ' *)"
[ "$failed" -eq 0 ]
