"""A finished run's fidelity to dense, measured after the fact (`scripts/measure_quality.py`).

The accuracy runs of the real models generate in vLLM with `quality.enabled=false`: the HF
runner's teacher forcing would cost more than their generation. This gives such a run the
measurement a new run makes with it on: for each recorded batch, in the batches it was generated
in (a shared mask depends on who shares it), the dense model's greedy reference of
`quality.max_tokens` tokens, then the method teacher-forced through it under its own schedule
(`bwprune.generation.quality`). Each sample's `quality` is replaced and run.json re-summarized;
the completions, scores and timings stay as they were.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bwprune.config import build_method
from bwprune.errors import UserError
from bwprune.generation.prepared import prepare_model
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.quality import DenseReference, dense_references, forced_quality
from bwprune.generation.reopened import reopen
from bwprune.generation.runner import SamplingConfig
from bwprune.runs.provenance import provenance
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.rescore import resummarize


def requality(run_dir: str | Path, current: DictConfig) -> dict:
    """Measure KL and NLL to dense for the run in `run_dir`; returns its new run.json record.

    `current`: this checkout's composed config, which gives `quality` (its `enabled` aside)."""
    run = reopen(run_dir, current, "compare with dense")
    cfg = run.cfg
    if cfg.generation.get("batching") == "continuous":
        raise UserError(f"{str(run_dir)!r} streamed its rows, which shared forwards with whoever "
                        "streamed beside them: run it again with quality.enabled=true")  # fmt: skip
    cfg.quality = OmegaConf.merge(current.quality, {"enabled": True})
    batches = [run.batch(t) for t in run.timings]
    references: list[DenseReference] = []
    method = build_method(cfg.method)
    prepared = prepare_model(
        cfg, method, lambda p: references.extend(dense_references(cfg, p, batches))
    )
    runner = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    by_key = {RunRecorder.row_key(s): s for s in run.samples}
    for batch, reference in zip(batches, references):
        ids, attn = runner.encode(batch_prompts(prepared.tokenizer, cfg.model, batch))
        rows = forced_quality(runner, ids, attn, reference, bool(cfg.quality.traces))
        for (example, k), row in zip(batch, rows):
            by_key[(example.index, k)]["quality"] = row
    run.recorder.replace_samples(run.samples)
    measured = provenance(cfg.seed, str(prepared.device))
    return resummarize(run.recorder, cfg, {"quality_measured": measured})
