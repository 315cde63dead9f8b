#!/usr/bin/env python3
"""torch_ring_bench -- the CLIP loss across 4 processes: flatmem.torch's ring beside open_clip's
gathered losses, under torchrun.

What is compared, side by side in one run: one global batch of b rows (b = 16384, and 65536 with
--sizes), d = 512, fp32, CPU, split over 4 ranks (b/4 rows each, a gloo process group), forward +
backward of the loss (loss.backward() on each rank's leaves q_r, k_r and the logit scale):

  open_clip local   open_clip ClipLoss(gather_with_grad=True, local_loss=True, rank=r, world_size=4):
                    all-gathers the features (with their gradients), each rank the (b/4) x b logits
                    of its own rows, both directions
  open_clip global  the same with local_loss=False: every rank the whole b x b logits
  flatmem.torch     flatmem.torch.ClipLoss(rank=r, world_size=4): flatmem's ring over a
                    communicator the module makes from the default process group at its first call;
                    the loss of the global batch in O(b/4) memory per rank

Each implementation runs in its own torchrun launch (python -m torch.distributed.run
--nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:<free port>, this script as the
worker), so every rank's peak memory is its own. Every rank: OMP_NUM_THREADS=1 and
torch.set_num_threads(1) (4 ranks on this machine's 2 cores; flatmem's own tile threads are not
set by either -- the library starts one per hardware thread in every rank), its rows of
contrastive_bench's features (seed 1, torch_bench_support.make_features: the global batch is the
one torch_loss_bench.py and contrastive_bench use, so the loss printed matches theirs at the same
b), s = 14.3; FLATMEM_COMM_TIMEOUT_MS=600000 unless set (a ring wait may exceed the default 60 s
when 4 ranks share 2 cores at b = 65536).

Time per step: every rank waits at a barrier, then times forward + backward; a step's time is the
slowest rank's; reported is the median over --steps timed steps (default 3; --large-steps, default
1, above b = 16384) after one untimed warm-up step. Memory per rank: VmHWM (/proc/self/status) of
each rank, the largest over the ranks: the whole process (~0.6 GB of it is torch) and beyond the
inputs (the peak after q_r, k_r exist minus the resident set then, VmHWM being reset there through
/proc/self/clear_refs). Before the inputs every rank makes one tiny step (8 rows per rank) whose
growth is reported as "first call": flatmem's communicator and handle (open_clip: its gather). open_clip is skipped, with the
reason printed, where its estimated buffers (local: 7 (b/4) b fp32 per rank, global: 5 b^2 per
rank; from its growth measured between b = 2048 and 8192) plus torch's ~0.7 GB per rank, times 4
ranks, exceed --mem-limit-gib (20). That skips open_clip global at b = 16384 (estimated ~23 GiB;
measured 1.9 GiB per rank at b = 8192, which extrapolates to ~5.3 GiB per rank, ~21 GiB for 4 ranks
on this 24 GiB machine -- raise --mem-limit-gib to try it on a larger one) and both open_clip
variants at 65536.

Rank 0 of each launch prints its line and writes a JSON result; this script, the launcher, prints
the side-by-side table with ratios and writes the CSV (--csv, default bench/torch_ring_bench.csv;
--quick: b = 2048 into the temporary directory). Target printed MET / MISSED at b = 16384:
flatmem.torch <= 0.5x open_clip local's step time with <= 1/3 of its per-rank memory (peak RSS; the
ratio beyond the inputs beside it).

    build/wheel-venv/bin/python bench/torch_ring_bench.py                   # b = 16384: the full run
    build/wheel-venv/bin/python bench/torch_ring_bench.py --sizes 16384,65536
    build/wheel-venv/bin/python bench/torch_ring_bench.py --quick           # b = 2048: a smoke run

The full run (b = 16384) takes about 3 minutes on this machine (2 cores, AMD EPYC, AVX2; open_clip
local ~20 s a step, flatmem ~10 s, open_clip global skipped); with 65536 (flatmem only) about 6
minutes more (~2.5 minutes a step, warm-up + 1 step). Estimated from b = 8192 (open_clip local
4.7 s, global 14.4 s, flatmem 2.3 s a step on a machine shared with other work) and the b^2 d growth
of the work.

Needs a Python with torch (with torch.distributed, gloo), open-clip-torch, numpy and flatmem (with
flatmem.torch) installed.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch_bench_support as sup  # noqa: E402  (stdlib only at import)
from torch_bench_support import GiB, div, ratio, seconds, size, verdict  # noqa: E402

IMPLS = {
    "open_clip-local": "open_clip ClipLoss(gather_with_grad=True, local_loss=True)",
    "open_clip-global": "open_clip ClipLoss(gather_with_grad=True, local_loss=False)",
    "flatmem.torch": "flatmem.torch ClipLoss(rank=r, world_size=N): flatmem's ring",
}
TARGET_BATCH = 16384
TARGET_TIME = 0.5            # flatmem.torch <= 0.5x open_clip local's step time at b = 16384 ...
TARGET_MEMORY = 1.0 / 3.0    # ... with <= 1/3 of its per-rank memory
LARGE = 16384                # above this, --large-steps
TORCH_RSS = 0.7 * GiB        # a rank's resident set before its loss (torch, gloo, the features)
# open_clip's buffers per rank beyond the inputs, in units of its logits matrix (fp32): local,
# (b/N) x b (two directions: logits, log-softmax outputs, their gradients, and the gathered
# features), global, b x b (one logits matrix, two log-softmax outputs, gradients). The growth of
# the measured per-rank peak from b = 2048 to 8192 was 6.95 and 4.64; rounded up.
OPEN_CLIP_LOGITS = {"open_clip-local": 7.0, "open_clip-global": 5.0}


# ---------------------------------------------------------------------------
# Worker: one rank under torchrun
# ---------------------------------------------------------------------------


def worker(o) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(o.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    b, d = o.batch, o.dim
    if b % world:
        raise SystemExit(f"torch_ring_bench: b = {b} is not a multiple of the {world} ranks")
    rows = b // world
    info = {"torch": torch.__version__}
    if o.worker == "flatmem.torch":
        import flatmem
        import flatmem.torch as fmt

        criterion = fmt.ClipLoss(rank=rank, world_size=world)
        info.update(flatmem=flatmem.library_version(), isa=flatmem.cpu_isa()[0])
    elif o.worker in ("open_clip-local", "open_clip-global"):
        loss_module = sup.open_clip_loss_module()
        info["open_clip"] = sup.open_clip_version()
        criterion = loss_module.ClipLoss(local_loss=o.worker == "open_clip-local", gather_with_grad=True,
                                         rank=rank, world_size=world)
    else:
        raise SystemExit(f"torch_ring_bench: no worker {o.worker!r}")
    s = torch.tensor(o.scale, dtype=torch.float32, requires_grad=True)

    def step(q, k):
        for x in (q, k, s):
            x.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        loss = criterion(q, k, s)
        loss.backward()
        return time.perf_counter() - t0, float(loss.detach())

    # one tiny step first: what a rank pays once (imports, the communicator, handles)
    before = sup.status_bytes("VmRSS")
    tiny = [torch.from_numpy(x).requires_grad_()
            for x in sup.make_features(8 * world, d, rows=(8 * rank, 8 * rank + 8))]
    step(*tiny)
    first_call = sup.status_bytes("VmRSS") - before
    del tiny

    q_np, k_np = sup.make_features(b, d, rows=(rank * rows, (rank + 1) * rows))
    q = torch.from_numpy(q_np).requires_grad_()
    k = torch.from_numpy(k_np).requires_grad_()
    dist.barrier()
    meter = sup.PeakMeter()
    meter.inputs()
    warmup, _ = step(q, k)
    steps = o.steps if b <= LARGE else o.large_steps
    times, losses = [], []
    for _ in range(max(1, steps)):
        t, value = step(q, k)
        times.append(t)
        losses.append(value)
    mine = {"rank": rank, "times": times, "warmup_s": warmup, "loss": losses[-1], "first_call_bytes": first_call,
            "threads": torch.get_num_threads(), **meter.report()}
    gathered = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank == 0:
        per_step = [max(r["times"][i] for r in gathered) for i in range(len(times))]
        result = {
            "step_s": statistics.median(per_step), "best_step_s": min(per_step), "steps": len(per_step),
            "step_times": per_step, "warmup_s": max(r["warmup_s"] for r in gathered),
            "loss_value": statistics.fmean(r["loss"] for r in gathered),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in gathered),
            "extra_bytes": max(r["extra_bytes"] for r in gathered),
            "inputs_rss_bytes": max(r["inputs_rss_bytes"] for r in gathered),
            "first_call_bytes": max(r["first_call_bytes"] for r in gathered),
            "ranks": world, "rows_per_rank": rows, "threads": gathered[0]["threads"],
            "rank_peaks": [r["peak_rss_bytes"] for r in gathered], **info,
        }
        with open(o.result, "w") as f:
            json.dump(result, f)
        print(f"rank 0: {o.worker} b = {b} ({world} x {rows} rows): step {seconds(result['step_s'])} "
              f"(median of {len(per_step)}, slowest rank), per-rank peak RSS {size(result['peak_rss_bytes'])}, "
              f"beyond inputs {size(result['extra_bytes'])}, loss {result['loss_value']:.9g}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------
# Launcher
# ---------------------------------------------------------------------------


def planned_bytes(impl: str, b: int, d: int, world: int) -> float:
    """Per rank, beyond its inputs, known before the run."""
    if impl == "open_clip-local":
        return OPEN_CLIP_LOGITS[impl] * 4.0 * (b // world) * b + 4 * 4.0 * b * d
    if impl == "open_clip-global":
        return OPEN_CLIP_LOGITS[impl] * 4.0 * b * b + 4 * 4.0 * b * d
    return 4.0 * 4.0 * (b // world) * d


def launch(o, impl: str, b: int) -> dict:
    args = ["--worker", impl, "--batch", str(b), "--dim", str(o.dim), "--steps", str(o.steps),
            "--large-steps", str(o.large_steps), "--threads", str(o.threads), "--scale", repr(o.scale)]
    return sup.torchrun(__file__, o.ranks, args, threads=o.threads, timeout=o.timeout, echo=o.verbose,
                        note_lines=("rank", "error"))


def progress(row):
    if row["status"] != "ok":
        print(f"  {row['impl']:<17} {row['status']}: {row.get('note', '')}", flush=True)
        return
    print(f"  {row['impl']:<17} step {seconds(row['step_s']):>10} (median of {row['steps']}, slowest rank; "
          f"warm-up {seconds(row['warmup_s'])})   per-rank peak RSS {size(row['peak_rss_bytes']):>10}   "
          f"beyond inputs {size(row['extra_bytes']):>10}   loss {row['loss_value']:.9g}   "
          f"[{seconds(row['wall_s'])} wall]", flush=True)


def find(rows, b, impl):
    return next((r for r in rows if r["batch"] == b and r["impl"] == impl), None)


def value(r, key) -> float:
    return sup.number(r.get(key)) if r is not None and r["status"] == "ok" else math.nan


def cell(r, key, fmt) -> str:
    if r is None:
        return "-"
    if r["status"] == "skipped":
        return "skipped" if key == "step_s" else f"(needs ~{size(sup.number(r.get('planned_extra_bytes')))})"
    return fmt(value(r, key)) if r["status"] == "ok" else "failed"


def print_tables(rows, o):
    sizes = sorted({r["batch"] for r in rows})
    names = list(IMPLS)
    print(f"\n### CLIP loss over {o.ranks} ranks (gloo, CPU, {o.threads} torch thread per rank), fp32, d = {o.dim}: "
          f"forward + backward per step\n")
    body = []
    for b in sizes:
        loc, glo, fm = (find(rows, b, n) for n in names)
        body.append([str(b), str(b // o.ranks), cell(loc, "step_s", seconds), cell(glo, "step_s", seconds),
                     cell(fm, "step_s", seconds), ratio(div(value(fm, "step_s"), value(loc, "step_s"))),
                     ratio(div(value(fm, "step_s"), value(glo, "step_s")))])
    print(sup.table(["b (global)", "rows per rank", "open_clip local_loss", "open_clip global",
                     "flatmem.torch (ring)", "flatmem / open_clip local", "flatmem / open_clip global"], body))
    print("\nStep time: the slowest rank's forward + backward, median over the timed steps.\n")
    body = []
    for b in sizes:
        loc, glo, fm = (find(rows, b, n) for n in names)
        body.append([str(b), cell(loc, "peak_rss_bytes", size), cell(glo, "peak_rss_bytes", size),
                     cell(fm, "peak_rss_bytes", size),
                     ratio(div(value(fm, "peak_rss_bytes"), value(loc, "peak_rss_bytes"))),
                     cell(loc, "extra_bytes", size), cell(glo, "extra_bytes", size), cell(fm, "extra_bytes", size),
                     ratio(div(value(fm, "extra_bytes"), value(loc, "extra_bytes")), 4),
                     " / ".join(cell(r, "first_call_bytes", size) for r in (loc, glo, fm))])
    print(sup.table(["b", "peak RSS/rank: open_clip local", "open_clip global", "flatmem.torch",
                     "flatmem / local (peak)", "beyond inputs/rank: open_clip local", "open_clip global",
                     "flatmem.torch", "flatmem / local (beyond inputs)", "first call (once): local / global / flatmem"],
                    body))
    print("\nMemory per rank: the largest over the ranks. Peak RSS: the whole process (~0.6 GB of it torch). "
          "Beyond inputs: the peak after q_r, k_r exist minus the resident set then (includes the gradients).")
    print("\nloss values (mean over ranks; open_clip local: each rank's local loss, whose mean is the global one):")
    for b in sizes:
        got = [(n, value(find(rows, b, n), "loss_value")) for n in names]
        got = [(n, v) for n, v in got if math.isfinite(v)]
        if got:
            ref = got[0][1]
            spread = max(abs(v - ref) for _, v in got) / max(abs(ref), 1e-30)
            print(f"  b = {b}: " + ", ".join(f"{n} {v:.9g}" for n, v in got) + f"  (largest rel. diff {spread:.2g})")
    print("\n### Target\n")
    loc, fm = find(rows, TARGET_BATCH, "open_clip-local"), find(rows, TARGET_BATCH, "flatmem.torch")
    t = div(value(fm, "step_s"), value(loc, "step_s"))
    m = div(value(fm, "peak_rss_bytes"), value(loc, "peak_rss_bytes"))
    mx = div(value(fm, "extra_bytes"), value(loc, "extra_bytes"))
    print(f"- flatmem.torch <= {TARGET_TIME}x open_clip local_loss's step time at b = {TARGET_BATCH}: {ratio(t)} -> "
          f"{verdict(t, TARGET_TIME)}")
    print(f"- flatmem.torch <= 1/3 of open_clip local_loss's per-rank memory at b = {TARGET_BATCH}: peak RSS "
          f"{ratio(m)} -> {verdict(m, TARGET_MEMORY)} (beyond the inputs: {ratio(mx, 4)} -> "
          f"{verdict(mx, TARGET_MEMORY)})")


FIELDS = ["batch", "dim", "ranks", "rows_per_rank", "impl", "status", "step_s", "best_step_s", "steps",
          "step_times", "warmup_s", "loss_value", "peak_rss_bytes", "inputs_rss_bytes", "extra_bytes",
          "first_call_bytes", "planned_extra_bytes", "rank_peaks", "threads", "isa", "torch", "open_clip", "flatmem",
          "wall_s", "note"]


def launcher(o) -> int:
    print(f"torch_ring_bench: CLIP loss over {o.ranks} ranks (torchrun, gloo, CPU), fp32, d = {o.dim}, s = {o.scale}")
    print(f"machine: {sup.cpu_model()}, {os.cpu_count()} hardware threads, {size(sup.machine_ram())} RAM; "
          f"load average at start: {sup.load_average()}")
    print(f"python: {sys.executable}; OMP_NUM_THREADS={o.threads} per rank; steps: 1 warm-up + {o.steps} "
          f"(b > {LARGE}: {o.large_steps}); skip above {o.mem_limit_gib} GiB in all")
    rows, limit, started = [], o.mem_limit_gib * GiB, time.monotonic()
    for b in o.sizes:
        print(f"\nb = {b} ({o.ranks} ranks x {b // o.ranks} rows; q_r, k_r: "
              f"{size(8.0 * (b // o.ranks) * o.dim)} per rank)",
              flush=True)
        for impl in o.impls:
            planned = planned_bytes(impl, b, o.dim, o.ranks)
            row = {"batch": b, "dim": o.dim, "ranks": o.ranks, "rows_per_rank": b // o.ranks, "impl": impl,
                   "planned_extra_bytes": planned}
            need = o.ranks * (planned + TORCH_RSS)
            if impl != "flatmem.torch" and need > limit:
                row.update(status="skipped", note=f"{o.ranks} ranks need ~{size(need)} "
                                                  f"(> --mem-limit-gib {o.mem_limit_gib:g})")
            else:
                row.update(launch(o, impl, b))
            for key in ("step_times", "rank_peaks"):
                if isinstance(row.get(key), list):
                    row[key] = " ".join(f"{x:.6g}" for x in row[key])
            rows.append(row)
            progress(row)
    print_tables(rows, o)
    if o.csv:
        sup.write_csv(o.csv, FIELDS, rows)
        print(f"\nwrote {o.csv}")
    print(f"total wall time: {seconds(time.monotonic() - started)}")
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def parse_args(argv):
    p = argparse.ArgumentParser(description="flatmem.torch's ring ClipLoss vs open_clip's gathered ClipLoss "
                                            "under torchrun (CPU, gloo), every implementation in its own launch.")
    p.add_argument("--sizes", help="global batch sizes b, comma-separated (default 16384)")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--ranks", type=int, default=4, help="processes (torchrun --nproc-per-node)")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of " + ", ".join(IMPLS))
    p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up step")
    p.add_argument("--large-steps", type=int, default=1, help=f"timed steps for b > {LARGE}")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS and torch.set_num_threads per rank")
    p.add_argument("--scale", type=float, default=sup.SCALE)
    p.add_argument("--mem-limit-gib", type=float, default=20.0,
                   help="skip an open_clip launch whose ranks together would need more")
    p.add_argument("--csv", help="default bench/torch_ring_bench.csv (--quick: the temporary directory)")
    p.add_argument("--timeout", type=float, help="seconds per launch (default: none)")
    p.add_argument("--verbose", action="store_true", help="echo torchrun's output")
    p.add_argument("--quick", action="store_true", help="b = 2048, 2 steps: a smoke run")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    o = p.parse_args(argv)
    if o.quick:
        o.sizes = o.sizes or "2048"
        o.steps = min(o.steps, 2)
        o.csv = o.csv or os.path.join(tempfile.gettempdir(), "torch_ring_bench_quick.csv")
    o.sizes = [int(x) for x in (o.sizes or "16384").split(",") if x.strip()]
    o.impls = [x.strip() for x in o.impls.split(",") if x.strip()]
    unknown = [x for x in o.impls if x not in IMPLS]
    if unknown:
        p.error(f"--impls: unknown {', '.join(unknown)}")
    if o.csv is None:
        o.csv = os.path.join(HERE, "torch_ring_bench.csv")
    return o


def main(argv=None) -> int:
    o = parse_args(sys.argv[1:] if argv is None else argv)
    if o.worker:
        return worker(o)
    return launcher(o)


if __name__ == "__main__":
    sys.exit(main())
