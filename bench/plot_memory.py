#!/usr/bin/python3
"""Peak extra memory against batch size, flatmem vs the materialised loss.

Reads the CSV written by `contrastive_bench --csv PATH` and draws, log-log, the
measured extra memory (peak RSS of the variant's process minus that of a process
holding only q, k, dq, dk) of flatmem and of the naive materialised loss. Where
the naive loss was skipped because it would not fit, its projected need
(2 b^2 fp32: logits and their gradient) is drawn dashed and labelled.

Given also the CSV of `bench/jax_peer_bench.py --csv PATH` (optional second
argument), it adds that run's plain-JAX materialised loss (XLA:CPU): its peak RSS
minus that of a JAX process holding only the inputs and gradient-sized arrays.

    /usr/bin/python3 bench/plot_memory.py bench/contrastive_bench.csv -o bench/memory_vs_batch.png
    /usr/bin/python3 bench/plot_memory.py bench/contrastive_bench.csv bench/jax_peer_bench.csv \
        -o bench/memory_vs_batch.png
"""
import argparse
import csv
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0 * 1024.0
FLOOR_MIB = 0.1  # measured values below this (or negative: noise) are drawn at it


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="CSV written by contrastive_bench --csv")
    parser.add_argument("jax_csv", nargs="?",
                        help="optional: CSV written by bench/jax_peer_bench.py --csv (adds its "
                             "jax-materialised row)")
    parser.add_argument("-o", "--output", default="bench/memory_vs_batch.png")
    args = parser.parse_args()

    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{args.csv}: no rows")
    dim = rows[0]["dim"]
    jax_rows = []
    if args.jax_csv:
        with open(args.jax_csv, newline="") as f:
            jax_rows = [r for r in csv.DictReader(f) if r["variant"] == "jax-materialised"]
        if not jax_rows:
            raise SystemExit(f"{args.jax_csv}: no jax-materialised rows")
        if any(r["dim"] != dim for r in jax_rows):
            raise SystemExit(f"{args.jax_csv}: d = {jax_rows[0]['dim']}, {args.csv}: d = {dim}")
    batches = sorted({int(x["batch"]) for x in rows} | {int(x["batch"]) for x in jax_rows})
    ram = number(rows[0].get("machine_ram_bytes"))

    def series(variant, status):
        # one row per batch: a variant run under several CPU ISAs (the isa column) uses the same
        # memory under each, so the first is kept
        first = {}
        for r in rows:
            if r["variant"] == variant and r["status"] == status and r.get("dtype", "fp32") in ("", "fp32"):
                first.setdefault(int(r["batch"]), r)
        return sorted(first), [first[b] for b in sorted(first)]

    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=120)

    b, r = series("flatmem", "ok")
    if b:
        mib = [max(number(x["extra_bytes"]) / MIB, FLOOR_MIB) for x in r]
        ax.plot(b, mib, "o-", color="tab:blue", label="flatmem, measured")
        ws = [number(x["workspace_bytes"]) / MIB for x in r]
        ax.plot(b, ws, ":", color="tab:blue", alpha=0.7, label="flatmem, workspace query")
        for x, y in zip(b, mib):
            ax.annotate(f"{y:.1f} MiB", (x, y), textcoords="offset points", xytext=(4, -12), fontsize=8,
                        color="tab:blue")

    b, r = series("naive", "ok")
    last = None
    if b:
        mib = [max(number(x["extra_bytes"]) / MIB, FLOOR_MIB) for x in r]
        ax.plot(b, mib, "s-", color="tab:red", label="naive materialised loss, measured")
        for x, y in zip(b, mib):
            label = f"{y / 1024:.1f} GiB" if y >= 1024 else f"{y:.0f} MiB"
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(-10, 8), fontsize=8,
                        color="tab:red", ha="right")
        last = (b[-1], mib[-1])
    sb, sr = series("naive", "skipped")
    if sb:
        projected = [number(x["planned_extra_bytes"]) / MIB for x in sr]
        xs, ys = ([last[0]] if last else []) + sb, ([last[1]] if last else []) + projected
        ax.plot(xs, ys, "--", color="tab:red")
        ax.plot(sb, projected, "s", mfc="none", color="tab:red",
                label="naive, projected (2 b\u00b2 fp32): does not fit, not run")
        for x, y in zip(sb, projected):
            ax.annotate(f"needs {y / 1024:.0f} GiB", (x, y), textcoords="offset points", xytext=(-70, 6),
                        fontsize=8, color="tab:red")

    points = sorted((int(r["batch"]), number(r["extra_bytes"])) for r in jax_rows if r["status"] == "ok")
    if points:
        b = [x for x, _ in points]
        mib = [max(y / MIB, FLOOR_MIB) for _, y in points]
        ax.plot(b, mib, "^-", color="tab:orange",
                label="plain JAX materialised (XLA:CPU), measured (jax_peer_bench)")
        for x, y in zip(b, mib):
            label = f"{y / 1024:.1f} GiB" if y >= 1024 else f"{y:.0f} MiB"
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8,
                        color="tab:orange")

    if math.isfinite(ram):
        ax.axhline(ram / MIB, color="gray", lw=0.8)
        ax.text(batches[-1], ram / MIB / 1.3, f"machine RAM {ram / 2**30:.0f} GiB",
                fontsize=8, color="gray", ha="right", va="top")

    ax.axhline(64.0, color="tab:green", lw=0.8, ls=":")
    ax.text(batches[-1], 64.0 / 1.2, "target for flatmem: 64 MiB at b = 65536",
            fontsize=8, color="tab:green", ha="right", va="top")

    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("batch size b (= c)")
    ax.set_ylabel("peak extra memory (MiB)")
    ax.set_title(f"Symmetric contrastive loss, forward + backward, fp32, d = {dim}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
