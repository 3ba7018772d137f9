"""The rows a generation writes into its run folder: one per sample (samples.jsonl), one per
batch's timing (timing.jsonl). `bwprune.runs.recorder` appends them; these are their schemas.
"""

from __future__ import annotations

from bwprune.benchmarks.base import Example
from bwprune.generation.runner import BatchTiming, Completion
from bwprune.scoring.common import Score


def sample_row(
    example: Example,
    sample: int,
    completion: Completion,
    score: Score,
    think_open: bool,
    quality: dict | None = None,
) -> dict:
    """One line of samples.jsonl: the problem, the completion, its score and what it cost."""
    return {
        "index": example.index,
        "sample": sample,
        "id": example.id,
        "prompt": example.question,
        "think_open": think_open,
        "completion": completion.text,
        "prediction": score.prediction,
        "gold": example.gold,
        "correct": score.correct,
        "score_reason": score.reason,
        "new_tokens": completion.new_tokens,
        "finish_reason": completion.finish_reason,
        "sparsity": completion.sparsity,
        "quality": quality,  # teacher-forced fidelity to dense (generation/quality.py), or None
    }


def timing_row(batch: list[tuple[Example, int]], timing: BatchTiming) -> dict:
    """One line of timing.jsonl: which (problem, sample) pairs a batch held, its times, and
    where the host saw its decode time go (`PhaseLog.summary`: kinds of step, refreshes, kept
    overlap, tensor-parallel gathers and per-rank selection's gap), when its engine logged it."""
    return {
        "indices": [e.index for e, _ in batch],
        "samples": [k for _, k in batch],
        "prefill_s": timing.prefill_s,
        "decode_s": timing.decode_s,
        "decode_tokens": timing.decode_tokens,
        "step_ms": [round(1e3 * s, 4) for s in timing.step_s],
        **({"phases": timing.phases} if timing.phases else {}),
    }
