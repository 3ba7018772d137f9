"""What else ran on the machine while a timing was taken: load average and CPU steal.

A ratio of two timings taken together survives a steady load, but not a load that comes and goes,
and on a shared machine it cannot be kept away; so it is written down next to the timing, and a
timing taken while the load exceeded the cores is flagged rather than hidden. Torch-free; reads
`/proc/stat` where the OS has one (steal: time a hypervisor gave this machine's CPUs to another).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def snapshot(proc_stat: Path = PROC_STAT) -> dict:
    """Now: the 1-minute load average and the CPU's cumulative (steal, total) ticks (None where
    the OS gives neither)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"load": load, "ticks": _steal_ticks(proc_stat)}


def between(start: dict, end: dict, cores: int | None = None) -> dict:
    """The interference over a timing from its two snapshots: the load at both ends, the share of
    CPU time stolen between them, and `overloaded` when either load exceeded the cores (this
    process's usable CPUs unless given)."""
    cores = cores or _cores()
    loads = [start["load"], end["load"]]
    steal = None
    if start["ticks"] and end["ticks"]:
        (s0, t0), (s1, t1) = start["ticks"], end["ticks"]
        steal = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
    overloaded = any(x is not None and x > cores for x in loads)
    return {"cores": cores, "load": loads, "steal": steal, "overloaded": overloaded}


def _steal_ticks(proc_stat: Path) -> tuple[int, int] | None:
    """(steal, user + nice + system + idle + iowait + irq + softirq + steal) of all CPUs; guest
    time is already inside user, so it is not added again."""
    try:
        fields = proc_stat.read_text().splitlines()[0].split()
    except OSError:
        return None
    if fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(f) for f in fields[1:9]]
    return ticks[7], sum(ticks)


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
