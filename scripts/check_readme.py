"""Keeps the code of README.md and of the guides in docs/ honest. Every fenced
block in README.md or docs/**/*.md that follows a marker comment is checked:

  <!-- snippet: same as PATH -->   the block must equal, byte for byte, a block
                                   of the same language in PATH, a README whose
                                   blocks the binding's own tests execute, or,
                                   when PATH is a program (not .md), the whole
                                   program, which the tests run;
  <!-- snippet: start of PATH -->  the block must be the first lines of such a
                                   block: a runnable beginning of a program the
                                   tests execute whole (the front page's short
                                   first examples);
  <!-- snippet: run -->            a ```c block: compiled as C99 against the
                                   installed library with nothing but
                                   `pkg-config --cflags --libs flatmem`, then run.

A marker that is not directly followed by a fenced block fails, and so does a
README.md or a docs/ without any marked block.

Usage: python3 scripts/check_readme.py PREFIX   (PREFIX: where flatmem is installed)
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- snippet: (.*?) -->")
BLOCK = re.compile(r"<!-- snippet: (.*?) -->\n```(\w+)\n(.*?)^```", re.S | re.M)
ANY_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks_of(path, language):
    text = (ROOT / path).read_text()
    if not str(path).endswith(".md"):
        return [text]  # a program shown whole
    return [c for lang, c in ANY_BLOCK.findall(text) if lang == language]


def check_same_as(path, language, code):
    if code not in blocks_of(path, language):
        return f"differs from every ```{language} block of {path}"
    return None


def check_start_of(path, language, code):
    if not any(block.startswith(code) for block in blocks_of(path, language)):
        return f"is not the beginning of any ```{language} block of {path}"
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


def check(marker, language, code, prefix):
    for kind, checker in (("same as ", check_same_as), ("start of ", check_start_of)):
        if marker.startswith(kind):
            return checker(marker[len(kind):], language, code)
    if marker == "run":
        return check_run(language, code, prefix)
    return f"unknown marker '{marker}'"


def check_file(path, prefix):
    """Checks the marked blocks of one Markdown file: (blocks ok, failures)."""
    text = path.read_text()
    name = path.relative_to(ROOT)
    found = BLOCK.findall(text)
    failures = 0
    for marker, language, code in found:
        error = check(marker, language, code, prefix)
        print(f"check-readme: {name} ```{language} ({marker}): {'FAIL: ' + error if error else 'ok'}")
        failures += error is not None
    good = len(found) - failures
    unfollowed = len(MARKER.findall(text)) - len(found)
    if unfollowed:
        print(f"check-readme: {name}: FAIL: {unfollowed} snippet marker(s) not directly followed by a fenced block")
        failures += unfollowed
    return good, failures


def main():
    prefix = pathlib.Path(sys.argv[1]).resolve()
    ok, failures = {}, 0
    for group, paths in (("README.md", [ROOT / "README.md"]), ("docs/", sorted(ROOT.glob("docs/**/*.md")))):
        ok[group] = 0
        for path in paths:
            good, bad = check_file(path, prefix)
            ok[group] += good
            failures += bad
        if ok[group] == 0:
            print(f"check-readme: no checked snippet in {group}")
            failures += 1
    counts = ", ".join(f"{n} in {group}" for group, n in ok.items())
    print(f"check-readme: {sum(ok.values())} snippets ok ({counts}), {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
