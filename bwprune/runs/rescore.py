"""Re-scoring a finished run from its records, without a model (`scripts/rescore.py`).

Scoring is a pure function of the stored completion and gold, so a scorer fix reaches every
committed run: samples.jsonl is rewritten (atomically) and run.json re-summarized, keeping the
run's provenance and marking it `rescored`.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.base import Benchmark
from bwprune.config import build
from bwprune.errors import UserError
from bwprune.runs.identity import target_sparsity
from bwprune.runs.pairing import time_to_answer_vs_dense
from bwprune.runs.provenance import provenance
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.summary import summarize


def rescore(run_dir: str | Path) -> dict:
    """Re-score a run from its samples; rewrites samples.jsonl and run.json."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        raise UserError(f"{str(run_dir)!r} is not a run folder (no config.yaml)")
    cfg = OmegaConf.load(config_path)
    benchmark: Benchmark = build(cfg.benchmark)
    if benchmark.kind != "generate":  # rescoring would overwrite its metrics with empty ones
        raise UserError(f"{str(run_dir)!r} is a {benchmark.kind} run: it has no answers to score")
    recorder = RunRecorder(run_dir.parent, run_dir.name)
    if not recorder.is_complete():  # a run.json now would mark it complete, and never resumed
        raise UserError(f"{str(run_dir)!r} is not complete (no run.json); run its command again: "
                        "it resumes the run and scores it with the current scorers")  # fmt: skip
    samples, _ = recorder.rows()
    for s in samples:
        score = benchmark.score(
            s["completion"], s["gold"], s["finish_reason"], s.get("think_open", False)
        )
        s.update(prediction=score.prediction, correct=score.correct, score_reason=score.reason)
    recorder.replace_samples(samples)
    return resummarize(recorder, cfg, {"rescored": True})


def resummarize(recorder: RunRecorder, cfg: DictConfig, marks: dict) -> dict:
    """run.json again from the rows on disk, keeping the run's provenance and names; `marks` say
    what was done to the record. finished_at stays the generation's: it dates the samples, which
    are kept (and run.py names it when it shows a complete run's stored numbers)."""
    samples, timings = recorder.rows()
    old = recorder.record() if recorder.is_complete() else {}
    metrics = summarize(samples, timings, target_sparsity(cfg), recorder.cost_search())
    resolved = OmegaConf.to_container(cfg, resolve=True)
    waits = time_to_answer_vs_dense(recorder.dir, resolved, metrics)
    if waits is not None:
        metrics["time_to_answer"] = waits
    prov = old.get("provenance") or provenance(cfg.seed, str(cfg.model.device))
    kept = ("benchmark", "model", "method", "finished_at", "rescored", "speed_measured",
            "quality_measured")  # fmt: skip
    extra = {k: old[k] for k in kept if k in old}
    recorder.key = old.get("run_key", recorder.dir.name)
    return recorder.finish(metrics, prov, extra={**extra, **marks})
