"""Speedup over dense as a pure function of timings: spread, bounds, paired and time-to-answer.

Torch-free, so `run.json`, the tables and W&B compute the same numbers from the same records.

- Paired speedup: inside a run, the dense model redoes the work the method just did (same prompts,
  same decode steps per row, teacher-forced on the method's completions; `bwprune.generation.
  paired`), alternating with the method. `step` is dense decode time / method decode time on that
  work (per unit of work); `e2e` adds the prefill. Spread = median, min, max over every timed pair
  and, for runs timed to a target precision, an interval of the median (`median_interval`).
- Bandwidth bound: a decode step reads every weight once, so a step that skips a fraction of the
  parameters can at best run bytes(read) / bytes(read - skipped) times faster. For a scheduled
  method (dense and sparse steps mixed) the ideal is 1 / (f_dense + f_sparse / bound).
- Time-to-answer: what a user waits includes length changes (a pruned model may write longer).
  It needs the matching dense run's length, never its timing: the dense run's time is estimated
  as this run's prefill and decode time, scaled by the paired ratios and by the ratio of decode
  steps (loop iterations) of the two runs, so no timing of two different processes is compared.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from bwprune.runs.interference import overloaded

SIDES = ("prefill_s", "decode_s")  # a trial's time end to end


def spread(values: Sequence[float]) -> dict:
    """Median and range: what a reader needs to judge a timing ratio."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def median_interval(values: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """A distribution-free interval of the median: the order statistics (x_k, x_{n+1-k}) with
    the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at least `confidence`; None
    when even (min, max) covers less (at 95 %: fewer than 6 values).

    Why not a bootstrap: on the few pairs a timing affords, the bootstrap of a median is discrete
    and covers less than it claims, and it needs a seed; this one is exact for any continuous
    distribution of the ratios and a pure function of them."""
    n = len(values)
    below, k = 0.0, 0  # below = P(Binomial(n, 1/2) < k + 1)
    while k < n // 2:
        below += math.comb(n, k) / 2**n
        if 1 - 2 * below < confidence:
            break
        k += 1
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def relative_half_width(values: Sequence[float], confidence: float) -> float:
    """How far the interval of the median reaches from the median, as a fraction of it (the
    farther side: the interval is not symmetric); infinite while there is no interval."""
    interval = median_interval(values, confidence)
    if interval is None:
        return math.inf
    median = statistics.median(values)
    return max(median - interval[0], interval[1] - median) / median


def pair_ratios(dense: Sequence[Mapping], method: Sequence[Mapping], *keys: str) -> list[float]:
    """dense / method per paired trial, each side's time the sum of `keys`; trials where either
    side took none of that time (rows that stopped at their first token) are left out."""
    pairs = [(sum(d[k] for k in keys), sum(m[k] for k in keys)) for d, m in zip(dense, method)]
    return [d / m for d, m in pairs if d > 0 and m > 0]


def timed_ratios(results: Mapping[str, Sequence[Mapping]]) -> list[list[float]]:
    """The ratios a paired timing must pin down (`alternate_until`): per step and end to end;
    per step is empty when no trial had a decode step, and then end to end alone decides."""
    dense, method = results["dense"], results["method"]
    ratios = [pair_ratios(dense, method, "decode_s"), pair_ratios(dense, method, *SIDES)]
    return [r for r in ratios if r]


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
    # Runs timed before intervals existed carry no precision: they keep their min-max alone.
    precision = [p["precision"] for p in pairs if "precision" in p]
    confidence = precision[0]["confidence"] if len(precision) == len(pairs) else None
    summary = {
        "step": _ratio(dense, method, confidence, "decode_s"),
        "e2e": _ratio(dense, method, confidence, *SIDES),
        "prefill": _ratio(dense, method, confidence, "prefill_s"),
        "batches": len(pairs),
        "repeats": len(method),
        "bandwidth_bound": bound,
        "ideal": schedule_ideal(realized.get("sparse_step_fraction", 0.0), bound),
        "overhead_s": overhead_s,
        "overhead_fraction": overhead_s / generation_s if generation_s else 0.0,
    }
    if confidence is not None:
        summary["interval"] = _precision(summary, precision, confidence)
    return summary


def _precision(summary: Mapping, batches: list[Mapping], confidence: float) -> dict:
    """How tight the run's intervals came out against the target its batches were timed to
    (`bwprune.generation.timing.alternate_until`), and whether other load shared the machine."""
    widths = [
        max(r["median"] - r["low"], r["high"] - r["median"]) / r["median"] if "low" in r
        else math.inf
        for r in (summary["step"], summary["e2e"]) if r
    ]  # fmt: skip
    half_width = max(widths, default=0.0)  # inf: a ratio without an interval
    target = batches[0]["target"]
    loads = [x for b in batches for x in b["interference"]["load"] if x is not None]
    steals = [b["interference"]["steal"] for b in batches if b["interference"]["steal"] is not None]
    return {
        "confidence": confidence,
        "target": target,
        "half_width": half_width if math.isfinite(half_width) else None,
        "reached": half_width <= target,
        "pairs": [b["pairs"] for b in batches],
        "stopped": [b["stopped"] for b in batches],
        "load_max": max(loads, default=None),
        "steal_max": max(steals, default=None),
        "overloaded": any(
            overloaded(b["interference"]["load"], b["interference"]["cores"]) for b in batches
        ),
    }


def _ratio(dense: list[dict], method: list[dict], confidence: float | None, *keys: str):
    """Spread of dense / method over paired trials, each side's time the sum of `keys`, with the
    interval of its median (`low`, `high`) where `confidence` is given and the pairs allow one;
    None when no trial took any such time (every row stopped at its first token)."""
    ratios = pair_ratios(dense, method, *keys)
    if not ratios:
        return None
    out = spread(ratios)
    interval = median_interval(ratios, confidence) if confidence is not None else None
    if interval is not None:
        out["low"], out["high"] = interval
    return out


def time_to_answer(metrics: Mapping, dense_metrics: Mapping, step: str = "median") -> float | None:
    """Estimated (dense run's time) / (this run's time) for the same problems, lengths included;
    None without a paired speedup, or when the runs' problem counts differ. `step`: which of the
    per-step ratio's statistics to scale by (`median`; `low`/`high` for its interval's ends)."""
    paired = metrics.get("speedup")
    if not paired or not paired["step"] or metrics.get("n") != dense_metrics.get("n"):
        return None
    steps, dense_steps = metrics.get("decode_iterations"), dense_metrics.get("decode_iterations")
    if not steps or not dense_steps:
        return None
    prefill, decode = metrics["prefill_s"], metrics["decode_s"]
    dense_s = (
        prefill * (paired["prefill"] or {"median": 1.0})["median"]
        + decode * paired["step"][step] * dense_steps / steps
    )
    return dense_s / (prefill + decode)


def step_span(step: Mapping) -> tuple[float, float, str]:
    """The per-step speedup's span a reader may rely on: its interval where the run has one
    (`"interval"`), else the slowest to fastest trial (`"range"`, runs timed before intervals)."""
    if "low" in step:
        return step["low"], step["high"], "interval"
    return step["min"], step["max"], "range"


def time_to_answer_span(metrics: Mapping, dense_metrics: Mapping) -> tuple[float, float] | None:
    """Time-to-answer at both ends of the per-step span (`step_span`): it grows with the per-step
    ratio and the rest of it is fixed, so the span carries over."""
    paired = metrics.get("speedup")
    if not paired or not paired["step"]:
        return None
    low, high, _ = step_span(paired["step"])
    step = {**paired["step"], "low": low, "high": high}
    ends = [time_to_answer({**metrics, "speedup": {**paired, "step": step}}, dense_metrics, end)
            for end in ("low", "high")]  # fmt: skip
    return None if None in ends else (ends[0], ends[1])
