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

import inspect
import json
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.base import Benchmark
from bwprune.config import build, build_method
from bwprune.errors import UserError
from bwprune.generation.cost_target import with_rho
from bwprune.generation.evaluate import paired_timing
from bwprune.generation.prepared import prepare_model
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import SamplingConfig
from bwprune.runs.identity import LATE_OPTIONS, current_target
from bwprune.runs.provenance import provenance
from bwprune.runs.recorder import RunRecorder, batch_keys
from bwprune.runs.rescore import resummarize


def remeasure(run_dir: str | Path, current: DictConfig) -> dict:
    """Measure the paired speedup of the run in `run_dir`; returns its new run.json record.

    `current`: this checkout's composed config, which gives `speed` and `paths` (the run's own
    config may predate `speed`, and its paths may be another machine's)."""
    run_dir = Path(run_dir)
    recorder = RunRecorder(run_dir.parent, run_dir.name)
    if not recorder.is_complete():
        raise UserError(f"{str(run_dir)!r} is not a complete run folder (no run.json)")
    cfg = _relocated(OmegaConf.load(run_dir / "config.yaml"), current)
    cfg.method.setdefault("name", run_dir.parent.name)  # recorded before methods carried it
    search = recorder.cost_search()
    if search is not None:  # a matched-cost run ran at the ρ its search chose
        cfg = with_rho(cfg, search["rho"])
    benchmark: Benchmark = build(cfg.benchmark)
    if benchmark.kind != "generate":
        raise UserError(f"{str(run_dir)!r} is a {benchmark.kind} run: it generates nothing to time")
    samples, timings = recorder.rows()
    examples = {e.index: e for e in benchmark.examples()}
    recorded = {RunRecorder.row_key(s): s["completion"] for s in samples}
    method = build_method(cfg.method)
    prepared = prepare_model(cfg, method)
    runner = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    paired = paired_timing(cfg, runner, prepared)
    for timing in timings[: cfg.speed.batches]:
        keys = batch_keys(timing)
        batch = [(examples[i], k) for i, k in keys]
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


def _relocated(recorded: DictConfig, current: DictConfig) -> DictConfig:
    """The run's config made runnable here: this checkout's `speed`, `paths` and engine keys
    (older runs lack them; none changes what is computed), data shipped in the package named in
    this checkout (the run may have been recorded in another folder), a renamed method class
    under its current name, and method options added since at the value the run behaved as."""
    old_data = str(recorded.paths.data_dir)
    new_data = str(current.paths.data_dir)

    def move(node):
        if isinstance(node, dict):
            return {k: move(v) for k, v in node.items()}
        if isinstance(node, list):
            return [move(v) for v in node]
        if isinstance(node, str) and node.startswith(old_data):
            return new_data + node[len(old_data) :]
        return node

    cfg = OmegaConf.create(move(OmegaConf.to_container(recorded, resolve=True)))
    cfg.method._target_ = current_target(cfg.method._target_)
    accepts = inspect.signature(get_class(cfg.method._target_).__init__).parameters
    for (group, key), value in LATE_OPTIONS.items():  # options the run's code did not have yet
        if group == "method" and key in accepts and key not in cfg.method:
            cfg.method[key] = value
    cfg.speed, cfg.paths = current.speed, current.paths
    cfg.generation = OmegaConf.merge(current.generation, cfg.generation)
    return cfg
