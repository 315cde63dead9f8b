"""Builds libflatmem_jax.so with CMake against the INSTALLED flatmem and ships
it inside the flatmem_jax package, next to its __init__.py (where flatmem_jax
looks for it when FLATMEM_JAX_LIBRARY is unset).

    PKG_CONFIG_PATH=<prefix>/lib/pkgconfig pip install --no-build-isolation bindings/jax

The flatmem install is the one `pkg-config --variable=prefix flatmem` names
(PKG_CONFIG_PATH is honoured); CMake's find_package(flatmem) looks there
(CMAKE_PREFIX_PATH). The XLA FFI headers are jax.ffi.include_dir() of the
interpreter running this build (Python3_EXECUTABLE = sys.executable), hence
--no-build-isolation: the build environment must be the one with jax.

Environment:
  FLATMEM_JAX_WITH_CUDA   AUTO (default) | ON | OFF: the CUDA handlers with nvcc
  FLATMEM_JAX_BUILD_DIR   CMake build folder (default: under setuptools' build_temp)
  FLATMEM_JAX_CMAKE_ARGS  extra arguments for the CMake configure step (shell words)
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default: all processors)
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "libflatmem_jax.so"


def flatmem_prefix():
    """The installed flatmem's prefix, as pkg-config sees it, or a clear error."""
    command = ["pkg-config", "--variable=prefix", "flatmem"]
    try:
        done = subprocess.run(command, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("flatmem_jax setup: pkg-config not found (Debian: apt-get install pkg-config)")
    except subprocess.CalledProcessError as e:
        raise SystemExit(
            f"flatmem_jax setup: `{' '.join(command)}` failed: {e.stderr.strip()}\n"
            "Install libflatmem first (cmake --install build --prefix PREFIX) and point pkg-config "
            "at it: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pip install --no-build-isolation bindings/jax")
    prefix = done.stdout.strip()
    if not prefix:
        raise SystemExit("flatmem_jax setup: flatmem.pc names no prefix")
    return prefix


def check_jax():
    done = subprocess.run([sys.executable, "-c", "import jax.ffi"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"flatmem_jax setup: {sys.executable} cannot import jax.ffi, whose XLA FFI headers the "
            "build needs. Build without isolation in the environment that has jax (>= 0.7):\n"
            "  pip install --no-build-isolation bindings/jax\n" + done.stderr.strip())


class CMakeExtension(Extension):
    """A library CMake builds (no sources of setuptools' own)."""

    def __init__(self, name):
        super().__init__(name, sources=[])


class BuildCMake(build_ext):
    """cmake -S bindings/jax, cmake --build, then libflatmem_jax.so into the package."""

    def destination(self):
        if self.inplace:
            return os.path.join(HERE, "python", "flatmem_jax", LIBRARY)
        return os.path.join(os.path.abspath(self.build_lib), "flatmem_jax", LIBRARY)

    def get_outputs(self):
        return [self.destination()]

    def run(self):
        prefix = flatmem_prefix()
        check_jax()
        build_dir = os.path.abspath(os.environ.get("FLATMEM_JAX_BUILD_DIR")
                                    or os.path.join(self.build_temp, "cmake"))
        configure = [
            "cmake", "-S", HERE, "-B", build_dir,
            # find flatmem again in this prefix even when the cache remembers another one
            "-U", "flatmem_DIR",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={prefix}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DFLATMEM_JAX_WITH_CUDA={os.environ.get('FLATMEM_JAX_WITH_CUDA', 'AUTO')}",
            *shlex.split(os.environ.get("FLATMEM_JAX_CMAKE_ARGS", "")),
        ]
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        for command in (configure, ["cmake", "--build", build_dir, "-j", jobs]):
            print(" ".join(shlex.quote(word) for word in command), flush=True)
            try:
                subprocess.run(command, check=True)
            except FileNotFoundError:
                raise SystemExit("flatmem_jax setup: cmake not found (Debian: apt-get install cmake)")
            except subprocess.CalledProcessError as e:
                raise SystemExit(f"flatmem_jax setup: `{command[0]} {command[1]}` failed "
                                 f"(exit status {e.returncode}), see above")
        built = os.path.join(build_dir, LIBRARY)
        if not os.path.isfile(built):
            raise SystemExit(f"flatmem_jax setup: CMake built no {built}")
        destination = self.destination()
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        print(f"copying {built} -> {destination}", flush=True)
        shutil.copyfile(built, destination)
        shutil.copymode(built, destination)


setup(
    # One "extension": makes the wheel platform-specific; BuildCMake builds it.
    ext_modules=[CMakeExtension("flatmem_jax.libflatmem_jax")],
    cmdclass={"build_ext": BuildCMake},
)
