"""One run, end to end: compose model × method × benchmark, generate, score, record.

This is the only module that wires the pieces together; it names no method and no benchmark
(they are built from their config groups with `instantiate`). It owns every `finally`: the
method's hooks are removed and the tracker is closed whatever happens, and samples are on disk
after every batch, so an interrupted run loses at most the batch in flight.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from bwprune.benchmarks.base import Benchmark, Example
from bwprune.config import validate
from bwprune.errors import UserError
from bwprune.generation.prompts import render_prompt
from bwprune.generation.runner import BatchedRunner, BatchTiming, Completion, SamplingConfig
from bwprune.methods.base import PruningMethod
from bwprune.perplexity import evaluate_perplexity
from bwprune.prepared import PreparedModel, prepare_model
from bwprune.quality import DenseReference, dense_reference, forced_quality
from bwprune.records import (
    RunRecorder,
    method_name,
    provenance,
    run_key,
    summarize,
    target_sparsity,
)
from bwprune.scoring.common import Score, prompt_opens_think
from bwprune.shards import merge_shards, shard_batches
from bwprune.tracking import Tracker, make_tracker

log = logging.getLogger(__name__)


def build(node: DictConfig) -> Any:
    """`instantiate`, with a constructor's `UserError` surfaced as itself (not Hydra's wrapper)."""
    try:
        return instantiate(node)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, (UserError, ValueError, TypeError)):
            raise UserError(f"{node.get('_target_')}: {cause}") from None
        raise


def select_examples(examples: list[Example], cfg: DictConfig) -> list[Example]:
    """The `subset` (by dataset id, file order kept), then its first `limit`.

    Sharding comes after, over whole batches (`bwprune.shards`), so a shard's batches are batches
    of the unsharded run.
    """
    if cfg.subset is not None:
        if not OmegaConf.is_list(cfg.subset):
            raise UserError(f"subset={cfg.subset!r} must be a list of ids, e.g. subset=[0,5,17]")
        examples = _subset(examples, [str(i) for i in cfg.subset])
    return examples[: cfg.limit] if cfg.limit is not None else examples


def _subset(examples: list[Example], ids: list[str]) -> list[Example]:
    """Examples whose id is in `ids`; an id the benchmark lacks is a `UserError` naming it."""
    known = {e.id for e in examples}
    unknown = [i for i in ids if i not in known]
    if not ids or unknown:
        hint = [e.id for e in examples[:3]]
        raise UserError(f"subset={unknown or ids} names no example; ids look like {hint}")
    wanted = set(ids)
    return [e for e in examples if e.id in wanted]


def work_items(examples: list[Example], num_samples: int) -> list[tuple[Example, int]]:
    """(example, sample) pairs, sample-major: pass k over all problems, then pass k + 1.

    Copies of one prompt in a batch would agree on which neurons matter and flatter any
    batch-shared pruning; sample-major order keeps batches a mix of different problems.
    """
    return [(e, k) for k in range(num_samples) for e in examples]


def sample_row(
    example: Example,
    sample: int,
    completion: Completion,
    score: Score,
    think_open: bool,
    quality: dict | None = None,
) -> dict:
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
        "quality": quality,  # teacher-forced fidelity to dense (bwprune/quality.py), or None
    }


def run(cfg: DictConfig) -> dict:
    """Run (or resume, or skip if complete) the configured job; returns its `run.json` record.

    A shard's job also merges the shards into the unsharded run once they are all complete.
    """
    record = _run_job(cfg)
    if cfg.num_shards > 1:
        merge_shards(cfg)
    return record


def _run_job(cfg: DictConfig) -> dict:
    validate(cfg)
    key = run_key(cfg)
    recorder = RunRecorder(cfg.paths.runs_dir, key)
    if recorder.is_complete():
        log.info("complete run found, skipping: %s", recorder.dir)
        return recorder.record()
    benchmark: Benchmark = build(cfg.benchmark)
    if benchmark.kind == "perplexity":
        return _run_perplexity(cfg, benchmark, recorder)
    items = work_items(select_examples(benchmark.examples(), cfg), _num_samples(cfg))
    batches = shard_batches(items, cfg.batch_size, cfg.shard, cfg.num_shards)
    recorder.start(cfg)
    method = build(cfg.method)  # bad method arguments fail here, before the model loads
    tracker = make_tracker(cfg, key, method_name(cfg))
    try:
        device = _generate_missing(cfg, benchmark, method, batches, recorder, tracker)
        wanted = {(e.index, k) for batch in batches for e, k in batch}
        samples = sorted(
            (s for s in recorder.samples() if RunRecorder.row_key(s) in wanted),
            key=RunRecorder.row_key,
        )
        metrics = summarize(samples, recorder.timings(), target_sparsity(cfg))
        names = {"benchmark": benchmark.name, "model": cfg.model.name, "method": method_name(cfg)}
        record = recorder.finish(metrics, provenance(cfg.seed, device), extra=names)
        tracker.log_run(record, samples)
        return record
    finally:
        tracker.finish()


def _run_perplexity(cfg: DictConfig, benchmark: Benchmark, recorder: RunRecorder) -> dict:
    """A `kind = "perplexity"` benchmark: one evaluation, no samples; run.json holds the metrics."""
    if cfg.num_shards > 1:
        raise UserError(
            f"num_shards={cfg.num_shards}: benchmark={benchmark.name} is one perplexity "
            "evaluation and cannot be sharded; shard/num_shards apply to generation benchmarks"
        )
    recorder.start(cfg)
    method = build(cfg.method)
    tracker = make_tracker(cfg, recorder.key, method_name(cfg))
    try:
        p = prepare_model(cfg, method)
        metrics = evaluate_perplexity(
            p.model, p.tokenizer, method, p.adapter, benchmark, cfg.batch_size, p.ledger
        )
        metrics["target_sparsity"] = target_sparsity(cfg)
        names = {"benchmark": benchmark.name, "model": cfg.model.name, "method": method_name(cfg)}
        record = recorder.finish(metrics, provenance(cfg.seed, str(p.device)), extra=names)
        tracker.log_run(record, [])
        return record
    finally:
        tracker.finish()


def _num_samples(cfg: DictConfig) -> int:
    """`generation.num_samples`: completions per problem, for pass@1 over samples."""
    n, gen = int(cfg.generation.num_samples), cfg.generation
    if n < 1 or (n > 1 and not gen.do_sample):
        raise UserError(
            f"generation.num_samples={n} must be >= 1, and 1 unless sampling "
            "(generation=sampled): greedy samples would all be the same"
        )
    return n


def _generate_missing(
    cfg: DictConfig,
    benchmark: Benchmark,
    method: Any,
    batches: list[list[tuple[Example, int]]],
    recorder: RunRecorder,
    tracker: Tracker,
) -> str:
    """Generate every batch that has a (problem, sample) not yet on disk; returns the device.

    Batches are cut from the full selection, so a resumed run sees the same batch compositions
    (a batch-shared mask depends on who else is in the batch).
    """
    done = recorder.done_keys()
    todo = [b for b in batches if any((e.index, k) not in done for e, k in b)]
    if not todo:
        return str(cfg.model.device)
    if done:
        log.info("resuming %s: %d examples already recorded", recorder.dir, len(done))
    references: list[DenseReference] = []
    prepared = prepare_model(cfg, method, lambda p: references.extend(_dense_refs(cfg, p, todo)))
    model, tokenizer, adapter = prepared.model, prepared.tokenizer, prepared.adapter
    gen = cfg.generation
    sampling = SamplingConfig(gen.max_new_tokens, gen.do_sample, gen.temperature, gen.top_p)
    runner = prepared.runner(sampling, cfg.seed)
    correct = tokens = 0
    decode_s = 0.0
    scored = 0
    bar = tqdm(todo, desc=recorder.key, unit="batch", disable=not cfg.progress)
    with method.attach(model, adapter):
        for number, batch in enumerate(bar):
            prompts = _prompts(cfg, tokenizer, batch)
            ids, attn = runner.encode(prompts)
            completions, timing = runner.generate_tokens(ids, attn)
            quality = (
                forced_quality(runner, ids, attn, references[number], cfg.quality.traces)
                if references
                else [None] * len(batch)
            )
            rows = []
            for (e, k), prompt, c, q in zip(batch, prompts, completions, quality):
                if (e.index, k) not in done:
                    think_open = prompt_opens_think(prompt)
                    score = benchmark.score(c.text, e.gold, think_open)
                    rows.append(sample_row(e, k, c, score, think_open, q))
            timing_row = _timing_row(batch, timing)
            recorder.append(rows, timing_row)
            tracker.log_batch(rows, timing_row)
            scored += len(rows)
            correct += sum(r["correct"] is True for r in rows)
            tokens += timing.decode_tokens
            decode_s += timing.decode_s
            bar.set_postfix(
                acc=f"{correct / scored:.3f}", tok_s=f"{tokens / max(decode_s, 1e-9):.1f}"
            )
    return str(runner.device)


def _prompts(cfg: DictConfig, tokenizer: Any, batch: list[tuple[Example, int]]) -> list[str]:
    return [render_prompt(tokenizer, cfg.model, e.question) for e, _ in batch]


def _timing_row(batch: list[tuple[Example, int]], timing: BatchTiming) -> dict:
    return {
        "indices": [e.index for e, _ in batch],
        "samples": [k for _, k in batch],
        "prefill_s": timing.prefill_s,
        "decode_s": timing.decode_s,
        "decode_tokens": timing.decode_tokens,
        "step_ms": [round(1e3 * s, 4) for s in timing.step_s],
    }


def _dense_refs(
    cfg: DictConfig, prepared: PreparedModel, todo: list[list[tuple[Example, int]]]
) -> list[DenseReference]:
    """`quality.enabled`: the dense model's greedy reference for every batch to generate, made
    before the method is prepared (static methods edit the weights in `prepare`)."""
    q = cfg.quality
    if not q.enabled:
        return []
    dense = BatchedRunner(
        prepared.model, prepared.tokenizer, PruningMethod(), prepared.adapter,
        SamplingConfig(q.max_tokens),
    )  # fmt: skip
    bar = tqdm(todo, desc="dense references", unit="batch", disable=not cfg.progress)
    return [
        dense_reference(dense, *dense.encode(_prompts(cfg, prepared.tokenizer, b)), q.top_k)
        for b in bar
    ]


def rescore(run_dir: str | Path) -> dict:
    """Re-score a run from its samples, without a model; rewrites samples.jsonl and run.json."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.exists():
        raise UserError(f"{str(run_dir)!r} is not a run folder (no config.yaml)")
    cfg = OmegaConf.load(config_path)
    benchmark: Benchmark = build(cfg.benchmark)
    recorder = RunRecorder(run_dir.parent, run_dir.name)
    samples = recorder.samples()
    for s in samples:
        score = benchmark.score(s["completion"], s["gold"], s.get("think_open", False))
        s.update(prediction=score.prediction, correct=score.correct, score_reason=score.reason)
    tmp = recorder.samples_path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
    tmp.replace(recorder.samples_path)
    old = recorder.record() if recorder.is_complete() else {}
    metrics = summarize(samples, recorder.timings(), target_sparsity(cfg))
    prov = old.get("provenance") or provenance(cfg.seed, str(cfg.model.device))
    extra = {k: old[k] for k in ("benchmark", "model", "method") if k in old}
    recorder.key = old.get("run_key", run_dir.name)
    return recorder.finish(metrics, prov, extra={**extra, "rescored": True})
