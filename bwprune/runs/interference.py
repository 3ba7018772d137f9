"""What else ran on the machine while a timing was taken: load average and CPU steal.

A ratio of two timings taken together survives a steady load, but not a load that comes and goes,
and on a shared machine it cannot be kept away; so it is written down next to the timing, and a
timing taken while other work loaded the machine (the load above the cores by more than the
timing's own threads explain) is flagged rather than hidden. Torch-free; reads
`/proc/stat` where the OS has one (steal: time a hypervisor gave this machine's CPUs to another).
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# How far the load may exceed the cores before a timing counts as shared. The timing process
# itself keeps every core busy, and its own short-lived threads add a little: on the idle 2-core
# machine of this project the timing alone read loads of 1.9-2.1 (batch 16 highest), while a
# second job of half a core showed as 2.3-2.5 (results/LOG.md, 2026-12-02). Above the cores by
# more than this, at least a quarter of a core's worth of other work shared the machine.
OWN_LOAD_MARGIN = 0.25


def snapshot(proc_stat: Path = PROC_STAT) -> dict:
    """Now: the 1-minute load average and the CPU's cumulative (steal, total) ticks (None where
    the OS gives neither)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"load": load, "ticks": _steal_ticks(proc_stat)}


def between(start: dict, end: dict, cores: int | None = None) -> dict:
    """The interference over a timing from its two snapshots: the load at both ends, the share of
    CPU time stolen between them, and whether it was `overloaded` (this process's usable CPUs
    unless `cores` is given)."""
    cores = cores or _cores()
    loads = [start["load"], end["load"]]
    steal = None
    if start["ticks"] and end["ticks"]:
        (s0, t0), (s1, t1) = start["ticks"], end["ticks"]
        steal = (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0
    return {"cores": cores, "load": loads, "steal": steal, "overloaded": overloaded(loads, cores)}


def overloaded(loads: list[float | None], cores: int) -> bool:
    """Whether other work shared the machine: a load above the cores by more than the timing's
    own threads account for (`OWN_LOAD_MARGIN`). Summaries judge stored loads with it again, so
    records taken before the margin read the same way."""
    return any(x is not None and x > cores + OWN_LOAD_MARGIN for x in loads)


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
