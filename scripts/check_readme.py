"""Keeps README.md's code honest. Every fenced block in README.md that follows
a marker comment is checked:

  <!-- snippet: same as PATH -->   the block must equal, byte for byte, a block
                                   of the same language in PATH, a README whose
                                   blocks the binding's own tests execute;
  <!-- snippet: run -->            a ```c block: compiled as C99 against the
                                   installed library with nothing but
                                   `pkg-config --cflags --libs flatmem`, then run.

Usage: python3 scripts/check_readme.py PREFIX   (PREFIX: where flatmem is installed)
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- snippet: (.*?) -->\n```(\w+)\n(.*?)^```", re.S | re.M)
ANY_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def check_same_as(path, language, code):
    blocks = [c for lang, c in ANY_BLOCK.findall((ROOT / path).read_text()) if lang == language]
    if code not in blocks:
        return f"differs from every ```{language} block of {path}"
    return None


def check_run(language, code, prefix):
    if language != "c":
        return f"only ```c blocks can be run, not ```{language}"
    libdir = next(prefix.glob("lib*/pkgconfig")).parent
    env = dict(os.environ, PKG_CONFIG_PATH=str(libdir / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "flatmem"], env=env, check=True,
                           capture_output=True, text=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        source, program = pathlib.Path(tmp, "snippet.c"), pathlib.Path(tmp, "snippet")
        source.write_text(code)
        build = subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", str(source),
                                *flags, "-o", str(program)], capture_output=True, text=True)
        if build.returncode:
            return "does not compile:\n" + build.stderr
        run = subprocess.run([str(program)], capture_output=True, text=True,
                             env=dict(env, LD_LIBRARY_PATH=str(libdir)))
        if run.returncode:
            return f"exits with {run.returncode}:\n{run.stdout}{run.stderr}"
        print("    " + run.stdout.strip())
    return None


def main():
    prefix = pathlib.Path(sys.argv[1]).resolve()
    found = BLOCK.findall((ROOT / "README.md").read_text())
    failures = 0
    for marker, language, code in found:
        if marker.startswith("same as "):
            error = check_same_as(marker[len("same as "):], language, code)
        elif marker == "run":
            error = check_run(language, code, prefix)
        else:
            error = f"unknown marker '{marker}'"
        print(f"check-readme: ```{language} ({marker}): {'FAIL: ' + error if error else 'ok'}")
        failures += error is not None
    if len(found) == 0:
        print("check-readme: no marked snippet found in README.md")
        failures += 1
    print(f"check-readme: {len(found) - failures} snippets ok, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
