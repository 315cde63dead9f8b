"""What the Python benchmarks share in their reports: the machine they ran on, and times and sizes
as text (standard library only)."""
import math
import os

MiB, GiB = 1024.0**2, 1024.0**3


def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo, or "unknown CPU"."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def machine_ram() -> float:
    """Physical memory in bytes (NaN where sysconf cannot tell)."""
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return math.nan


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, or "?"."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def seconds(s: float) -> str:
    """A duration as text: ms below 0.1 s, three significant decimals below 10 s."""
    if not math.isfinite(s):
        return "-"
    return f"{1e3 * s:.1f} ms" if s < 0.1 else (f"{s:.3f} s" if s < 10 else f"{s:.1f} s")


def size(n: float) -> str:
    """A byte count as text in KiB, MiB or GiB."""
    if not math.isfinite(n):
        return "-"
    a = abs(n)
    return f"{n / GiB:.2f} GiB" if a >= GiB else f"{n / MiB:.1f} MiB" if a >= MiB else f"{n / 1024:.0f} KiB"
