"""The committed runs are scored by the current scorers: in particular, no run credits a completion
the token limit cut before it gave an answer.

Why: the committed SmolLM2 runs once credited 14 truncated, box-less completions by their last
number; this catches a results tree left scored by an older rule (rerun scripts/rescore.py).
"""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from bwprune.experiment import build
from bwprune.scoring.answer_span import locate_answer
from bwprune.scoring.common import strip_think

RUNS = Path(__file__).resolve().parents[2] / "results" / "runs"


def committed_samples() -> list[dict]:
    return [s for _, rows in committed_runs() for s in rows]


def committed_runs() -> list[tuple[Path, list[dict]]]:
    """(run folder, its samples) for every committed generation run."""
    return [
        (path.parent, [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()])
        for path in sorted(RUNS.glob("*/*/*/*/samples.jsonl"))
    ]


def test_no_committed_run_credits_a_cut_completion_without_an_answer():
    samples = committed_samples()
    assert samples, f"no committed samples under {RUNS}"
    credited_cut = [s for s in samples if s["correct"] and s["finish_reason"] == "length"]
    unanswered = [
        s["completion"][-80:]
        for s in credited_cut
        if locate_answer(strip_think(s["completion"], s["think_open"]) or "", cut=True) is None
    ]
    assert unanswered == []


@pytest.mark.slow
def test_committed_scores_are_the_current_scorers():
    stale = []
    for folder, samples in committed_runs():
        benchmark = build(OmegaConf.load(folder / "config.yaml").benchmark)
        for s in samples:
            score = benchmark.score(s["completion"], s["gold"], s["finish_reason"], s["think_open"])
            if (score.correct, score.prediction, score.reason) != (
                s["correct"], s["prediction"], s["score_reason"]
            ):  # fmt: skip
                stale.append(f"{folder.name} #{s['index']}")
    assert stale == [], "rescore these runs with scripts/rescore.py"
