#!/usr/bin/env python3
"""compute-sanitizer over every GPU test, resumable across device calls.

    gpu_sanitize.py --build build-gpu [--tools memcheck,racecheck] [--budget 400]
                    [--sanitizer PATH] [--state FILE] [--log FILE] [--per-test 240]
    gpu_sanitize.py --self-test

The tests are CTest's own (`ctest -L gpu -E compute-sanitizer --show-only=json-v1`):
each test's command runs under `compute-sanitizer --tool T --error-exitcode 1
--target-processes all`, with the test's ENVIRONMENT and WORKING_DIRECTORY, so the
NCCL stand-in cases get their FLATMEM_NCCL_LIBRARY as they do under ctest. One line
per (tool, test) goes to the state file (tab-separated: tool, test, status,
seconds) as it finishes; a later call with the same state file runs only what is
not in it, so a suite longer than one device call (10 minutes) is finished by
the next call on a warm machine. Statuses: clean, ERRORS (n) (the sanitizer's
"ERROR SUMMARY"), FAILED (rc n), skipped (the test's skip code, 77: no GPU or
not enough of them), TIMEOUT.

Exit status: 1 when any (tool, test) has errors, failed or timed out; 2 when
none has but some are still to run (the budget ran out: call again); 0 when
every one ran clean or skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MIN_STEP = 10  # seconds: a test that would get less is left for the next call
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")


@dataclass
class Test:
    name: str
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    skip_code: int = 77


def tests_from_ctest_json(document: dict) -> tuple[list[Test], list[str]]:
    """The runnable tests of `ctest --show-only=json-v1` output, and the names of those
    without a command (their executable was not built)."""
    tests, unbuilt = [], []
    for entry in document.get("tests", []):
        if not entry.get("command"):
            unbuilt.append(entry["name"])
            continue
        props = {p["name"]: p["value"] for p in entry.get("properties", [])}
        env = dict(item.split("=", 1) for item in props.get("ENVIRONMENT", []) if "=" in item)
        tests.append(Test(entry["name"], list(entry["command"]), env, props.get("WORKING_DIRECTORY"),
                          int(props.get("SKIP_RETURN_CODE", 77))))
    return tests, unbuilt


def list_tests(build: str, label: str, exclude: str) -> list[Test]:
    listed = subprocess.run(["ctest", "--test-dir", build, "-L", label, "-E", exclude, "--show-only=json-v1"],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        raise SystemExit(f"gpu_sanitize: ctest could not list the tests of {build}: {(listed.stderr or listed.stdout).strip()}")
    tests, unbuilt = tests_from_ctest_json(json.loads(listed.stdout))
    if unbuilt:
        print(f"gpu_sanitize: {len(unbuilt)} listed test(s) not built, not run: {', '.join(unbuilt)}", flush=True)
    return tests


def read_state(path: Path) -> dict[tuple[str, str], str]:
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) >= 3:
                done[(parts[0], parts[1])] = parts[2]
    return done


def run_one(sanitizer: str, tool: str, test: Test, limit: float, log) -> tuple[str, float]:
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "1", "--target-processes", "all", *test.command]
    env = {**os.environ, **test.environment}
    start = time.monotonic()
    log.write(f"\n==> {tool} {test.name}: {' '.join(cmd)}\n")
    log.flush()
    # Its own process group, so that a timeout kills the sanitizer and the test it runs.
    proc = subprocess.Popen(cmd, env=env, cwd=test.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        log.write(out)
        return f"TIMEOUT ({limit:.0f} s)", time.monotonic() - start
    log.write(out)
    seconds = time.monotonic() - start
    errors = [int(n) for n in ERROR_SUMMARY.findall(out)]
    if any(errors):
        return f"ERRORS ({sum(errors)})", seconds
    if proc.returncode == test.skip_code:
        return "skipped", seconds
    if proc.returncode != 0:
        return f"FAILED (rc {proc.returncode})", seconds
    return "clean", seconds


def sanitize(tests: list[Test], tools: list[str], sanitizer: str, state: Path, log_path: Path, budget: float,
             per_test: float, min_step: float = MIN_STEP) -> int:
    done = read_state(state)
    start = time.monotonic()
    todo = [(tool, t) for tool in tools for t in tests if (tool, t.name) not in done]
    ran = 0
    with open(log_path, "a") as log, open(state, "a") as record:
        for tool, test in todo:
            left = budget - (time.monotonic() - start)
            if left < min_step:
                break
            status, seconds = run_one(sanitizer, tool, test, min(per_test, left), log)
            record.write(f"{tool}\t{test.name}\t{status}\t{seconds:.1f}\n")
            record.flush()
            done[(tool, test.name)] = status
            ran += 1
            print(f"{tool:10} {status:18} {seconds:7.1f} s  {test.name}", flush=True)
    every = [(tool, t.name) for tool in tools for t in tests]
    statuses = [done[k] for k in every if k in done]
    remaining = sum(1 for k in every if k not in done)
    bad = [s for s in statuses if s.split()[0] in ("ERRORS", "FAILED", "TIMEOUT")]
    counts = {}
    for s in statuses:
        counts[s.split()[0]] = counts.get(s.split()[0], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"gpu_sanitize: {len(every)} (tool, test) pairs; ran {ran} now; so far {summary or 'none'}; "
          f"{remaining} still to run{' (call again with the same --state)' if remaining else ''}")
    if bad:
        return 1
    return 2 if remaining else 0


# --- self-test: a fake sanitizer and a fake test list -------------------------------------------

FAKE_SANITIZER = """#!/bin/sh
# compute-sanitizer's options dropped, the program run as it is
while [ $# -gt 0 ]; do
  case $1 in --tool|--error-exitcode|--target-processes) shift 2 ;; *) break ;; esac
done
exec "$@"
"""


def self_test() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fake = root / "compute-sanitizer"
        fake.write_text(FAKE_SANITIZER)
        fake.chmod(0o755)
        (root / "cwd").mkdir()
        prop = lambda name, value: {"name": name, "value": value}
        document = {"tests": [
            {"name": "ok", "command": ["sh", "-c", "exit 0"], "properties": []},
            {"name": "skips", "command": ["sh", "-c", "exit 77"], "properties": [prop("SKIP_RETURN_CODE", 77)]},
            {"name": "errs", "command": ["sh", "-c", "echo '========= ERROR SUMMARY: 2 errors'; exit 1"]},
            {"name": "fails", "command": ["sh", "-c", "exit 3"]},
            {"name": "env-and-cwd", "command": ["sh", "-c", 'test "$FOO" = "a=b" && test "$(basename "$PWD")" = cwd'],
             "properties": [prop("ENVIRONMENT", ["FOO=a=b"]), prop("WORKING_DIRECTORY", str(root / "cwd"))]},
            {"name": "not-built", "properties": []},
            {"name": "slow", "command": ["sh", "-c", "sleep 30"]},
        ]}
        tests, unbuilt = tests_from_ctest_json(document)
        assert [t.name for t in tests] == ["ok", "skips", "errs", "fails", "env-and-cwd", "slow"], tests
        assert unbuilt == ["not-built"], unbuilt
        state, log = root / "state.tsv", root / "log.txt"
        rc = sanitize(tests[:5], ["memcheck", "racecheck"], str(fake), state, log, 600, 60, min_step=1)
        got = read_state(state)
        want = {"ok": "clean", "skips": "skipped", "errs": "ERRORS (2)", "fails": "FAILED (rc 3)",
                "env-and-cwd": "clean"}
        for tool in ("memcheck", "racecheck"):
            for name, status in want.items():
                assert got[(tool, name)] == status, (tool, name, got.get((tool, name)))
        assert rc == 1, rc
        # Resumed: nothing of the first five runs again; 'slow' runs and is killed at the per-test limit.
        lines = len(state.read_text().splitlines())
        begun = time.monotonic()
        rc = sanitize(tests, ["memcheck"], str(fake), state, log, 600, 2, min_step=1)
        assert rc == 1 and time.monotonic() - begun < 20, rc
        got = read_state(state)
        assert got[("memcheck", "slow")].startswith("TIMEOUT"), got[("memcheck", "slow")]
        assert len(state.read_text().splitlines()) == lines + 1
        # A budget under the smallest step runs nothing and says what is left (exit 2 when nothing failed).
        fresh = root / "fresh.tsv"
        assert sanitize(tests[:1], ["memcheck"], str(fake), fresh, log, 0.5, 60, min_step=1) == 2
        assert not read_state(fresh)
        assert sanitize(tests[:2], ["memcheck"], str(fake), fresh, log, 600, 60, min_step=1) == 0
        assert "ERROR SUMMARY: 2 errors" in log.read_text()
    print("gpu_sanitize self-test: ok")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-gpu")
    ap.add_argument("--tools", default="memcheck,racecheck")
    ap.add_argument("--label", default="gpu")
    ap.add_argument("--exclude", default="compute-sanitizer", help="ctest -E: tests not to wrap")
    ap.add_argument("--sanitizer", default=shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer")
    ap.add_argument("--state", help="default: BUILD/sanitize-state.tsv")
    ap.add_argument("--log", default="sanitizer.log")
    ap.add_argument("--budget", type=float, default=400, help="seconds for this call")
    ap.add_argument("--per-test", type=float, default=240, help="seconds one (tool, test) may take")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    tests = list_tests(args.build, args.label, args.exclude)
    if not tests:
        print(f"gpu_sanitize: no test labelled {args.label} in {args.build}", file=sys.stderr)
        return 1
    state = Path(args.state or Path(args.build) / "sanitize-state.tsv")
    return sanitize(tests, args.tools.split(","), args.sanitizer, state, Path(args.log), args.budget, args.per_test)


if __name__ == "__main__":
    sys.exit(main())
