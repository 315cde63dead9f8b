"""Builds flatmem's SWIG extension against the INSTALLED library.

The build asks `pkg-config --cflags --libs flatmem` (set PKG_CONFIG_PATH to
<prefix>/lib/pkgconfig for a prefix pkg-config does not search), runs
`swig -python` on ../swig/flatmem.i with the installed header, compiles the
wrapper and links it with an rpath to the library's directory, so the
installed package finds libflatmem without LD_LIBRARY_PATH.

Environment:
  SWIG                  the swig executable (default: swig)
  FLATMEM_NO_RPATH=1    link without the rpath (then set LD_LIBRARY_PATH, or
                        install libflatmem where the loader looks)
"""
import os
import shlex
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
INTERFACE = os.path.normpath(os.path.join(HERE, "..", "swig", "flatmem.i"))


def pkg_config(*args):
    """The words pkg-config prints for flatmem, or a clear error."""
    command = ["pkg-config", *args, "flatmem"]
    try:
        done = subprocess.run(command, check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("flatmem setup: pkg-config not found (Debian: apt-get install pkg-config)")
    except subprocess.CalledProcessError as e:
        raise SystemExit(
            f"flatmem setup: `{' '.join(command)}` failed: {e.stderr.strip()}\n"
            "Install libflatmem first (cmake --install build --prefix PREFIX) and point pkg-config "
            "at it: PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pip install bindings/python"
        )
    return shlex.split(done.stdout)


class BuildSwigExt(build_ext):
    """swig -python on bindings/swig/flatmem.i, then the usual compile and link."""

    def run(self):
        cflags = pkg_config("--cflags")
        libs = pkg_config("--libs")
        libdir = pkg_config("--variable=libdir")[0]
        include_dirs = [f[2:] for f in cflags if f.startswith("-I")]
        swig = os.environ.get("SWIG", "swig")
        if shutil.which(swig) is None:
            raise SystemExit(f"flatmem setup: {swig} not found (Debian: apt-get install swig)")

        os.makedirs(self.build_temp, exist_ok=True)
        wrapper = os.path.join(self.build_temp, "flatmem_wrap.c")
        # The generated capi.py goes where the package is collected from.
        package_dir = os.path.join(self.build_lib, "flatmem")
        if self.inplace:
            package_dir = os.path.join(HERE, "src", "flatmem")
        os.makedirs(package_dir, exist_ok=True)
        command = [swig, "-python", *[f"-I{d}" for d in include_dirs], "-outdir", package_dir,
                   "-o", wrapper, INTERFACE]
        print(" ".join(command))
        subprocess.run(command, check=True)

        for ext in self.extensions:
            ext.sources = [wrapper]
            ext.include_dirs += include_dirs
            ext.extra_compile_args += [f for f in cflags if not f.startswith("-I")]
            ext.library_dirs += [f[2:] for f in libs if f.startswith("-L")]
            ext.libraries += [f[2:] for f in libs if f.startswith("-l")]
            ext.extra_link_args += [f for f in libs if not f.startswith(("-L", "-l"))]
            if os.environ.get("FLATMEM_NO_RPATH", "") not in ("1", "yes", "true"):
                ext.runtime_library_dirs += [libdir]
        self.force = True  # the wrapper is regenerated on every build
        super().run()


setup(
    # The sources are filled in by BuildSwigExt (the wrapper swig generates).
    ext_modules=[Extension("flatmem._capi", sources=[])],
    cmdclass={"build_ext": BuildSwigExt},
)
