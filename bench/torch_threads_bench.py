#!/usr/bin/env python3
"""torch_threads_bench -- flatmem.torch's ClipLoss beside flatmem's C benchmark, with torch's intra-op
pool idle and busy.

flatmem.torch runs the loss on flatmem's own thread pool (torch.get_num_threads() threads, the
caller's included); torch's intra-op pool is another set of threads on the same cores. This
benchmark measures what the binding costs in both situations, side by side in one run:

  idle   nothing else runs (torch's pool is parked)
  busy   torch's pool is kept busy beside every measured call, as a data loader's transforms or
         another op on a side stream keep it: a thread multiplies 512 x 512 fp32 matrices back to
         back (torch_bench_support.TorchPoolBusy). Beside flatmem.torch that thread runs in the
         torch process itself; beside the C benchmark (which has no torch) in a process of its own
         doing the same. The neighbour's own rate (GFLOP/s) is printed beside each row, so that the
         two loads can be seen to be the same.

Rows: the CLIP loss (ClipLoss forward + backward, fp32) at b = 16384 (--batch), d = 256 and 512
(--dims); each (implementation, d, condition) in its own process, through bench/torch_loss_bench.py's
own runners (its worker for flatmem.torch; contrastive_bench --variants flatmem for C: the same
features, bit for bit, the fastest of --reps calls after a warm-up). Target, printed MET / MISSED:
flatmem.torch <= 1.05x the C benchmark's time in every (d, condition). The slowdown of each
implementation under the busy neighbour is printed as well (how much the two pools share the cores;
not a target: two busy pools on two cores halve each other's time).

Usage (the wheel's venv: scripts/build-wheel.sh):
    build/wheel-venv/bin/python bench/torch_threads_bench.py            # b = 16384, d = 256, 512
    build/wheel-venv/bin/python bench/torch_threads_bench.py --quick    # b = 2048: a smoke run
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch_bench_support as sup  # noqa: E402
import torch_loss_bench as tlb  # noqa: E402

CONDITIONS = ("idle", "busy")
IMPLS = ("flatmem.torch", "flatmem C")
TARGET_VS_C = 1.05
FIELDS = ["dim", "condition", "impl", "status", "best_s", "median_s", "reps", "busy_gflops", "loss_value", "isa",
          "note"]


def measure(o, impl, d, condition):
    run = argparse.Namespace(**vars(o))
    run.dim, run.busy = d, condition == "busy"
    if impl == "flatmem C":
        row = tlb.run_c(run, "clip", o.batch, o.isa, "fp32")
    else:
        row = tlb.run_torch(run, "flatmem.torch", "clip", o.batch, "fp32")
        o.isa = row.get("isa", o.isa)
    row.update(impl=impl, dim=d, condition=condition)
    print(f"  d = {d:<4} {condition:<4} {impl:<14} "
          + (f"best {sup.seconds(row.get('best_s', float('nan'))):>9}  loss {row.get('loss_value', float('nan')):.9g}"
             f"  neighbour {row.get('busy_gflops', float('nan')):.1f} GFLOP/s" if row["status"] == "ok"
             else f"{row['status']}: {row.get('note', '')}"), flush=True)
    return row


def c_blas_core() -> str:
    """The kernel set the system's libopenblas.so.0 picks on this CPU (asked here): libflatmem's
    private copy is the same Debian build, with the same CPU table."""
    import ctypes

    try:
        name = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    except (OSError, AttributeError):
        return "?"
    name.restype = ctypes.c_char_p
    return name().decode()


def report(rows, o):
    def best(d, c, impl):
        r = next((x for x in rows if x["dim"] == d and x["condition"] == c and x["impl"] == impl), None)
        return tlb.value(r, "best_s")

    header = ["d", "torch pool", "flatmem.torch", "flatmem C", "torch / C", "neighbour GFLOP/s (torch / C run)",
              f"target <= {TARGET_VS_C}x"]
    lines, verdicts = [], []
    for d in o.dims:
        for c in CONDITIONS:
            t, cc = best(d, c, "flatmem.torch"), best(d, c, "flatmem C")
            gf = [next((tlb.value(x, "busy_gflops") for x in rows if x["dim"] == d and x["condition"] == c
                        and x["impl"] == impl), float("nan")) for impl in IMPLS]
            verdict = sup.verdict(sup.div(t, cc), TARGET_VS_C)
            verdicts.append(verdict)
            lines.append([str(d), c, sup.seconds(t), sup.seconds(cc), sup.ratio(sup.div(t, cc)),
                          "-" if c == "idle" else f"{gf[0]:.1f} / {gf[1]:.1f}", verdict])
    print("\n" + sup.table(header, lines))
    print("\nslowdown with the busy neighbour (busy / idle):")
    for d in o.dims:
        parts = [f"{impl} {sup.ratio(sup.div(best(d, 'busy', impl), best(d, 'idle', impl)))}" for impl in IMPLS]
        print(f"  d = {d}: " + ", ".join(parts))
    return verdicts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("--batch", type=int, default=16384)
    p.add_argument("--dims", default="256,512")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (and flatmem's pool) per child")
    p.add_argument("--contrastive-bench", default=tlb.default_contrastive_bench())
    p.add_argument("--timeout", type=float)
    p.add_argument("--csv", default=os.path.join(HERE, "torch_threads_bench.csv"))
    p.add_argument("--quick", action="store_true", help="b = 2048, 2 reps")
    o = p.parse_args(argv)
    if o.quick:
        o.batch, o.reps = 2048, 2
        o.csv = os.path.join("/tmp", "torch_threads_bench_quick.csv")
    o.dims = [int(x) for x in o.dims.split(",") if x.strip()]
    # what torch_loss_bench's runners read
    o.large_reps, o.full_warmup, o.scale, o.bias, o.isa = o.reps, False, sup.SCALE, sup.BIAS, ""
    started = time.monotonic()
    print(f"torch_threads_bench: ClipLoss fp32 forward + backward, b = {o.batch}, d = {o.dims}, "
          f"{o.threads} threads, best of {o.reps}")
    print(f"machine: {sup.cpu_model()}, {os.cpu_count()} hardware threads; load average {sup.load_average()}")
    rows = []
    for d in o.dims:
        for c in CONDITIONS:
            for impl in IMPLS:
                rows.append(measure(o, impl, d, c))
    print(f"flatmem ISA: {o.isa or '?'}; tile products: Debian's OpenBLAS 0.3.21 linked privately into "
          f"libflatmem (wheel and build alike), whose kernel choice on this CPU is the system copy's: "
          f"{c_blas_core()} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')})")
    verdicts = report(rows, o)
    sup.write_csv(o.csv, FIELDS, rows)
    print(f"\nwrote {o.csv}; total wall time {sup.seconds(time.monotonic() - started)}")
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
