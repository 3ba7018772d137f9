"""A benchmark's work through the runner: generate, score, record — as soon as it finishes.

Static batches (`generation.batching=static`): samples are on disk after every batch (with their
batch's timing), so an interrupted run loses at most the batch in flight; a resumed run
regenerates exactly the batches with a missing pair, cut as in the first attempt, because a
batch-shared mask depends on who else is in the batch. Continuous batching: every sample is on
disk when it finishes, with a timing line for the time since the previous one. Which rows share a
forward in a stream depends on every row before, so a resumed stream is replayed from its first
problem and writes only the samples not on disk: it is the uninterrupted stream, sample for
sample (rows computed alone, `generation.batch_invariant`, stream only the missing pairs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from bwprune.benchmarks.base import Benchmark, Example
from bwprune.generation.paired import PairedSettings, PairedTiming, pair_status
from bwprune.generation.prepared import PreparedModel, prepare_model
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.quality import (
    DenseReference,
    dense_references,
    forced_quality,
    stream_quality,
)
from bwprune.generation.runner import BatchedRunner, BatchTiming, SamplingConfig
from bwprune.generation.samples import sample_row, timing_row
from bwprune.generation.stream import StreamRunner
from bwprune.methods.base import PruningMethod
from bwprune.models.loading import load_model
from bwprune.runs.identity import target_sparsity
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.tracking import Tracker
from bwprune.scoring.common import prompt_opens_think

log = logging.getLogger(__name__)
Finisher = Callable[[list[int], list, BatchTiming], None]  # items, completions, their timing


class Backend(Protocol):
    """Where a run's tokens are generated (`generation.backend`). It is chosen where a run is
    composed (`bwprune.experiment`), so this module knows only the HF loop's (`HFBackend`)
    and an engine's package may import this one without this one importing it back. Either
    way quality is teacher-forced through the HF runner."""

    def engines(self, cfg: DictConfig, prepared: PreparedModel, runner: BatchedRunner,
                batches: list, timed: bool) -> tuple:  # fmt: skip
        """The static batches' generator (`generate_tokens(ids, attn, progress)`) and, when
        `timed`, its paired timing against dense (`measure(ids, attn, completions)`)."""
        ...

    def stream(self, cfg: DictConfig, prepared: PreparedModel, runner: BatchedRunner,
               batches: list, prompts: Sequence[torch.Tensor], on_finish: Finisher,
               progress: BatchProgress) -> None:  # fmt: skip
        """Continuous batching of `prompts` (1-D ids) through `batch_size` seats; `on_finish`
        receives requests as they finish (`bwprune.generation.stream.StreamRunner.run`)."""
        ...


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
    backend: Backend,
) -> str:
    """Generate every batch that has a (problem, sample) not yet on disk with `backend`; returns
    the device. Under `generation.batching=continuous` the missing pairs stream through the
    slots instead."""
    done = recorder.done_keys()
    todo = [b for b in batches if any((e.index, k) not in done for e, k in b)]
    if not todo:
        return str(cfg.model.device)
    if done:
        log.info("resuming %s: %d examples already recorded", recorder.dir, len(done))
    if done and replays(cfg):
        log.info("replaying the stream from its first problem (who shares a forward depends on "
                 "every row before); only the missing samples are written")  # fmt: skip
        todo = batches
    references: list[DenseReference] = []
    prepared = prepare_model(
        cfg, method, lambda p: references.extend(dense_references(cfg, p, todo))
    )
    runner = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    record = Recording(benchmark, recorder, tracker, done)
    if cfg.generation.batching == "continuous":
        _stream(cfg, prepared, runner, todo, references, record, backend)
    else:
        _static(cfg, prepared, runner, batches, todo, references, record, backend)
    return str(runner.device)


def replays(cfg: DictConfig) -> bool:
    """Whether a resumed run generates its recorded work again: a stream, whose rows share their
    forwards with whoever streams beside them, unless each row is computed alone."""
    gen = cfg.generation
    return gen.batching == "continuous" and not gen.get("batch_invariant", False)


class Recording:
    """Scores finished work and writes it at once (with its timing line), so an interrupted run
    loses only work in flight; the bar shows accuracy and decode tokens/s so far."""

    def __init__(self, benchmark: Benchmark, recorder: RunRecorder, tracker: Tracker, done: set):
        self.benchmark, self.recorder, self.tracker, self.done = benchmark, recorder, tracker, done
        self.correct = self.scored = self.tokens = 0
        self.decode_s = 0.0

    def __call__(self, work, prompts, completions, quality, timing: BatchTiming, bar: tqdm,
                 paired: dict | None = None) -> int:  # fmt: skip
        """Record the pairs of `work` not on disk yet (a replayed stream hands back recorded
        ones too); returns how many were recorded."""
        new = [i for i, (e, k) in enumerate(work) if (e.index, k) not in self.done]
        if not new:
            return 0
        rows = []
        for i in new:
            (e, k), prompt, c = work[i], prompts[i], completions[i]
            think_open = prompt_opens_think(prompt)
            score = self.benchmark.score(c.text, e.gold, c.finish_reason, think_open)
            rows.append(sample_row(e, k, c, score, think_open, quality[i]))
        batch_timing = timing_row([work[i] for i in new], timing)
        if paired is not None:
            batch_timing["paired"] = paired
        self.recorder.append(rows, batch_timing)
        self.tracker.log_batch(rows, batch_timing)
        self.scored += len(rows)
        self.correct += sum(r["correct"] is True for r in rows)
        self.tokens += timing.decode_tokens
        self.decode_s += timing.decode_s
        bar.set_postfix(acc=f"{self.correct / max(self.scored, 1):.3f}",
                        tok_s=f"{self.tokens / max(self.decode_s, 1e-9):.1f}")  # fmt: skip
        return len(rows)


def _static(cfg, prepared: PreparedModel, runner: BatchedRunner, batches, todo, references,
            record: Recording, backend: Backend) -> None:  # fmt: skip
    """Static batches, one at a time: generate, teacher-force the dense reference, record."""
    tokenizer = prepared.tokenizer
    timed = {id(b) for b in batches[: cfg.speed.batches]}  # this job's first batches
    to_time = paired_enabled(cfg) and any(id(b) in timed for b in todo)  # a resumed run: maybe none
    generator, paired = backend.engines(cfg, prepared, runner, todo, to_time)
    bar = tqdm(todo, desc=record.recorder.key, unit="batch", disable=not cfg.progress)
    inside = BatchProgress(bar)

    def show_pairs(status: dict) -> None:  # a timed batch may take minutes: show it moving
        bar.set_postfix_str(pair_status(status))

    for number, batch in enumerate(bar):
        prompts = batch_prompts(tokenizer, cfg.model, batch)
        ids, attn = runner.encode(prompts)
        inside.start()
        completions, timing = generator.generate_tokens(ids, attn, progress=inside)
        quality = (
            forced_quality(runner, ids, attn, references[number], cfg.quality.traces)
            if references
            else [None] * len(batch)
        )
        measured = None
        if paired is not None and id(batch) in timed:
            precision = paired.settings.for_batch(timing.prefill_s + timing.decode_s, len(batches))
            measured = paired.measure(ids, attn, completions, precision, show_pairs)
        record(batch, prompts, completions, quality, timing, bar, measured)


def _stream(cfg, prepared: PreparedModel, runner: BatchedRunner, todo, references,
            record: Recording, backend: Backend) -> None:  # fmt: skip
    """Continuous batching: the pairs of `todo` stream through `batch_size` slots in order; each
    missing one is recorded as it finishes (a replayed stream's recorded ones are skipped, see
    the module). With quality on, the dense references are streamed the same way first
    (teacher-forced), so each sample is written whole."""
    tokenizer = prepared.tokenizer
    work = [(e, k) for batch in todo for e, k in batch]
    if not replays(cfg):  # rows computed alone: only the missing ones need computing
        work = [(e, k) for e, k in work if (e.index, k) not in record.done]
    prompts = batch_prompts(tokenizer, cfg.model, work)
    ids = [tokenizer(p, return_tensors="pt", add_special_tokens=False).input_ids[0]
           for p in prompts]  # fmt: skip
    quality: list = [None] * len(work)
    if references:
        by_pair = {(e.index, k): ref.row(b) for batch, ref in zip(todo, references)
                   for b, (e, k) in enumerate(batch)}  # fmt: skip
        refs = [by_pair[(e.index, k)] for e, k in work]
        stream = StreamRunner(runner, int(cfg.batch_size))
        quality = stream_quality(stream, ids, refs, bool(cfg.quality.traces))
    missing = sum((e.index, k) not in record.done for e, k in work)
    bar = tqdm(total=missing, desc=record.recorder.key, unit="sample",
               disable=not cfg.progress)  # fmt: skip
    inside = BatchProgress(bar)

    def finished(items: list[int], completions, timing: BatchTiming) -> None:
        pick = [work[i] for i in items], [prompts[i] for i in items]
        bar.update(record(*pick, completions, [quality[i] for i in items], timing, bar))

    backend.stream(cfg, prepared, runner, todo, ids, finished, inside)
    bar.close()


def paired_enabled(cfg: DictConfig) -> bool:
    """`speed.paired`: true, false, or auto (on when the method prunes: target ρ > 0, and the
    batches are static: the paired timing redoes a batch's work, which a stream does not have)."""
    setting = str(cfg.speed.paired).lower()
    static = cfg.generation.batching == "static"
    return setting == "true" or (setting == "auto" and static and target_sparsity(cfg) > 0)


def paired_timing(cfg: DictConfig, runner: BatchedRunner, prepared: PreparedModel) -> PairedTiming:
    """The run's paired timing of `runner` against dense: the runner's own model when the method
    leaves the weights alone, else the model loaded once more, as the first was (a `deepcopy`
    ran 7 % slower than a loaded model on this project's CPU, which would bias the ratio). Kept
    sets in place (`generation.kept_weights=in_place`) replace the MLPs' projections with ones a
    dense step runs slower (down from its rows): dense is timed on a model of its own then too."""
    settings = PairedSettings.from_config(cfg.speed)
    in_place = cfg.generation.get("kept_weights", "buffers") == "in_place"
    dense = (
        load_model(cfg.model, cfg.paths.cache_dir)[0]
        if prepared.method.edits_weights or in_place
        else prepared.model
    )
    return PairedTiming(runner, prepared.adapter, dense, settings)


class HFBackend:
    """`generation.backend=hf`: our decode loop generates (`bwprune.generation.runner`)."""

    def engines(
        self,
        cfg: DictConfig,
        prepared: PreparedModel,
        runner: BatchedRunner,
        batches: list,
        timed: bool,
    ) -> tuple[BatchedRunner, PairedTiming | None]:
        return runner, paired_timing(cfg, runner, prepared) if timed else None

    def stream(self, cfg: DictConfig, prepared: PreparedModel, runner: BatchedRunner,
               batches: list, prompts: Sequence[torch.Tensor], on_finish: Finisher,
               progress: BatchProgress) -> None:  # fmt: skip
        StreamRunner(runner, int(cfg.batch_size)).run(prompts, on_finish, progress=progress)
