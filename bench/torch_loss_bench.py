#!/usr/bin/env python3
"""torch_loss_bench -- flatmem.torch's loss modules beside open_clip's, and beside flatmem's C API.

What is compared, side by side in one run (CPU, fp32, d = 512, forward + backward: loss.backward()
on the leaves q, k, logit_scale -- and logit_bias for the sigmoid loss):

  --loss clip     open_clip ClipLoss()        the materialised b x b logits (both directions)
                  flatmem.torch ClipLoss()    the tiled loss: same constructor and forward signature
                  flatmem C                   contrastive_bench --variants flatmem: the same
                                              forward + backward through the C API, no Python
  --loss sigmoid  open_clip SigLipLoss()      the materialised b x b logits, labels and log-sigmoid
                  flatmem.torch SigLipLoss()  the tiled loss (value and gradients in one pass)
                  flatmem C                   contrastive_bench --loss sigmoid --variants sigmoid
                                              (flatmem_contrastive_sigmoid_value_and_grad)
  --loss all      both

each once per --dtypes entry (default fp32,bf16). A bf16 row is what a bf16 training run calls: q, k
torch.bfloat16 leaves (contrastive_bench's fp32 features rounded to nearest even, as .to(torch.bfloat16)
does), logit_scale (and logit_bias) fp32 0-dim tensors; open_clip's losses then form their logits,
log-softmax / log-sigmoid and loss in bf16 (the 0-dim fp32 scale does not promote the bf16 matrix),
flatmem.torch's accumulate in fp32. flatmem C: contrastive_bench --dtypes bf16 (bf16 q, k, dq, dk).
Beside every time, "err" is the loss's relative error |L - L64| / |L64| against the float64 loss of
the very inputs of that row (bf16: of the rounded values): contrastive_bench --worker reference (or
sigmoid-reference) --dtype D, computed once per (loss, b, dtype) in a process of its own (dgemm in
column strips, the loss in double, no b x b matrix; --ref-max-batch, default 65536: n/a above).

at b = 4096, 16384, 65536 (--sizes). Every (implementation, b, dtype) runs in its own process, so its peak
memory is its own: a torch child of this script (torch.set_num_threads(2), --threads) or
contrastive_bench's own driver (which forks a worker per variant and reads its peak from wait4).
All of them see the same unit-norm features, bit for bit: contrastive_bench's (seed 1, rebuilt in
NumPy by torch_bench_support.make_features), at its logit scale s = 14.3 and, for the sigmoid loss,
bias t = -10; the loss values printed below the tables must agree.

Time: the best of --reps forward + backward calls (default 3; --large-reps, default 1, above
b = 16384) after one untimed warm-up call (at b, or on the first 16384 rows when b is larger);
the gradients of the previous call are dropped first (x.grad = None). contrastive_bench times its
worker the same way (--min-time 1e9 --max-reps R: R timed runs, the fastest reported; its first
run is an untimed warm-up when it is shorter than 2 s).

Memory: peak RSS is the child's VmHWM (/proc/self/status, read inside the child: its own, whatever
the driver holds; ru_maxrss from wait4 is in the CSV as a cross-check), the whole process: ~0.6 GB
of it is torch's own libraries in both torch children (open_clip's loss.py is loaded alone, without
open_clip's models and tokenizers: torch_bench_support.open_clip_loss_module). Before the inputs,
each torch child makes one tiny call (b = 8) of its loss, forward and backward: what a process pays
once, whatever b, is reported as "first call" (flatmem.torch: its handle and thread pool, ~10 MB).
"Beyond the inputs" is then the peak after the
inputs exist minus the resident set at that moment (VmHWM is reset there through
/proc/self/clear_refs): the loss's buffers, autograd's saved tensors and the gradients q.grad,
k.grad (2 b d fp32), i.e. what the loss needs at this b. For flatmem C, contrastive_bench's own
definition: its peak minus that of a process holding q, k, dq and dk. open_clip runs only where its
b x b buffers fit: its need is estimated beforehand (4.5 b^2 fp32 for ClipLoss, 5.5 b^2 for
SigLipLoss, from its growth measured between b = 4096 and 8192) and the run is skipped, with the
reason printed, above --mem-limit-gib (20): at b = 65536 (~72 and ~88 GiB).

Targets, printed MET / MISSED: at b = 16384, flatmem.torch <= 0.4x open_clip's time, <= 1/8 of
its peak RSS (whole process; the ratio beyond the inputs is printed beside it) and <= 1.05x the C
benchmark's time; at b = 65536, flatmem.torch under 1 GiB beyond the inputs (fp32 rows). bf16 (issue
32, 40), on a CPU with AVX512_BF16 (flatmem's ISA in use avx512bf16 or amx; else "not measured: CPU
lacks AVX512_BF16"), the CLIP loss at b = 16384: flatmem.torch bf16 <= 0.5x open_clip's bf16 time, >= 1.7x
flatmem.torch fp32's speed, its loss fp32-accurate (error vs float64 <= max(4x the fp32 row's, 2^-20)).

    build/wheel-venv/bin/python bench/torch_loss_bench.py --loss all     # the full run
    build/wheel-venv/bin/python bench/torch_loss_bench.py --quick        # b = 512, 1024: a smoke run
    build/wheel-venv/bin/python bench/torch_loss_bench.py --loss clip --dtypes bf16 --sizes 16384
    build/wheel-venv/bin/python bench/torch_loss_bench.py --loss clip --sizes 4096 --reps 2 --csv /tmp/x.csv
    /usr/bin/python3 bench/plot_torch_losses.py                       # bench/torch_losses.png

The full run (--loss all: b = 4096, 16384, 65536, both losses) takes about 25 minutes on this
machine's 2 cores (AMD EPYC, AVX2): ~1.5 minutes for b = 4096 (measured), ~10 for 16384 (open_clip
~55 s a call for ClipLoss, ~37 s for SigLipLoss, 4 calls each; flatmem ~11-13 s), ~13 for 65536
(flatmem.torch and C only, ~3 minutes a call; open_clip's ~70 GiB skipped). Estimated from
b = 4096 .. 16384 on a machine shared with other work and the b^2 d growth of the work. It
writes bench/torch_loss_bench.csv (--csv; --quick writes to the temporary directory unless --csv is
given); plot_torch_losses.py draws it.

Needs a Python with torch, open-clip-torch, numpy and flatmem (with flatmem.torch) installed, and
contrastive_bench (--contrastive-bench; default build/bench/contrastive_bench) built against the
same libflatmem (Release).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import torch_bench_support as sup  # noqa: E402  (stdlib only at import)
from torch_bench_support import GiB, div, ratio, seconds, size, verdict  # noqa: E402

IMPLS = ("open_clip", "flatmem.torch", "flatmem C")
LOSS_TITLES = {"clip": "Symmetric CLIP loss (ClipLoss), forward + backward",
               "sigmoid": "Sigmoid loss (SigLipLoss, with logit_bias), forward + backward"}
TARGET_BATCH = 16384
TARGET_TIME = 0.4            # flatmem.torch <= 0.4x open_clip's time at b = 16384 ...
TARGET_MEMORY = 1.0 / 8.0    # ... with <= 1/8 of its peak memory
TARGET_VS_C = 1.05           # ... and <= 1.05x the C benchmark's time
MEMORY_BATCH = 65536
MEMORY_LIMIT = 1.0 * GiB     # flatmem.torch beyond the inputs at b = 65536
LARGE = 16384                # above this, --large-reps and a warm-up on the first LARGE rows
# open_clip's buffers beyond the inputs, in b^2 fp32 (4 b^2 bytes): the growth of its measured peak
# from b = 4096 to 8192 was 4.3 (ClipLoss: two b x b logits, their log-softmax outputs, gradients)
# and 5.1 (SigLipLoss: logits, labels built from -ones and 2 eye, labels * logits, log-sigmoid's
# output and buffer), rounded up
OPEN_CLIP_B2 = {"clip": 4.5, "sigmoid": 5.5}
C_VARIANT = {"clip": "flatmem", "sigmoid": "sigmoid"}
REFERENCE = {"clip": "reference", "sigmoid": "sigmoid-reference"}  # contrastive_bench's float64 workers
DTYPES = ("fp32", "bf16")
ELEMENT_BYTES = {"fp32": 4, "bf16": 2}
# bf16 (issues 32, 40), CLIP loss at b = 16384 under avx512bf16 or amx: flatmem.torch bf16 <= 0.5x open_clip's bf16
# time and >= 1.7x flatmem.torch fp32's speed, with an fp32-accurate loss (as contrastive_bench's)
TARGET_BF16_VS_OPEN_CLIP = 0.5
TARGET_BF16_SPEEDUP = 1.7
BF16_ERROR_FACTOR, BF16_ERROR_FLOOR = 4.0, 2.0**-20


def default_contrastive_bench() -> str:
    return os.path.join(ROOT, "build", "bench", "contrastive_bench")


# ---------------------------------------------------------------------------
# Child: one (implementation, loss, b) in this process
# ---------------------------------------------------------------------------


def library_path(name: str = "libflatmem") -> str:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if name in line:
                    return line.split()[-1]
    except OSError:
        pass
    return ""


def anchor_worker(o) -> dict:
    """torch's own matmul rate here, the machine's physical anchor: (b x d) @ (d x b) at b = 4096 and
    the run's d, fp32 and bf16, best of 5 after a warm-up; and the engine flatmem runs."""
    import torch

    import flatmem

    torch.set_num_threads(o.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "engine": flatmem.cpu_engine()}
    n = 4096
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, o.dim, dtype=dtype), torch.randn(o.dim, n, dtype=dtype)
        torch.matmul(a, b)
        best = min(_timed(lambda: torch.matmul(a, b)) for _ in range(5))
        out[f"matmul_{name}_gflops"] = 2.0 * n * n * o.dim / best / 1e9
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def worker(o) -> dict:
    import torch

    if o.worker == "anchor":
        return anchor_worker(o)
    torch.set_num_threads(o.threads)
    info = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if o.worker == "open_clip":
        loss_module = sup.open_clip_loss_module()
        info["open_clip"] = sup.open_clip_version()
        criterion = loss_module.ClipLoss() if o.loss == "clip" else loss_module.SigLipLoss()
    elif o.worker == "flatmem.torch":
        import flatmem
        import flatmem.torch as fmt

        criterion = fmt.ClipLoss() if o.loss == "clip" else fmt.SigLipLoss()
        info.update(flatmem=flatmem.library_version(), isa=flatmem.cpu_isa()[0], library=library_path())
    else:
        raise SystemExit(f"torch_loss_bench: no worker {o.worker!r}")

    b, d = o.batch, o.dim
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[o.dtype]

    def leaf(x):  # the fp32 features, rounded to nearest even for bf16 (a model's bf16 output)
        return torch.from_numpy(x).to(dtype).requires_grad_()

    # One tiny call first: what a process pays once, whatever b (flatmem creates its handle and
    # thread pool; open_clip's first call sets torch's kernels up), measured
    # here and kept out of "beyond the inputs", which is then what the loss at this b needs.
    before = sup.status_bytes("VmRSS")
    tiny = [leaf(x) for x in sup.make_features(8, d)]
    tiny_st = (torch.tensor(o.scale, requires_grad=True), torch.tensor(o.bias, requires_grad=True))
    (criterion(*tiny, *tiny_st) if o.loss == "sigmoid" else criterion(*tiny, tiny_st[0])).backward()
    info["first_call_bytes"] = sup.status_bytes("VmRSS") - before
    info["modules"] = len(sys.modules)
    del tiny, tiny_st
    q_np, k_np = sup.make_features(b, d)
    q, k = leaf(q_np), leaf(k_np)
    del q_np, k_np
    s = torch.tensor(o.scale, dtype=torch.float32, requires_grad=True)
    t = torch.tensor(o.bias, dtype=torch.float32, requires_grad=True)
    leaves = (q, k, s, t) if o.loss == "sigmoid" else (q, k, s)
    meter = sup.PeakMeter()
    meter.inputs()

    def call(qq, kk):
        for x in leaves:
            x.grad = None
        t0 = time.perf_counter()
        loss = criterion(qq, kk, s, t) if o.loss == "sigmoid" else criterion(qq, kk, s)
        loss.backward()
        return time.perf_counter() - t0, loss

    warm_rows = b if b <= LARGE or o.full_warmup else LARGE
    if warm_rows < b:  # leaves' prefixes: the same code paths, a fraction of the time
        warmup, loss = call(q[:warm_rows], k[:warm_rows])
    else:
        warmup, loss = call(q, k)
    del loss
    times = []
    reps = o.reps if b <= LARGE else o.large_reps
    with sup.TorchPoolBusy() if o.busy else contextlib.nullcontext() as load:
        for _ in range(max(1, reps)):
            elapsed, loss = call(q, k)
            times.append(elapsed)
            value = float(loss.detach())
            info["loss_dtype"] = str(loss.dtype).replace("torch.", "")
            del loss
    if load is not None:
        info["busy_gflops"] = load.gflops
    result = {"best_s": min(times), "median_s": statistics.median(times), "reps": len(times),
              "warmup_s": warmup, "warmup_rows": warm_rows, "times": times, "loss_value": value,
              "dscale": float(s.grad), "dq_norm": float(q.grad.norm())}
    if o.loss == "sigmoid":
        result["dbias"] = float(t.grad)
    result.update(meter.report())
    result.update(info)
    return result


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def planned_bytes(impl: str, loss: str, b: int, d: int) -> float:
    """What a run needs beyond its inputs, known before it runs (open_clip's b x b buffers)."""
    if impl == "open_clip":
        return OPEN_CLIP_B2[loss] * 4.0 * b * b + 3 * 4.0 * b * d
    return 4.0 * 4.0 * b * d


def run_torch(o, impl: str, loss: str, b: int, dtype: str = "fp32") -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", impl, "--loss", loss, "--batch", str(b),
            "--dtype", dtype, "--dim", str(o.dim), "--reps", str(o.reps), "--large-reps", str(o.large_reps),
            "--threads", str(o.threads), "--scale", repr(o.scale), "--bias", repr(o.bias)]
    if o.full_warmup:
        argv.append("--full-warmup")
    if getattr(o, "busy", False):
        argv.append("--busy")
    started = time.monotonic()
    rc, output, maxrss = sup.spawn(argv, timeout=o.timeout)
    row = {"status": "ok", "wall_s": time.monotonic() - started, "wait4_maxrss_bytes": maxrss}
    result = sup.result_of(output)
    if rc != 0 or result is None:
        row.update(status="failed", note=sup.tail(output) or f"exit status {rc}")
        return row
    row.update(result)
    return row


def run_reference(o, loss: str, b: int, dtype: str) -> dict:
    """The float64 loss of the features of (b, dtype) (bf16: the rounded values): contrastive_bench's
    reference worker, the same features bit for bit (seed 1, round to nearest even)."""
    binary = o.contrastive_bench
    if o.ref_max_batch <= 0 or b > o.ref_max_batch:
        return {"status": "skipped", "note": f"n/a (b > --ref-max-batch {o.ref_max_batch})"}
    if not os.access(binary, os.X_OK):
        return {"status": "failed", "note": f"no executable {binary} (build it, or --contrastive-bench)"}
    argv = [binary, "--worker", REFERENCE[loss], "--batch", str(b), "--dim", str(o.dim), "--dtype", dtype,
            "--scale", repr(o.scale), "--bias", repr(o.bias)]
    rc, output, _ = sup.spawn(argv, timeout=o.timeout)
    values = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    if rc != 0 or "loss" not in values:
        return {"status": "failed", "note": values.get("error") or sup.tail(output) or f"exit status {rc}"}
    return {"status": "ok", "loss_value": sup.number(values["loss"]), "best_s": sup.number(values.get("ref_s"))}


def run_c(o, loss: str, b: int, isa: str, dtype: str = "fp32") -> dict:
    """contrastive_bench's own driver for the flatmem variant at this b (plus its inputs-only
    process, for its extra memory), read back from its CSV."""
    binary = o.contrastive_bench
    if not os.access(binary, os.X_OK):
        return {"status": "failed", "note": f"no executable {binary} (build it, or --contrastive-bench)"}
    reps = o.reps if b <= LARGE else o.large_reps
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "c.csv")
        argv = [binary, "--loss", loss, "--sizes", str(b), "--dim", str(o.dim), "--variants", C_VARIANT[loss],
                "--rounds", "1", "--large-rounds", "1", "--min-time", "1e9", "--max-reps", str(max(1, reps)),
                "--scale", repr(o.scale), "--bias", repr(o.bias), "--dtypes", dtype, "--ref-max-batch", "0",
                "--csv", path]
        if isa:
            argv += ["--isas", isa]
        started = time.monotonic()
        with sup.BusyProcess(o.threads) if getattr(o, "busy", False) else contextlib.nullcontext() as load:
            rc, output, _ = sup.spawn(argv, timeout=o.timeout)
        row = {"status": "ok", "wall_s": time.monotonic() - started}
        if load is not None:
            row["busy_gflops"] = load.gflops
        rows = []
        if os.path.exists(path):
            import csv

            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
    mine = [r for r in rows if r.get("variant") == C_VARIANT[loss] and r.get("dtype", "fp32") == dtype]
    if rc != 0 or not mine or mine[0].get("status") != "ok":
        note = (mine[0].get("note") if mine else "") or sup.tail(output) or f"exit status {rc}"
        row.update(status="failed", note=note)
        return row
    r = mine[0]
    inputs = next((x for x in rows if x.get("variant") == "inputs" and x.get("dtype", "fp32") == dtype), {})
    row.update(best_s=sup.number(r.get("total_s")), median_s=sup.number(r.get("median_total_s")),
               reps=int(sup.number(r.get("reps"))) if math.isfinite(sup.number(r.get("reps"))) else "",
               loss_value=sup.number(r.get("loss")), peak_rss_bytes=sup.number(r.get("peak_rss_bytes")),
               extra_bytes=sup.number(r.get("extra_bytes")),
               inputs_rss_bytes=sup.number(inputs.get("peak_rss_bytes")), isa=r.get("isa", ""),
               wait4_maxrss_bytes=sup.number(r.get("peak_rss_bytes")))
    return row


def progress(row: dict):
    impl = row["impl"] + ("" if row.get("dtype", "fp32") == "fp32" else f" [{row['dtype']}]")
    if row["status"] != "ok":
        print(f"  {impl:<21} {row['status']}: {row.get('note', '')}", flush=True)
        return
    if row["impl"] == "float64":
        print(f"  {impl:<21} loss {row['loss_value']:.15g} (contrastive_bench --worker reference, "
              f"{seconds(row.get('best_s', math.nan))})", flush=True)
        return
    reps = row.get("reps", "")
    print(f"  {impl:<21} best {seconds(row.get('best_s', math.nan)):>10} ({reps} runs)   "
          f"peak RSS {size(row.get('peak_rss_bytes', math.nan)):>10}   beyond inputs "
          f"{size(row.get('extra_bytes', math.nan)):>10}   loss {row.get('loss_value', math.nan):.9g}   "
          f"err {error_cell(row)}   [{seconds(row.get('wall_s', math.nan))} wall]", flush=True)


def find(rows, loss, b, impl, dtype="fp32"):
    return next((r for r in rows if r["loss"] == loss and r["batch"] == b and r["impl"] == impl
                 and r.get("dtype", "fp32") == dtype), None)


def value(r, key) -> float:
    return sup.number(r.get(key)) if r is not None and r["status"] == "ok" else math.nan


def error_cell(r) -> str:
    """|L - L64| / |L64| of a row (set by the driver), "n/a" without a float64 reference."""
    if r is None or r["status"] != "ok":
        return "-"
    e = sup.number(r.get("loss_rel_err"))
    return f"{e:.1e}" if math.isfinite(e) else "n/a"


def cell_time(r) -> str:
    if r is None:
        return "-"
    return seconds(value(r, "best_s")) if r["status"] == "ok" else ("skipped" if r["status"] == "skipped" else "failed")


def cell_mem(r, key) -> str:
    if r is None:
        return "-"
    if r["status"] == "skipped":
        return f"(needs ~{size(r.get('planned_extra_bytes', math.nan))})"
    return size(value(r, key)) if r["status"] == "ok" else "failed"


def print_tables(rows, o, losses):
    for loss in losses:
        sizes = sorted({r["batch"] for r in rows if r["loss"] == loss})
        if not sizes:
            continue
        print(f"\n### {LOSS_TITLES[loss]}, {', '.join(o.dtypes)}, d = {o.dim}, CPU ({o.threads} threads)\n")
        body = []
        for b in sizes:
            for dt in o.dtypes:
                oc, fm, c = (find(rows, loss, b, i, dt) for i in IMPLS)
                fm32 = find(rows, loss, b, "flatmem.torch")
                body.append([str(b), dt, cell_time(oc), error_cell(oc), cell_time(fm), error_cell(fm), cell_time(c),
                             error_cell(c), ratio(div(value(fm, "best_s"), value(oc, "best_s"))),
                             ratio(div(value(fm, "best_s"), value(c, "best_s"))),
                             "-" if dt == "fp32" else ratio(div(value(fm, "best_s"), value(fm32, "best_s")))])
        print(sup.table(["b", "dtype", "open_clip", "err", "flatmem.torch", "err", "flatmem C", "err",
                         "flatmem.torch / open_clip", "flatmem.torch / C", "flatmem.torch / its fp32"], body,
                        align="ll" + "r" * 9))
        print("\nTimes: fastest forward + backward call. dtype: of q, k (bf16: the fp32 features rounded to nearest "
              "even; open_clip then computes in bf16, flatmem accumulates in fp32). err: |L - L64| / |L64|, L64 the "
              "float64 loss of the same (rounded) inputs (n/a: b > --ref-max-batch).\n")
        body = []
        for b in sizes:
            for dt in o.dtypes:
                oc, fm, c = (find(rows, loss, b, i, dt) for i in IMPLS)
                body.append([str(b), dt, cell_mem(oc, "peak_rss_bytes"), cell_mem(fm, "peak_rss_bytes"),
                             ratio(div(value(fm, "peak_rss_bytes"), value(oc, "peak_rss_bytes"))),
                             cell_mem(oc, "extra_bytes"), cell_mem(fm, "extra_bytes"),
                             ratio(div(value(fm, "extra_bytes"), value(oc, "extra_bytes")), 4),
                             cell_mem(oc, "first_call_bytes") + " / " + cell_mem(fm, "first_call_bytes"),
                             cell_mem(c, "peak_rss_bytes"), cell_mem(c, "extra_bytes"),
                             size(ELEMENT_BYTES[dt] * 2.0 * b * o.dim)])
        print(sup.table(["b", "dtype", "peak RSS: open_clip", "peak RSS: flatmem.torch", "ratio (peak)",
                         "beyond inputs: open_clip", "beyond inputs: flatmem.torch", "ratio (beyond inputs)",
                         "first call (once): open_clip / flatmem.torch", "peak RSS: flatmem C",
                         "C extra (vs q,k,dq,dk)", "q, k"], body, align="ll" + "r" * 10))
        print("\nPeak RSS: the whole process's VmHWM (~0.6 GB of a torch child is torch itself). Beyond inputs: "
              "the peak after q, k exist minus the resident set then (includes q.grad, k.grad), after a first "
              "tiny call whose growth is the 'first call' column. flatmem C: contrastive_bench's peak and its extra over a process "
              "holding q, k, dq, dk (of the row's dtype).")
        print("\nloss values (same features; float64: of the same rounded inputs):")
        for b in sizes:
            for dt in o.dtypes:
                got = [(i, value(find(rows, loss, b, i, dt), "loss_value")) for i in IMPLS + ("float64",)]
                got = [(i, v) for i, v in got if math.isfinite(v)]
                if not got:
                    continue
                ref = got[0][1]
                spread = max(abs(v - ref) for _, v in got) / max(abs(ref), 1e-30)
                print(f"  b = {b}, {dt}: " + ", ".join(f"{i} {v:.9g}" for i, v in got) +
                      f"  (largest rel. diff {spread:.2g})")


def print_targets(rows, losses, o):
    print("\n### Targets\n")
    for loss in losses:
        oc, fm, c = (find(rows, loss, TARGET_BATCH, i) for i in IMPLS)
        t = div(value(fm, "best_s"), value(oc, "best_s"))
        m = div(value(fm, "peak_rss_bytes"), value(oc, "peak_rss_bytes"))
        mx = div(value(fm, "extra_bytes"), value(oc, "extra_bytes"))
        vc = div(value(fm, "best_s"), value(c, "best_s"))
        print(f"- [{loss}] flatmem.torch <= {TARGET_TIME}x open_clip's time at b = {TARGET_BATCH}: "
              f"{ratio(t)} -> {verdict(t, TARGET_TIME)}")
        print(f"- [{loss}] flatmem.torch <= 1/8 of open_clip's peak memory at b = {TARGET_BATCH}: peak RSS "
              f"{ratio(m)} -> {verdict(m, TARGET_MEMORY)} (beyond the inputs: {ratio(mx, 4)} -> "
              f"{verdict(mx, TARGET_MEMORY)})")
        print(f"- [{loss}] flatmem.torch <= {TARGET_VS_C}x the C benchmark's time at b = {TARGET_BATCH}: "
              f"{ratio(vc)} -> {verdict(vc, TARGET_VS_C)}")
        big = find(rows, loss, MEMORY_BATCH, "flatmem.torch")
        e = value(big, "extra_bytes")
        print(f"- [{loss}] flatmem.torch beyond the inputs < {size(MEMORY_LIMIT)} at b = {MEMORY_BATCH}: "
              f"{size(e)} -> {'not measured' if not math.isfinite(e) else 'MET' if e < MEMORY_LIMIT else 'MISSED'}")
    if "clip" in losses and "bf16" in o.dtypes:
        print_bf16_targets(rows)


def cpu_has_avx512_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and "avx512_bf16" in line.split() for line in f)
    except OSError:
        return False


def print_bf16_targets(rows):
    """Issues 32 and 40, CLIP loss at b = 16384: flatmem.torch bf16 under avx512bf16 or amx (its bf16 kernels:
    vdpbf16ps or AMX tiles) <= 0.5x open_clip's bf16 time,
    >= 1.7x flatmem.torch fp32's speed, with an fp32-accurate loss."""
    head = f"- [clip, bf16] at b = {TARGET_BATCH}, flatmem.torch bf16 <= {TARGET_BF16_VS_OPEN_CLIP}x open_clip's " \
           f"bf16 time and >= {TARGET_BF16_SPEEDUP}x flatmem.torch fp32's speed, fp32-accurate loss"
    oc, fm, fm32 = (find(rows, "clip", TARGET_BATCH, i, dt) for i, dt in
                    (("open_clip", "bf16"), ("flatmem.torch", "bf16"), ("flatmem.torch", "fp32")))
    isa = (fm or fm32 or {}).get("isa", "")
    if not cpu_has_avx512_bf16():
        print(f"{head}: not measured: CPU lacks AVX512_BF16")
        return
    if isa and isa not in ("avx512bf16", "amx"):
        print(f"{head}: not measured: flatmem runs {isa}, not avx512bf16 or amx (a library without its kernels, "
              f"or FLATMEM_CPU_ISA set)")
        return
    t = div(value(fm, "best_s"), value(oc, "best_s"))
    speedup = div(value(fm32, "best_s"), value(fm, "best_s"))
    e16, e32 = sup.number((fm or {}).get("loss_rel_err")), sup.number((fm32 or {}).get("loss_rel_err"))
    bound = max(BF16_ERROR_FACTOR * (e32 if math.isfinite(e32) else 0.0), BF16_ERROR_FLOOR)
    print(f"- [clip, bf16] flatmem.torch bf16 <= {TARGET_BF16_VS_OPEN_CLIP}x open_clip's bf16 time at b = "
          f"{TARGET_BATCH}: {ratio(t)} -> {verdict(t, TARGET_BF16_VS_OPEN_CLIP)}")
    print(f"- [clip, bf16] flatmem.torch bf16 >= {TARGET_BF16_SPEEDUP}x flatmem.torch fp32's speed at b = "
          f"{TARGET_BATCH}: {ratio(speedup)} -> "
          f"{'not measured' if not math.isfinite(speedup) else 'MET' if speedup >= TARGET_BF16_SPEEDUP else 'MISSED'}")
    print(f"- [clip, bf16] flatmem.torch bf16 loss fp32-accurate at b = {TARGET_BATCH} (error vs float64 <= "
          f"max({BF16_ERROR_FACTOR:g}x fp32's {e32:.1e}, 2^-20)): {e16:.1e} -> {verdict(e16, bound)}")


FIELDS = ["loss", "batch", "dim", "dtype", "impl", "status", "best_s", "median_s", "reps", "warmup_s", "warmup_rows",
          "loss_value", "dscale", "dbias", "peak_rss_bytes", "inputs_rss_bytes", "extra_bytes",
          "first_call_bytes", "wait4_maxrss_bytes", "planned_extra_bytes", "threads", "isa", "torch", "open_clip",
          "flatmem", "loss_dtype", "loss_rel_err", "reference_loss",
          "wall_s", "note"]


def driver(o) -> int:
    losses = ("clip", "sigmoid") if o.loss == "all" else (o.loss,)
    print(f"torch_loss_bench: flatmem.torch vs open_clip vs flatmem C, forward + backward, "
          f"{', '.join(o.dtypes)}, d = {o.dim}, "
          f"s = {o.scale}, t = {o.bias} (sigmoid)")
    print(f"machine: {sup.cpu_model()}, {os.cpu_count()} hardware threads, {size(sup.machine_ram())} RAM; "
          f"load average at start: {sup.load_average()}")
    print(f"python: {sys.executable}; contrastive_bench: {o.contrastive_bench}; torch threads per child: "
          f"{o.threads}; reps: {o.reps} (b > {LARGE}: {o.large_reps}); skip above {o.mem_limit_gib} GiB")
    anchor = run_torch(o, "anchor", "clip", 0)
    if anchor.get("status") == "ok":
        print(f"flatmem engine: {anchor['engine']}")
        print(f"torch {anchor['torch']} matmul (b x d) @ (d x b), b = 4096, {anchor['threads']} threads (the "
              f"machine's anchor): fp32 {anchor['matmul_fp32_gflops']:.0f} GFLOP/s, bf16 "
              f"{anchor['matmul_bf16_gflops']:.0f} GFLOP/s")
    else:
        print(f"torch matmul anchor: not measured ({anchor.get('note', 'failed')})")
    rows, info_printed, isa = [], False, ""
    limit = o.mem_limit_gib * GiB
    started = time.monotonic()
    for loss in losses:
        for b in o.sizes:
            print(f"\n[{loss}] b = {b} (q, k: {size(8.0 * b * o.dim)} fp32; one b x b fp32 matrix: "
                  f"{size(4.0 * b * b)})", flush=True)
            for dtype in o.dtypes:
                ref = {"loss": loss, "batch": b, "dim": o.dim, "impl": "float64", "dtype": dtype}
                ref.update(run_reference(o, loss, b, dtype))
                rows.append(ref)
                progress(ref)
                for impl in IMPLS:
                    row = {"loss": loss, "batch": b, "dim": o.dim, "impl": impl, "dtype": dtype,
                           "planned_extra_bytes": planned_bytes(impl, loss, b, o.dim) if impl == "open_clip" else ""}
                    need = planned_bytes(impl, loss, b, o.dim) + 8.0 * b * o.dim
                    if impl == "open_clip" and need > limit:
                        row.update(status="skipped", note=f"its b x b buffers need ~{size(need)} "
                                                          f"(> --mem-limit-gib {o.mem_limit_gib:g})")
                    elif impl == "flatmem C":
                        row.update(run_c(o, loss, b, isa, dtype))
                    else:
                        row.update(run_torch(o, impl, loss, b, dtype))
                        if impl == "flatmem.torch" and row["status"] == "ok":
                            isa = row.get("isa", isa)
                            if not info_printed:
                                print(f"  (torch {row.get('torch')}, flatmem {row.get('flatmem')} [{row.get('isa')}] "
                                      f"from {row.get('library')})", flush=True)
                                info_printed = True
                    l64, got = value(ref, "loss_value"), value(row, "loss_value")
                    if math.isfinite(l64) and math.isfinite(got):
                        row.update(reference_loss=l64, loss_rel_err=abs(got - l64) / abs(l64))
                    rows.append(row)
                    progress(row)
    print_tables(rows, o, losses)
    print_targets(rows, losses, o)
    if o.csv:
        sup.write_csv(o.csv, FIELDS, rows)
        print(f"\nwrote {o.csv}")
    print(f"total wall time: {seconds(time.monotonic() - started)}")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def parse_args(argv):
    p = argparse.ArgumentParser(description="flatmem.torch ClipLoss / SigLipLoss vs open_clip's and vs "
                                            "flatmem's C benchmark (CPU, fp32, forward + backward), every "
                                            "(implementation, b) in its own process.")
    p.add_argument("--sizes", help="batch sizes b, comma-separated (default 4096,16384,65536)")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--loss", choices=("clip", "sigmoid", "all"), default="all")
    p.add_argument("--reps", type=int, default=3, help="timed calls after the warm-up; the fastest is reported")
    p.add_argument("--large-reps", type=int, default=1, help=f"timed calls for b > {LARGE}")
    p.add_argument("--full-warmup", action="store_true",
                   help=f"warm up at b also above b = {LARGE} (default: on the first {LARGE} rows)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in every child")
    p.add_argument("--scale", type=float, default=sup.SCALE, help="logit scale s (contrastive_bench's)")
    p.add_argument("--bias", type=float, default=sup.BIAS, help="logit bias t of the sigmoid loss")
    p.add_argument("--mem-limit-gib", type=float, default=20.0,
                   help="skip open_clip where its estimated buffers exceed this")
    p.add_argument("--csv", help="default bench/torch_loss_bench.csv (--quick: the temporary directory)")
    p.add_argument("--contrastive-bench", default=default_contrastive_bench())
    p.add_argument("--dtypes", default="fp32,bf16", help="feature dtypes, comma-separated: fp32, bf16")
    p.add_argument("--ref-max-batch", type=int, default=65536,
                   help="float64 reference loss (the err columns) up to this b; 0: none")
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, help="seconds per child (default: none)")
    p.add_argument("--quick", action="store_true", help="b = 512, 1024, 2 reps: a smoke run")
    p.add_argument("--busy", action="store_true",
                   help="keep torch's intra-op pool busy beside every measured call (torch_bench_support."
                        "TorchPoolBusy; beside the C benchmark in a process of its own)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    if o.quick:
        o.sizes = o.sizes or "512,1024"
        o.reps = min(o.reps, 2)
        o.csv = o.csv or os.path.join(tempfile.gettempdir(), "torch_loss_bench_quick.csv")
    o.sizes = [int(x) for x in (o.sizes or "4096,16384,65536").split(",") if x.strip()]
    o.dtypes = [x.strip() for x in o.dtypes.split(",") if x.strip()]
    if not o.dtypes or any(x not in DTYPES for x in o.dtypes) or o.dtype not in DTYPES:
        p.error(f"--dtypes: comma-separated, of {', '.join(DTYPES)}")
    if o.csv is None:
        o.csv = os.path.join(HERE, "torch_loss_bench.csv")
    return o


def main(argv=None) -> int:
    o = parse_args(sys.argv[1:] if argv is None else argv)
    if o.worker:
        result = worker(o)
        print(sup.RESULT + json.dumps(result), flush=True)
        return 0
    return driver(o)


if __name__ == "__main__":
    sys.exit(main())
