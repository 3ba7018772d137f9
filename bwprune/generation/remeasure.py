"""A finished run's paired speedup, measured after the fact (`scripts/measure_speedup.py`).

Runs recorded before paired timing existed (or with `speed.paired=false`) get the measurement a
new run makes while it generates: the run's first `speed.batches` batches, as recorded in its
timing.jsonl, are generated again under the run's own config (greedy decoding gives the recorded
completions back; how many match is stored with the measurement), then timed against dense by the
same `PairedTiming` (pairs added until the interval is tight, `speed`). The timing rows gain
their `paired` entry, later batches' entries from an earlier timing are dropped (the speedup then
rests on one procedure), and run.json is re-summarized, keeping the run's provenance and adding
that of the measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from bwprune.config import build_method
from bwprune.generation.evaluate import paired_timing
from bwprune.generation.prepared import prepare_model
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.reopened import reopen
from bwprune.generation.runner import SamplingConfig
from bwprune.runs.provenance import provenance
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.rescore import resummarize


def remeasure(run_dir: str | Path, current: DictConfig) -> dict:
    """Measure the paired speedup of the run in `run_dir`; returns its new run.json record.

    `current`: this checkout's composed config, which gives `speed` and `paths` (the run's own
    config may predate `speed`, and its paths may be another machine's)."""
    run = reopen(run_dir, current, "time")
    recorder, cfg, timings = run.recorder, run.cfg, run.timings
    recorded = {RunRecorder.row_key(s): s["completion"] for s in run.samples}
    method = build_method(cfg.method)
    prepared = prepare_model(cfg, method)
    runner = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    paired = paired_timing(cfg, runner, prepared)
    for timing in timings[: cfg.speed.batches]:
        batch = run.batch(timing)
        keys = [(e.index, k) for e, k in batch]
        ids, attn = runner.encode(batch_prompts(prepared.tokenizer, cfg.model, batch))
        completions, _ = runner.generate_tokens(ids, attn)
        generated_s = timing["prefill_s"] + timing["decode_s"]  # as the run generated it
        precision = paired.settings.for_batch(generated_s, len(timings))
        timing["paired"] = paired.measure(ids, attn, completions, precision)
        timing["paired"]["replayed_equal"] = sum(
            c.text == recorded[key] for c, key in zip(completions, keys)
        )
    for timing in timings[cfg.speed.batches :]:  # timed before, maybe by an older procedure:
        timing.pop("paired", None)  # the summary rests on this measurement alone
    tmp = recorder.timing_path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in timings))
    tmp.replace(recorder.timing_path)
    measured = provenance(cfg.seed, str(prepared.device))
    return resummarize(recorder, cfg, {"speed_measured": measured})


def runs_without_interval(root: str | Path) -> list[Path]:
    """The complete runs under `root` whose speedup was timed before intervals (a min-max
    alone), in path order: what is left to re-time with the procedure of today."""
    found = []
    for record in sorted(Path(root).glob("**/run.json")):
        speedup = json.loads(record.read_text()).get("metrics", {}).get("speedup")
        if speedup is not None and "interval" not in speedup:
            found.append(record.parent)
    return found
