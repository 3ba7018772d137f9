"""One run, end to end: compose model × method × benchmark, evaluate, record. Composes and
dispatches only: selection is `bwprune.benchmarks.selection`, generation
`bwprune.generation.evaluate`, perplexity `bwprune.generation.perplexity`, records `bwprune.runs`,
the search for a matched-cost run's ρ `bwprune.generation.cost_target`.

It names no method and no benchmark (they are built from their config groups). It owns every
`finally`: the tracker is closed whatever happens, and the evaluations write as they go, so an
interrupted run loses at most the batch in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.base import Benchmark, Example
from bwprune.benchmarks.selection import num_samples, select_examples, work_items
from bwprune.config import build, build_method, validate
from bwprune.errors import UserError
from bwprune.generation.cost_target import CostTarget
from bwprune.generation.evaluate import Backend, HFBackend, generate_missing
from bwprune.generation.perplexity import evaluate_perplexity
from bwprune.generation.prepared import prepare_model
from bwprune.methods.base import PruningMethod
from bwprune.runs.identity import method_name, run_key, target_sparsity
from bwprune.runs.pairing import time_to_answer_vs_dense
from bwprune.runs.provenance import provenance
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.shards import merge_shards, shard_batches, with_shard
from bwprune.runs.summary import summarize
from bwprune.runs.tracking import Tracker, make_tracker
from bwprune.vllm.binding.support import refuse_unsupported

log = logging.getLogger(__name__)

# (cfg, benchmark, method, recorder, tracker) -> (metrics, device, sample rows)
Evaluation = Callable[
    [DictConfig, Benchmark, PruningMethod, RunRecorder, Tracker], tuple[dict, str, list]
]


def run(cfg: DictConfig) -> dict:
    """Run (or resume, or skip if complete) the configured job; returns its `run.json` record,
    with `stored: True` added when the run was complete already (its numbers are that run's).

    A shard's job also merges the shards into the unsharded run once they are all complete, and
    is skipped once that run is complete: a clone that keeps merged runs only (their shards'
    folders were not committed) resumes a sharded sweep without redoing a shard.
    """
    validate(cfg)
    if cfg.num_shards > 1:
        whole = RunRecorder(cfg.paths.runs_dir, run_key(with_shard(cfg, 0, 1)))
        if whole.is_complete():
            return _stored(whole)
    record = _run_job(cfg)
    if cfg.num_shards > 1:
        merge_shards(cfg)
    return record


def _run_job(cfg: DictConfig) -> dict:
    recorder = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    if recorder.is_complete():
        return _stored(recorder)
    benchmark: Benchmark = build(cfg.benchmark)
    evaluate = _perplexity_evaluation(cfg, benchmark) if benchmark.kind == "perplexity" else (
        partial(_generation, batches=_batches(cfg, benchmark))
    )  # fmt: skip
    method = build_method(cfg.method)  # bad method arguments fail here, before any folder
    cost = CostTarget.from_config(cfg, benchmark)  # and bad cost settings; None: no cost target
    name = method_name(cfg)
    if cfg.generation.backend == "vllm":
        refuse_unsupported(cfg, benchmark.kind)
    if cfg.generation.get("batch_invariant") and method.batch_coupled:
        raise UserError(
            f"generation.batch_invariant=true computes each row alone, but method={name} shares "
            "decisions across its batch (batch_coupled); use a method whose rows are independent "
            "(docs/methods.md says which are, and which options make them so)"
        )
    with recorder.owned():  # another process of this config: wait for it, then reuse its run
        if recorder.is_complete():
            return _stored(recorder)
        recorder.start(cfg)
        if cost is not None:  # the method at the ρ that realizes the target (searched once)
            cfg = cost.matched(cfg, recorder)
            method = build_method(cfg.method)
        tracker = make_tracker(cfg, recorder.key, name)
        try:
            metrics, device, samples = evaluate(cfg, benchmark, method, recorder, tracker)
            names = {"benchmark": benchmark.name, "model": cfg.model.name, "method": name}
            record = recorder.finish(metrics, provenance(cfg.seed, device), extra=names)
            tracker.log_run(record, samples)
            return record
        finally:
            tracker.finish()


def _stored(recorder: RunRecorder) -> dict:
    log.info("complete run found, skipping: %s", recorder.dir)
    return {**recorder.record(), "stored": True}


def _batches(cfg: DictConfig, benchmark: Benchmark) -> list[list[tuple[Example, int]]]:
    """This job's batches: selected (problem, sample) pairs, cut into batches, then sharded."""
    items = work_items(select_examples(benchmark.examples(), cfg), num_samples(cfg))
    return shard_batches(items, cfg.batch_size, cfg.shard, cfg.num_shards)


def _generation(
    cfg: DictConfig,
    benchmark: Benchmark,
    method: PruningMethod,
    recorder: RunRecorder,
    tracker: Tracker,
    batches: list[list[tuple[Example, int]]],
) -> tuple[dict, str, list]:
    device = generate_missing(cfg, benchmark, method, batches, recorder, tracker, _backend(cfg))
    samples, timings = recorder.rows()
    samples = sorted(samples, key=RunRecorder.row_key)
    metrics = summarize(samples, timings, target_sparsity(cfg), recorder.cost_search())
    resolved = OmegaConf.to_container(cfg, resolve=True)
    waits = time_to_answer_vs_dense(recorder.dir, resolved, metrics)  # length changes included
    if waits is not None:
        metrics["time_to_answer"] = waits
    return metrics, device, samples


def _backend(cfg: DictConfig) -> Backend:
    """The run's generation host (`generation.backend`, validated by `bwprune.config`). vLLM is
    imported only by the runs that use it: importing it takes seconds and sets its logging."""
    if cfg.generation.backend == "vllm":
        from bwprune.vllm.running.backend import VLLMBackend

        return VLLMBackend()
    return HFBackend()


def _perplexity_evaluation(cfg: DictConfig, benchmark: Benchmark) -> Evaluation:
    """A `kind = "perplexity"` benchmark: one evaluation, no samples; run.json holds the metrics."""
    if cfg.num_shards > 1:
        raise UserError(
            f"num_shards={cfg.num_shards}: benchmark={benchmark.name} is one perplexity "
            "evaluation and cannot be sharded; shard/num_shards apply to generation benchmarks"
        )
    if cfg.subset is not None:
        raise UserError(
            f"subset={list(cfg.subset)}: benchmark={benchmark.name} is cut into windows, which "
            "have no ids; limit=N evaluates its first N windows"
        )

    def evaluate(cfg, benchmark, method, recorder, tracker) -> tuple[dict, str, list]:
        p = prepare_model(cfg, method)
        metrics = evaluate_perplexity(
            p.model, p.tokenizer, method, p.adapter, benchmark, cfg.batch_size, p.ledger, cfg.limit
        )
        metrics["target_sparsity"] = target_sparsity(cfg)
        return metrics, str(p.device), []

    return evaluate
