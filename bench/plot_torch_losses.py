#!/usr/bin/python3
"""Time and memory against batch size: flatmem.torch beside open_clip and flatmem's C API.

Reads the CSV of bench/torch_loss_bench.py and draws, log-log, one row of panels per loss (CLIP,
sigmoid): left, the fastest forward + backward time of open_clip, flatmem.torch and flatmem C;
right, the memory each torch child needed beyond its inputs (solid) and its whole peak RSS
(dotted; ~0.6 GB of it is torch itself), with flatmem C's extra memory. Where open_clip was skipped
because its b x b buffers would not fit, its estimated need is drawn as a hollow marker, labelled.

Needs only matplotlib (Debian's python3-matplotlib), not torch:

    /usr/bin/python3 bench/plot_torch_losses.py                        # bench/torch_loss_bench.csv
    /usr/bin/python3 bench/plot_torch_losses.py /tmp/torch_loss_bench_quick.csv -o /tmp/torch_losses.png
"""
import argparse
import csv
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1024.0 * 1024.0
FLOOR_MIB = 0.1  # memory below this (or negative: noise) is drawn at it
STYLE = {"open_clip": ("tab:red", "o"), "flatmem.torch": ("tab:blue", "s"), "flatmem C": ("tab:green", "^")}
TITLES = {"clip": "CLIP loss (ClipLoss)", "sigmoid": "Sigmoid loss (SigLipLoss)"}


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def series(rows, impl, key):
    pts = sorted((int(r["batch"]), number(r.get(key))) for r in rows
                 if r["impl"] == impl and r["status"] == "ok" and r.get("dtype", "fp32") in ("", "fp32"))
    return [(b, v) for b, v in pts if math.isfinite(v)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="?", default=os.path.join(HERE, "torch_loss_bench.csv"),
                        help="CSV written by torch_loss_bench.py --csv (default bench/torch_loss_bench.csv)")
    parser.add_argument("-o", "--output", default=os.path.join(HERE, "torch_losses.png"))
    args = parser.parse_args()

    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    losses = [x for x in ("clip", "sigmoid") if any(r["loss"] == x for r in rows)]
    if not losses:
        raise SystemExit(f"{args.csv}: no rows")
    dim = rows[0].get("dim", "?")
    fig, axes = plt.subplots(len(losses), 2, figsize=(12, 4.6 * len(losses)), squeeze=False)
    for row_axes, loss in zip(axes, losses):
        mine = [r for r in rows if r["loss"] == loss]
        ax_t, ax_m = row_axes
        for impl, (color, marker) in STYLE.items():
            pts = series(mine, impl, "best_s")
            if pts:
                ax_t.plot([b for b, _ in pts], [v for _, v in pts], marker=marker, color=color, label=impl)
            extra = series(mine, impl, "extra_bytes")
            if extra:
                label = impl + (" extra vs q,k,dq,dk" if impl == "flatmem C" else " beyond inputs")
                ax_m.plot([b for b, _ in extra], [max(v / MIB, FLOOR_MIB) for _, v in extra], marker=marker,
                          color=color, label=label)
            peak = series(mine, impl, "peak_rss_bytes") if impl != "flatmem C" else []
            if peak:
                ax_m.plot([b for b, _ in peak], [v / MIB for _, v in peak], marker=marker, color=color,
                          linestyle=":", alpha=0.6, label=impl + " peak RSS")
        for r in mine:
            if r["impl"] == "open_clip" and r["status"] == "skipped":
                need = number(r.get("planned_extra_bytes"))
                if math.isfinite(need):
                    b = int(r["batch"])
                    ax_m.plot([b], [need / MIB], marker="o", markerfacecolor="none", color=STYLE["open_clip"][0],
                              linestyle="none")
                    need_text = f"{need / 2**30:.0f} GiB" if need >= 2**30 else f"{need / MIB:.0f} MiB"
                    ax_m.annotate(f"open_clip skipped:\nneeds ~{need_text}", (b, need / MIB),
                                  textcoords="offset points", xytext=(-90, -25), fontsize=8)
        for ax in row_axes:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size b")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        ax_t.set_ylabel("forward + backward time (s)")
        ax_m.set_ylabel("memory (MiB)")
        ax_t.set_title(f"{TITLES[loss]}: time, fp32, d = {dim}, CPU")
        ax_m.set_title(f"{TITLES[loss]}: memory")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
