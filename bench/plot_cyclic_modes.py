#!/usr/bin/python3
"""Per-stage-rank activity over time steps, stage-parallel DELAY1 vs SYNC.

Reads the activity file written by `cyclic_modes_bench --activity PATH` (every
action each stage rank ran: time step, forward/backward, micro-batch, step) and
draws, for one number of micro-batches N (default: the smallest in the file),
two panels over global time steps: one row per stage rank, one cell per action
coloured by micro-batch (forward solid, backward hatched and lighter; a time
step with k actions is split into k slices), the micro-batch number written in
the cell. DELAY1 (top) keeps every rank busy after the warm-up; SYNC (bottom)
drains the pipeline before each step: the white gaps are its bubble.

    python3 bench/plot_cyclic_modes.py bench/cyclic_modes_activity.csv \
        -o bench/cyclic_modes_activity.png
"""
import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("activity")
    parser.add_argument("-o", "--output", default="cyclic_modes_activity.png")
    parser.add_argument("--micro-batches", type=int, default=0,
                        help="N to draw (default: the smallest in the file)")
    parser.add_argument("--time-steps", type=int, default=0,
                        help="draw time steps 0 .. this - 1 (default: all)")
    args = parser.parse_args()

    # (N, rule) -> {(stage, time_step): [(kind, micro_batch, step), ...]}
    runs = defaultdict(lambda: defaultdict(list))
    with open(args.activity, newline="") as f:
        for row in csv.DictReader(f):
            cell = runs[(int(row["micro_batches"]), row["rule"])][(int(row["stage"]), int(row["time_step"]))]
            cell.append((row["kind"], int(row["micro_batch"]), int(row["step"])))
    if not runs:
        raise SystemExit(f"{args.activity}: no actions")
    n = args.micro_batches or min(k for k, _ in runs)
    panels = [(rule, runs[(n, rule)]) for rule in ("delay1", "sync") if (n, rule) in runs]
    if not panels:
        raise SystemExit(f"{args.activity}: no run with {n} micro-batches")
    colours = plt.get_cmap("tab10" if n <= 10 else "tab20")
    stages = 1 + max(s for _, cells in panels for s, _ in cells)
    horizon = args.time_steps or 1 + max(t for _, cells in panels for _, t in cells)

    fig, axes = plt.subplots(len(panels), 1, figsize=(min(4 + 0.22 * horizon, 22), 1.2 + 0.55 * stages * len(panels)),
                             sharex=True, squeeze=False)
    for ax, (rule, cells) in zip(axes[:, 0], panels):
        for (stage, tau), actions in sorted(cells.items()):
            if tau >= horizon:
                continue
            k = len(actions)
            for i, (kind, mb, _step) in enumerate(actions):
                forward = kind == "forward"
                y = stage - 0.45 + 0.9 * i / k
                ax.add_patch(Rectangle((tau, y), 1, 0.9 / k, facecolor=colours(mb % colours.N),
                                       alpha=1.0 if forward else 0.45, hatch=None if forward else "///",
                                       edgecolor="white", linewidth=0.4))
                if k <= 2:
                    ax.text(tau + 0.5, y + 0.45 / k, str(mb), ha="center", va="center", fontsize=6)
        label = "DELAY1 (cyclic, no drain)" if rule == "delay1" else "SYNC (drains before each step)"
        # Steady window [P, P (S-1)): P = the time steps between stage 0's forwards of
        # micro-batch 0 in steps 0 and 1, S = the steps run (as cyclic_modes_bench).
        first = {a[2]: t for (s, t), acts in cells.items() if s == 0 for a in acts if a[:2] == ("forward", 0)}
        steps = 1 + max(a[2] for acts in cells.values() for a in acts)
        title = f"stage-parallel {label}: {stages} stage ranks, {n} micro-batches"
        if steps >= 3 and 0 in first and 1 in first:
            period = first[1] - first[0]
            lo, hi = period, period * (steps - 1)
            ax.axvspan(lo, hi, color="0.93", zorder=-1)
            fractions = ", ".join(
                f"{sum(1 for (s, t) in cells if s == stage and lo <= t < hi) / (hi - lo):.0%}" for stage in range(stages))
            title += f"; busy per rank in the steady window (shaded): {fractions}"
        ax.set_title(title, fontsize=9)
        ax.set_ylim(-0.6, stages - 0.4)
        ax.set_yticks(range(stages))
        ax.set_yticklabels([f"stage {s}" for s in range(stages)])
        ax.invert_yaxis()
        ax.set_xlim(0, horizon)
    axes[-1, 0].set_xlabel("global time step (numbers: micro-batch; solid forward, hatched backward)")
    handles = [Patch(facecolor="grey", label="forward"), Patch(facecolor="grey", alpha=0.45, hatch="///", label="backward")]
    axes[0, 0].legend(handles=handles, loc="upper right", fontsize=7, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)


if __name__ == "__main__":
    main()
