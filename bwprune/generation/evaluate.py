"""A benchmark's batches through the runner: generate, score, record — one batch at a time.

Samples are on disk after every batch (with their batch's timing), so an interrupted run loses at
most the batch in flight; a resumed run regenerates exactly the batches with a missing pair, cut
as in the first attempt, because a batch-shared mask depends on who else is in the batch.
"""

from __future__ import annotations

import logging
import time

from omegaconf import DictConfig
from tqdm import tqdm

from bwprune.benchmarks.base import Benchmark, Example
from bwprune.generation.paired import PairedSettings, PairedTiming
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.methods.base import PruningMethod
from bwprune.models.loading import load_model
from bwprune.prepared import PreparedModel, prepare_model
from bwprune.quality import DenseReference, dense_references, forced_quality
from bwprune.records import RunRecorder, sample_row, target_sparsity, timing_row
from bwprune.scoring.common import prompt_opens_think
from bwprune.tracking import Tracker

log = logging.getLogger(__name__)


class BatchProgress:
    """Progress inside a batch on the bar's line — decode step, live rows, tokens/s — refreshed
    at most once a second: at 7-8B a batch is thousands of steps, and the bar over batches alone
    would sit still for minutes. It reads host values the decode loop has anyway."""

    def __init__(self, bar: tqdm, every_s: float = 1.0) -> None:
        self.bar, self.every_s = bar, every_s
        self.start()

    def start(self) -> None:
        self._t0 = self._shown = time.perf_counter()
        self._tokens = 0

    def __call__(self, step: int, live: int) -> None:
        self._tokens += live
        now = time.perf_counter()
        if now - self._shown >= self.every_s and not self.bar.disable:
            self._shown = now
            rate = self._tokens / (now - self._t0)
            self.bar.set_postfix_str(f"step {step + 1}, live rows {live}, {rate:.1f} tok/s")


def generate_missing(
    cfg: DictConfig,
    benchmark: Benchmark,
    method: PruningMethod,
    batches: list[list[tuple[Example, int]]],
    recorder: RunRecorder,
    tracker: Tracker,
) -> str:
    """Generate every batch that has a (problem, sample) not yet on disk; returns the device."""
    done = recorder.done_keys()
    todo = [b for b in batches if any((e.index, k) not in done for e, k in b)]
    if not todo:
        return str(cfg.model.device)
    if done:
        log.info("resuming %s: %d examples already recorded", recorder.dir, len(done))
    references: list[DenseReference] = []
    prepared = prepare_model(
        cfg, method, lambda p: references.extend(dense_references(cfg, p, todo))
    )
    model, tokenizer, adapter = prepared.model, prepared.tokenizer, prepared.adapter
    runner = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    timed = {id(b) for b in batches[: cfg.speed.batches]}  # this job's first batches
    to_time = paired_enabled(cfg) and any(id(b) in timed for b in todo)  # a resumed run: maybe none
    paired = paired_timing(cfg, runner, prepared) if to_time else None
    correct = tokens = scored = 0
    decode_s = 0.0
    bar = tqdm(todo, desc=recorder.key, unit="batch", disable=not cfg.progress)
    inside = BatchProgress(bar)
    for number, batch in enumerate(bar):
        prompts = batch_prompts(tokenizer, cfg.model, batch)
        ids, attn = runner.encode(prompts)
        inside.start()
        with method.attach(model, adapter):
            completions, timing = runner.generate_tokens(ids, attn, progress=inside)
            quality = (
                forced_quality(runner, ids, attn, references[number], cfg.quality.traces)
                if references
                else [None] * len(batch)
            )
        rows = []
        for (e, k), prompt, c, q in zip(batch, prompts, completions, quality):
            if (e.index, k) not in done:
                think_open = prompt_opens_think(prompt)
                score = benchmark.score(c.text, e.gold, c.finish_reason, think_open)
                rows.append(sample_row(e, k, c, score, think_open, q))
        batch_timing = timing_row(batch, timing)
        if paired is not None and id(batch) in timed:
            bar.set_postfix_str("timing dense vs method on this batch")
            batch_timing["paired"] = paired.measure(ids, attn, completions)
        recorder.append(rows, batch_timing)
        tracker.log_batch(rows, batch_timing)
        scored += len(rows)
        correct += sum(r["correct"] is True for r in rows)
        tokens += timing.decode_tokens
        decode_s += timing.decode_s
        bar.set_postfix(acc=f"{correct / scored:.3f}", tok_s=f"{tokens / max(decode_s, 1e-9):.1f}")
    return str(runner.device)


def paired_enabled(cfg: DictConfig) -> bool:
    """`speed.paired`: true, false, or auto (on when the method prunes: target ρ > 0)."""
    setting = str(cfg.speed.paired).lower()
    return setting == "true" or (setting == "auto" and target_sparsity(cfg) > 0)


def paired_timing(cfg: DictConfig, runner: BatchedRunner, prepared: PreparedModel) -> PairedTiming:
    """The run's paired timing of `runner` against dense: the runner's own model when the method
    leaves the weights alone, else the model loaded once more, as the first was (a `deepcopy`
    ran 7 % slower than a loaded model on this project's CPU, which would bias the ratio)."""
    s = cfg.speed
    settings = PairedSettings(int(s.batches), int(s.repeats), int(s.warmup))
    dense = (
        load_model(cfg.model, cfg.paths.cache_dir)[0]
        if prepared.method.edits_weights
        else prepared.model
    )
    return PairedTiming(runner, prepared.adapter, dense, settings)
