"""Speedup over dense as a pure function of timings: spread, bounds, paired and time-to-answer.

Torch-free, so `run.json`, the tables and W&B compute the same numbers from the same records.

- Paired speedup: inside a run, the dense model redoes the work the method just did (same prompts,
  same decode steps per row, teacher-forced on the method's completions; `bwprune.generation.
  paired`), alternating with the method. `step` is dense decode time / method decode time on that
  work (per unit of work); `e2e` adds the prefill. Spread = median, min, max over every timed pair.
- Bandwidth bound: a decode step reads every weight once, so a step that skips a fraction of the
  parameters can at best run bytes(read) / bytes(read - skipped) times faster. For a scheduled
  method (dense and sparse steps mixed) the ideal is 1 / (f_dense + f_sparse / bound).
- Time-to-answer: what a user waits includes length changes (a pruned model may write longer).
  It needs the matching dense run's length, never its timing: the dense run's time is estimated
  as this run's prefill and decode time, scaled by the paired ratios and by the ratio of decode
  steps (loop iterations) of the two runs, so no timing of two different processes is compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence


def spread(values: Sequence[float]) -> dict:
    """Median and range: what a reader needs to judge a timing ratio."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def bandwidth_bound(read_bytes: float, skipped_bytes: float) -> float:
    """Upper bound on a sparse step's speedup: bytes(read) / bytes(read - skipped)."""
    return read_bytes / (read_bytes - skipped_bytes)


def schedule_ideal(sparse_fraction: float, step_speedup: float) -> float:
    """Speedup of a generation whose `sparse_fraction` of steps run `step_speedup`× faster."""
    return 1.0 / ((1.0 - sparse_fraction) + sparse_fraction / step_speedup)


def sparse_step_bound(realized: Mapping, weight_bytes: Mapping) -> float:
    """The bandwidth bound of one of a run's sparse steps: (c) over its sparse steps only (dense
    steps skip nothing, so (c) / f_sparse), in bytes of all parameters, against what a dense step
    reads. Zeroed weights still read by dense kernels (Wanda) count as skipped: the bound is what
    a kernel that skipped them could reach."""
    f = realized.get("sparse_step_fraction", 0.0)
    params_sparse = realized.get("params", 0.0) / f if f else 0.0
    return bandwidth_bound(weight_bytes["read"], params_sparse * weight_bytes["params"])


def paired_speedup(timings: list[dict], realized: Mapping) -> dict | None:
    """The run's paired speedup over dense from its timing rows that carry a `paired` entry
    (None: no batch was timed), with the bound and the schedule-aware ideal next to it."""
    pairs = [t["paired"] for t in timings if t.get("paired")]
    if not pairs:
        return None
    method = [r for p in pairs for r in p["method"]]
    dense = [r for p in pairs for r in p["dense"]]
    bound = sparse_step_bound(realized, pairs[0]["weight_bytes"])
    generation_s = sum(t["prefill_s"] + t["decode_s"] for t in timings)
    overhead_s = sum(p["overhead_s"] for p in pairs)
    return {
        "step": _ratio(dense, method, "decode_s"),
        "e2e": _ratio(dense, method, "prefill_s", "decode_s"),
        "prefill": _ratio(dense, method, "prefill_s"),
        "batches": len(pairs),
        "repeats": len(method),
        "bandwidth_bound": bound,
        "ideal": schedule_ideal(realized.get("sparse_step_fraction", 0.0), bound),
        "overhead_s": overhead_s,
        "overhead_fraction": overhead_s / generation_s if generation_s else 0.0,
    }


def _ratio(dense: list[dict], method: list[dict], *keys: str) -> dict | None:
    """Spread of dense / method over paired trials, each side's time the sum of `keys`; None when
    no trial took any (a batch whose every row stopped at its first token has no decode time)."""
    pairs = [(sum(d[k] for k in keys), sum(m[k] for k in keys)) for d, m in zip(dense, method)]
    ratios = [d / m for d, m in pairs if d > 0 and m > 0]
    return spread(ratios) if ratios else None


def time_to_answer(metrics: Mapping, dense_metrics: Mapping) -> float | None:
    """Estimated (dense run's time) / (this run's time) for the same problems, lengths included;
    None without a paired speedup, or when the runs' problem counts differ."""
    paired = metrics.get("speedup")
    if not paired or not paired["step"] or metrics.get("n") != dense_metrics.get("n"):
        return None
    steps, dense_steps = metrics.get("decode_iterations"), dense_metrics.get("decode_iterations")
    if not steps or not dense_steps:
        return None
    prefill, decode = metrics["prefill_s"], metrics["decode_s"]
    dense_s = (
        prefill * (paired["prefill"] or {"median": 1.0})["median"]
        + decode * paired["step"]["median"] * dense_steps / steps
    )
    return dense_s / (prefill + decode)
