#!/usr/bin/env python3
"""Every figure in README.md's "Figures" table is traceable: its row names the file(s) under bench/ it
came from, the commit it was measured at and the machine it ran on, and every number of its "measured"
cell appears in one of those files or in the documentation page the row links to (where the table that
computes it lives).

The table's columns: | what | measured | source | table |, with the source cell like
    `bench/cpu/zen4/torch_loss_bench.csv` at e7118b2, AMD EPYC (Zen 4)
A row fails when its source names no existing bench/ file, no commit of this repository (checked with
git when the clone has history), or no machine, or when a number of its figure is in none of its files.
`--self-test` breaks a copy of the table in each of those ways and fails unless every break is caught.
Usage: python3 scripts/check_figures.py [--readme README.md] [--self-test]
"""
import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MACHINES = re.compile(r"EPYC|Xeon|Ryzen|Core i\d|H100|H200|A100|GH200")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
# A number with a unit: 72.6 s, 0.94×, 6.2 MiB, 1.00–1.03×, 32 %; the unit-less ones are not figures.
NUMBER = re.compile(r"(\d+(?:\.\d+)?)(?:\s*[–-]\s*(\d+(?:\.\d+)?))?\s*(×|%|ms|s\b|MiB|GiB|GB|TB/s|GFLOP/s)")


def figures_table(text):
    """The rows (lists of cells) of the table under '## Figures'."""
    section = text.split("\n## Figures", 1)
    if len(section) < 2:
        return None, []
    body = section[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("|")]
    if len(rows) < 2:
        return None, []
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    return header, [[c.strip() for c in row.strip("|").split("|")] for row in rows[2:]]


def has_history():
    try:
        shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        return shallow == "false"
    except (OSError, subprocess.CalledProcessError):
        return False


def commit_exists(commit):
    return subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", commit + "^{commit}"],
                          capture_output=True).returncode == 0


def check_row(what, measured, source, table, history):
    problems = []
    paths = re.findall(r"`([^`]+)`", source)
    files = [p for p in paths if p.startswith("bench/")]
    if not files:
        problems.append("names no file under bench/ in its source cell")
    missing = [p for p in files if not (ROOT / p).is_file()]
    problems += ["names %s, which does not exist" % p for p in missing]
    commits = COMMIT.findall(re.sub(r"`[^`]+`", "", source))
    if not commits:
        problems.append("names no commit in its source cell")
    elif history:
        problems += ["names commit %s, which this repository does not have" % c
                     for c in commits if not commit_exists(c)]
    if not MACHINES.search(source):
        problems.append("names no machine (CPU or GPU model) in its source cell")
    texts = [(ROOT / p).read_text(errors="replace") for p in files if p not in missing]
    for link in re.findall(r"\]\(([^)#\s]+)", table):
        if (ROOT / link).is_file():
            texts.append((ROOT / link).read_text(errors="replace"))
    corpus = "\n".join(texts)
    for match in NUMBER.finditer(measured):
        for number in filter(None, match.group(1, 2)):
            if not re.search(r"(?<![\d.])" + re.escape(number) + r"(?![\d])", corpus):
                problems.append("figure %s: %s is in none of its files or its linked table"
                                % (match.group(0), number))
    return ["README.md Figures, row '%s': %s" % (what, p) for p in problems]


def check(text, history):
    header, rows = figures_table(text)
    if header is None:
        return ["README.md has no '## Figures' table"], 0
    if [h.lower() for h in header] != ["what", "measured", "source", "table"]:
        return ["README.md Figures: columns are %s, expected what | measured | source | table" % header], 0
    problems = []
    for row in rows:
        if len(row) != 4:
            problems.append("README.md Figures: a row of %d cells: %s" % (len(row), row))
            continue
        problems += check_row(*row, history)
    return problems, len(rows)


def self_test(text, history):
    """Each way of breaking the table must be reported."""
    header, rows = figures_table(text)
    first = "| " + " | ".join(rows[0]) + " |"
    what, measured, source, table = rows[0]
    number = NUMBER.search(measured).group(1)
    breaks = {
        "the source file removed": "| %s | %s | %s | %s |" % (what, measured, re.sub(r"`[^`]+`", "", source), table),
        "a file that does not exist": "| %s | %s | %s | %s |" % (what, measured, source.replace("`bench/", "`bench/no-such-"), table),
        "the commit removed": "| %s | %s | %s | %s |" % (what, measured, COMMIT.sub("", source), table),
        "the machine removed": "| %s | %s | %s | %s |" % (what, measured, MACHINES.sub("a machine", source), table),
        "a figure that is nowhere": "| %s | %s | %s | %s |" % (what, measured.replace(number, "987.65", 1), source, table),
    }
    if history:
        breaks["a commit this repository lacks"] = "| %s | %s | %s | %s |" % (
            what, measured, COMMIT.sub("0badc0de", source, count=1), table)
    missed = 0
    for name, row in breaks.items():
        problems, _ = check(text.replace(first, row, 1), history)
        caught = any(("row '%s'" % what) in p for p in problems)
        print("check-figures: self-test: %s: %s" % ("caught" if caught else "MISSED", name))
        missed += not caught
    return missed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    text = Path(args.readme).read_text()
    history = has_history()
    if args.self_test:
        missed = self_test(text, history)
        print("check-figures: self-test %s" % ("FAIL" if missed else "OK"))
        return 1 if missed else 0
    problems, count = check(text, history)
    for p in problems:
        print("check-figures: " + p)
    print("check-figures: %s: %d rows of README.md's Figures table%s" % (
        "FAIL" if problems else "OK", count, "" if history else " (no git history here: commits not resolved)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
