#!/usr/bin/python3
"""Summed activation memory and gradient traffic over time steps, SYNC vs cyclic.

Reads the timeline written by `cyclic_bench --timeline PATH` and draws, for one
world size (default: the largest in the file), two panels over global time
steps: the activation bytes held by all ranks together (from the schedule and
the declared bytes per stage) and the gradient bytes sent in each time step,
summed over ranks (as the protocol assigns them), SYNC against DELAY1.

    python3 bench/plot_cyclic.py bench/cyclic_timeline.csv -o bench/cyclic_timeline.png
"""
import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MIB = 1024.0 * 1024.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline")
    parser.add_argument("-o", "--output", default="cyclic_timeline.png")
    parser.add_argument("--ranks", type=int, default=0, help="world size to draw (default: largest)")
    args = parser.parse_args()

    series = defaultdict(lambda: ([], [], []))
    with open(args.timeline, newline="") as f:
        for row in csv.DictReader(f):
            t, act, sent = series[(int(row["ranks"]), row["rule"])]
            t.append(int(row["time_step"]))
            act.append(float(row["activation_bytes"]) / MIB)
            sent.append(float(row["bytes_scheduled"]) / MIB)
    ranks = args.ranks or max(r for r, _ in series)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    styles = {"sync": ("SYNC (plain data parallelism)", "tab:red"),
              "delay1": ("cyclic (DELAY1)", "tab:blue")}
    for rule, (label, color) in styles.items():
        if (ranks, rule) not in series:
            continue
        t, act, sent = series[(ranks, rule)]
        top.step(t, act, where="post", label=label, color=color)
        bottom.step(t, sent, where="post", label=label, color=color)
    top.set_ylabel("activations held,\nall ranks (MiB)")
    bottom.set_ylabel("gradient bytes sent\nper time step (MiB)")
    bottom.set_xlabel("global time step (one training step = 2L time steps)")
    top.set_title(f"{ranks} ranks: summed activation memory and gradient traffic")
    top.legend(loc="upper right")
    top.set_ylim(bottom=0)
    bottom.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)


if __name__ == "__main__":
    main()
