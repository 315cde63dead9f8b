"""What bench/torch_loss_bench.py and bench/torch_ring_bench.py share: contrastive_bench's features
(any row range), peak-memory readings from /proc/self/status, open_clip's loss module without the
rest of open_clip, spawning a child with its own peak RSS, and table / CSV formatting.

Nothing heavy is imported at module level: the drivers import this module too and must stay small
(a child forked from a large driver would start with the driver's resident set in its ru_maxrss).
"""
from __future__ import annotations

import csv
import importlib.util
import math
import os
import socket
import subprocess
import tempfile
from typing import Iterable, Optional, Sequence

from bench_report import cpu_model, load_average, machine_ram, seconds, size  # noqa: F401 (re-exported)

MiB, GiB = 1024.0**2, 1024.0**3
SEED = 1        # contrastive_bench's features (bench_support.hpp, VariantConfig::seed)
SCALE = 14.3    # contrastive_bench's default logit scale s
BIAS = -10.0    # contrastive_bench's default sigmoid logit bias t (SigLIP's initial value)


# ---------------------------------------------------------------------------
# Features: bench::make_features (bench/bench_support.hpp) in NumPy, any rows
# ---------------------------------------------------------------------------


def make_features(b: int, d: int, seed: int = SEED, rows: Optional[tuple[int, int]] = None, chunk: int = 128):
    """Rows [r0, r1) (default: all b) of contrastive_bench's features: q_i uniform on the unit
    sphere, k_i = normalize(q_i + noise), float32, the same bits as bench::make_features (and as
    bench/jax_peer_bench.py's make_features, whose arithmetic this is; every row depends only on
    its index, so a rank can build its own shard of the global batch alone). Built in row chunks so
    that the float64 intermediates stay small."""
    import numpy as np

    r0, r1 = rows if rows is not None else (0, b)
    u64 = np.uint64
    golden, mix1, mix2 = u64(0x9E3779B97F4A7C15), u64(0xBF58476D1CE4E5B9), u64(0x94D049BB133111EB)
    row_mix = u64(0xD1B54A32D192ED03)
    n = r1 - r0
    q = np.empty((n, d), np.float32)
    k = np.empty((n, d), np.float32)
    steps = np.arange(1, 4 * d + 1, dtype=u64) * golden  # uniform n of a row: state0 + (n+1) G
    with np.errstate(over="ignore"):
        for c0 in range(r0, r1, chunk):
            idx = np.arange(c0, min(r1, c0 + chunk), dtype=u64)
            z = ((u64(seed) << u64(40)) ^ (idx * row_mix))[:, None] + steps[None, :]
            z = (z ^ (z >> u64(30))) * mix1
            z = (z ^ (z >> u64(27))) * mix2
            z ^= z >> u64(31)
            u = ((z >> u64(11)).astype(np.float64) + 0.5) / 9007199254740992.0
            u = u.reshape(len(idx), d, 2, 2)  # per element: (q: log, cos), (noise: log, cos)
            normal = (np.sqrt(-2.0 * np.log(u[..., 0])) * np.cos(6.283185307179586 * u[..., 1]))
            normal = normal.astype(np.float32)
            qc, kc = normal[:, :, 0], normal[:, :, 0] + normal[:, :, 1]
            at = slice(c0 - r0, c0 - r0 + len(idx))
            for src, dst in ((qc, q), (kc, k)):
                norm = np.sqrt(np.cumsum(src.astype(np.float64) ** 2, axis=1)[:, -1:])
                dst[at] = (src / norm).astype(np.float32)
    return q, k


# ---------------------------------------------------------------------------
# Memory of this process
# ---------------------------------------------------------------------------


def status_bytes(field: str) -> float:
    """A /proc/self/status field in bytes (VmHWM: peak resident set; VmRSS: current)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return 1024.0 * float(line.split()[1])
    return math.nan


def reset_peak() -> bool:
    """Resets VmHWM to the current resident set (Linux >= 4.0: '5' into /proc/self/clear_refs), so
    that the next VmHWM reading is the peak of what runs after this call. False where that is not
    allowed (the peak then includes everything before)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMeter:
    """Peak memory of this process: `inputs()` once the inputs exist (resets the high-water mark
    there), `report()` at the end: the process's peak RSS, the RSS with the inputs and what the
    work added beyond it."""

    def __init__(self):
        self.before = math.nan
        self.base = math.nan
        self.reset = False

    def inputs(self):
        import gc

        gc.collect()
        self.before = status_bytes("VmHWM")  # imports, feature generation, ...
        self.reset = reset_peak()
        self.base = status_bytes("VmRSS") if self.reset else status_bytes("VmHWM")

    def report(self) -> dict:
        after = status_bytes("VmHWM")
        return {"peak_rss_bytes": max(after, self.before), "inputs_rss_bytes": self.base,
                "extra_bytes": after - self.base, "hwm_reset": int(self.reset)}


# ---------------------------------------------------------------------------
# open_clip's loss module, alone
# ---------------------------------------------------------------------------


def open_clip_loss_module():
    """open_clip/loss.py of the installed open_clip (open-clip-torch), loaded by itself: the
    package's __init__ imports its models, tokenizers and transformers (about 250 MB of resident
    set here) that its ClipLoss / SigLipLoss never use and that would only inflate open_clip's peak
    memory. The module is the same code the package exports as open_clip.loss."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("open_clip (pip install open-clip-torch) is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "loss.py")
    loss_spec = importlib.util.spec_from_file_location("_open_clip_loss", path)
    module = importlib.util.module_from_spec(loss_spec)
    loss_spec.loader.exec_module(module)
    return module


def open_clip_version() -> str:
    from importlib import metadata

    for dist in ("open_clip_torch", "open-clip-torch"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "?"


# ---------------------------------------------------------------------------
# Children
# ---------------------------------------------------------------------------


def spawn(argv: Sequence[str], env=None, timeout: Optional[float] = None, echo: bool = False):
    """Runs argv with stdout+stderr captured (echoed as it comes with echo=True); returns (exit
    status, output, ru_maxrss of the child in bytes -- its own peak: the driver is small)."""
    import selectors
    import sys
    import time

    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, close_fds=True)
        start = time.monotonic()
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        killed = False
        while True:
            if timeout is not None and not killed and time.monotonic() - start > timeout:
                proc.kill()
                killed = True
            if not sel.select(timeout=1.0):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            log.write(chunk)
            if echo:
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
        sel.close()
        proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait
        log.seek(0)
        output = log.read().decode(errors="replace")
    if killed:
        output += f"\n(killed after {timeout:.0f} s)"
    return proc.returncode, output, 1024.0 * usage.ru_maxrss


RESULT = "RESULT "  # a child's last word: RESULT {json}


def result_of(output: str) -> Optional[dict]:
    import json

    for line in reversed(output.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return None


def tail(output: str, lines: int = 4) -> str:
    kept = [x.strip() for x in output.strip().splitlines() if x.strip() and not x.startswith(RESULT)]
    return " | ".join(kept[-lines:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(script: str, ranks: int, args: Sequence[str], *, threads: int, timeout: Optional[float],
             echo: bool = False, note_lines=("error",)) -> dict:
    """`script --result PATH args...` on `ranks` processes under torchrun (python -m
    torch.distributed.run, c10d rendezvous on 127.0.0.1 at a free port; OMP_NUM_THREADS=threads,
    bench/ on PYTHONPATH, FLATMEM_COMM_TIMEOUT_MS=600000 unless set, no FLATMEM_COORDINATOR).
    Rank 0 writes its JSON result to PATH. Returns {"status": "ok", "wall_s": ..., **result}, or
    status "failed" with a note: the last three output lines holding any of `note_lines`."""
    import json
    import sys
    import time

    port = free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--master-addr", "127.0.0.1",
                "--master-port", str(port), os.path.abspath(script), *args, "--result", result_path]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads),
                   PYTHONPATH=os.pathsep.join([here] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        env.setdefault("FLATMEM_COMM_TIMEOUT_MS", "600000")
        env.pop("FLATMEM_COORDINATOR", None)
        started = time.monotonic()
        rc, output, _ = spawn(argv, env=env, timeout=timeout, echo=echo)
        row = {"status": "ok", "wall_s": time.monotonic() - started}
        result = None
        if os.path.exists(result_path):
            with open(result_path) as f:
                result = json.load(f)
    if rc != 0 or result is None:
        lines = [x for x in output.splitlines() if any(k in x.lower() for k in note_lines)]
        row.update(status="failed", note=" | ".join(lines[-3:]) or tail(output) or f"exit status {rc}")
        return row
    row.update(result)
    return row


# ---------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------


def number(v) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan






def div(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


def ratio(r: float, digits: int = 3) -> str:
    return f"{r:.{digits}f}x" if math.isfinite(r) else "-"


def verdict(value: float, limit: float) -> str:
    return "not measured" if not math.isfinite(value) else "MET" if value <= limit else "MISSED"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: Optional[str] = None) -> str:
    """A Markdown table; align: one 'l' / 'r' per column (default: first left, others right)."""
    rows = [list(map(str, r)) for r in rows]
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(path: str, fields: Sequence[str], rows: Iterable[dict]):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()})


# ---------------------------------------------------------------------------
# A busy torch intra-op pool beside the measured call
# ---------------------------------------------------------------------------

BUSY_SIZE = 512  # the neighbour's fp32 matmuls: n x n by n x n, 2 n^3 FLOPs each


class TorchPoolBusy:
    """torch's intra-op pool kept busy beside the measured work, as a data loader's transforms or
    another op on a side stream keep it: a thread of this process multiplies 512 x 512 fp32
    matrices back to back (torch.mm: torch.get_num_threads() OpenMP threads) until stopped.
    ``with TorchPoolBusy() as load: ...`` then ``load.gflops``: the neighbour's own rate over the
    span (the same load must run beside each implementation compared)."""

    def __init__(self):
        import threading

        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.products = 0
        self.seconds = math.nan

    def _run(self):
        import time

        import torch

        a, b = torch.randn(BUSY_SIZE, BUSY_SIZE), torch.randn(BUSY_SIZE, BUSY_SIZE)
        started = time.perf_counter()
        while not self.stop.is_set():
            torch.mm(a, b)
            self.products += 1
        self.seconds = time.perf_counter() - started

    def __enter__(self):
        import time

        self.thread.start()
        time.sleep(0.2)  # the pool spun up before the measured call starts
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    @property
    def gflops(self) -> float:
        return 2.0 * BUSY_SIZE**3 * self.products / self.seconds / 1e9 if self.seconds > 0 else math.nan


def busy_main(threads: int):
    """A process whose only work is TorchPoolBusy at `threads` torch threads, until SIGTERM; prints
    RESULT {"gflops": ...} on the way out (the neighbour of a benchmark that has no torch)."""
    import json
    import signal
    import sys

    import torch

    torch.set_num_threads(threads)
    done = []
    signal.signal(signal.SIGTERM, lambda *_: done.append(1))
    with TorchPoolBusy() as load:
        print("busy: running", flush=True)
        while not done:
            signal.pause()
    print(RESULT + json.dumps({"gflops": load.gflops}), flush=True)
    sys.exit(0)


class BusyProcess:
    """``with BusyProcess(threads) as load:`` a busy_main process beside the block; load.gflops after."""

    def __init__(self, threads: int):
        self.threads = threads
        self.gflops = math.nan

    def __enter__(self):
        import sys

        here = os.path.dirname(os.path.abspath(__file__))
        code = f"import sys; sys.path.insert(0, {here!r}); import torch_bench_support as s; s.busy_main({self.threads})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True)
        first = self.proc.stdout.readline()
        if "busy: running" not in first:
            raise RuntimeError(f"the busy neighbour did not start: {first.strip()}")
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        output, _ = self.proc.communicate(timeout=60)
        result = result_of(output) or {}
        self.gflops = result.get("gflops", math.nan)

