"""Re-scoring a finished run from its records, without a model (`scripts/rescore.py`).

Scoring is a pure function of the stored completion and gold, so a scorer fix reaches every
committed run: samples.jsonl is rewritten (atomically) and run.json re-summarized, keeping the
run's provenance and marking it `rescored`.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import OmegaConf

from bwprune.benchmarks.base import Benchmark
from bwprune.config import build
from bwprune.errors import UserError
from bwprune.provenance import provenance
from bwprune.records import RunRecorder, target_sparsity
from bwprune.summary import summarize


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
    samples, timings = recorder.rows()
    for s in samples:
        score = benchmark.score(
            s["completion"], s["gold"], s["finish_reason"], s.get("think_open", False)
        )
        s.update(prediction=score.prediction, correct=score.correct, score_reason=score.reason)
    tmp = recorder.samples_path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
    tmp.replace(recorder.samples_path)
    old = recorder.record() if recorder.is_complete() else {}
    metrics = summarize(samples, timings, target_sparsity(cfg), recorder.cost_search())
    prov = old.get("provenance") or provenance(cfg.seed, str(cfg.model.device))
    # finished_at stays the generation's: it dates the samples, which rescoring keeps (and run.py
    # names it when it shows a complete run's stored numbers).
    extra = {k: old[k] for k in ("benchmark", "model", "method", "finished_at") if k in old}
    recorder.key = old.get("run_key", run_dir.name)
    return recorder.finish(metrics, prov, extra={**extra, "rescored": True})
