"""`run.json` metrics as a pure function of a run's rows (samples.jsonl and timing.jsonl).

A resumed run, merged shards and a rescored run get their metrics here, from the rows on disk, so
the metrics never depend on what a process held in memory. Which rows are a consistent record is
`bwprune.runs.recorder`'s business; this module imports no torch and reads no file.
"""

from __future__ import annotations

import statistics
from collections import Counter

from bwprune.engine.realized import combine
from bwprune.runs.speedup import paired_speedup


def pass_at_1(samples: list[dict]) -> float:
    """Mean over problems of the fraction of their samples that are correct (unscorable = wrong).

    With one sample per problem this is plain accuracy; with n it is the unbiased pass@1 estimate
    (docs/paper-notes.md#answer-checking).
    """
    per_problem: dict[int, list[bool]] = {}
    for s in samples:
        per_problem.setdefault(s["index"], []).append(s["correct"] is True)
    if not per_problem:
        return 0.0
    return sum(sum(c) / len(c) for c in per_problem.values()) / len(per_problem)


def summarize(
    samples: list[dict], timings: list[dict], target_sparsity: float, cost: dict | None = None
) -> dict:
    """`run.json` metrics from the per-sample and per-batch records.

    `n`, `correct`, `unscorable` count sample rows; `accuracy` is pass@1 over `problems`;
    `cut_off_rate`: the fraction of samples that hit the token limit (their finish reason is
    `length`), which says whether `max_new_tokens` or the model decided a run's accuracy. Per
    problem: tokens generated and decode seconds (what a user waits on, with `decode_iterations`,
    the decode loop's steps, which time-to-answer compares with dense's); `speedup`: the paired
    speedup over dense when batches were timed (`bwprune.runs.speedup`). `cost` is a matched-cost
    run's search (`bwprune.generation.cost_target`): its chosen ρ is the run's target, and it is
    recorded whole under `cost`.
    """
    n = len(samples)
    correct = sum(1 for s in samples if s["correct"] is True)
    decode_s = sum(t["decode_s"] for t in timings)
    steps_ms = [ms for t in timings for ms in t["step_ms"]]
    problems = len({s["index"] for s in samples})
    realized = combine(s["sparsity"] for s in samples)
    tokens = sum(s["new_tokens"] for s in samples)
    metrics = {
        "n": n,
        "problems": problems,
        "samples_per_problem": n / problems if problems else 0.0,
        "accuracy": pass_at_1(samples),
        "correct": correct,
        "unscorable": sum(1 for s in samples if s["correct"] is None),
        "unscorable_reasons": dict(
            Counter(s["score_reason"] for s in samples if s["correct"] is None)
        ),
        "cut_off_rate": sum(s.get("finish_reason") == "length" for s in samples) / n if n else 0.0,
        "target_sparsity": cost["rho"] if cost else target_sparsity,
        "realized_sparsity": realized,
        "mean_new_tokens": tokens / n if n else 0.0,
        "tokens_per_problem": tokens / problems if problems else 0.0,
        "decode_s_per_problem": decode_s / problems if problems else 0.0,
        "decode_iterations": sum(len(t["step_ms"]) for t in timings),
        "decode_tokens_per_s": sum(t["decode_tokens"] for t in timings) / decode_s
        if decode_s
        else 0.0,
        "decode_ms_per_step": statistics.median(steps_ms) if steps_ms else 0.0,
        "prefill_s": sum(t["prefill_s"] for t in timings),
        "decode_s": decode_s,
        "quality": combine_quality([s.get("quality") for s in samples]),
        **({"cost": cost} if cost else {}),
    }
    speedup = paired_speedup(timings, realized)
    if speedup is not None:
        metrics["speedup"] = speedup
    return metrics


def combine_quality(rows: list[dict]) -> dict:
    """Run-level means, weighted by reference tokens."""
    rows = [r for r in rows if r]
    total = sum(r["tokens"] for r in rows)
    if not total:
        return {}
    mean = {k: sum(r[k] * r["tokens"] for r in rows) / total for k in ("nll_dense", "nll", "kl")}
    return {**mean, "nll_increase": mean["nll"] - mean["nll_dense"], "tokens": total}
