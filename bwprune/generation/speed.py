"""Decode-speed measurement users can trust, with the memory-bandwidth bound next to it.

All methods are measured in ONE process on the same prompts, after warm-up, alternating the order
every repeat (A B C, C B A, ...) so drift hits all of them alike; every generation is forced to
exactly `new_tokens` tokens (no early EOS) so every method does the same work. Speedups are taken
pair by pair against dense within a repeat; repeats are added until every speedup's interval of
the median is tight (`alternate_until`, the procedure of a run's paired timing), and the median,
range and interval over repeats are reported, with the load the machine was under.

The bound (`bwprune.runs.speedup`): a decode step reads every weight once, so skipping parameters
can at best speed a step up by bytes(dense) / bytes(kept). For a scheduled method (dense and sparse
steps mixed) the ideal is 1 / (f_dense + f_sparse / r), with r either that bound or the measured
sparse-step speedup. The trials are timed and alternated by the same code as a run's paired timing
(`bwprune.generation.paired`). This module imports neither Hydra nor OmegaConf, so it runs where
only torch and transformers are.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import TypeVar

import torch
from torch import nn

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.realized import combine
from bwprune.generation.paired import pair_status, weight_bytes
from bwprune.generation.runner import (
    BatchedRunner,
    BatchTiming,
    EngineConfig,
    Forcing,
    SamplingConfig,
)
from bwprune.generation.stream import StreamRunner
from bwprune.generation.timing import Precision, alternate_until
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import ModelAdapter, adapter_for
from bwprune.runs.speedup import median_interval, schedule_ideal, sparse_step_bound, spread

HF_GENERATE = "hf_generate"  # label of the reference: transformers' own generate loop, dense
T = TypeVar("T")


def _time_hf_generate(model: nn.Module, ids: torch.Tensor, new_tokens: int) -> dict:
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
    )  # fmt: skip
    sync()
    return {"e2e_s": time.perf_counter() - start}


def measure(
    model: nn.Module,
    tokenizer,
    adapter: ModelAdapter,
    methods: Mapping[str, PruningMethod],
    batch_sizes: list[int],
    precision: Precision,
    new_tokens: int = 128,
    prompt_len: int = 64,
    warmup: int = 1,
    seed: int = 0,
    with_hf_generate: bool = True,
    log: Callable[[str], None] = lambda _: None,
    engines: Mapping[str, EngineConfig] | None = None,
    in_place: Iterable[str] = (),
) -> list[dict]:
    """One row per (batch size, method, engine): timings with spread, speedup vs dense with its
    interval, bounds, and how the repeats met `precision` (`precision` of each row).

    The methods named in `in_place` keep their kept sets in place (`generation.kept_weights`),
    on a copy of the model of their own: it replaces the MLPs' projections, which every other
    row would then run.

    `methods` must contain "dense"; each method must already be prepared. Prompts are random
    token ids of `prompt_len` (no padding), the same for every method. `engines` maps a label to
    an engine (default: the eager engine alone); rows of engine `e` are labelled `method@e`
    (plain `method` for `eager`) and their speedups are against `dense` on the same engine.
    Runners are made once and reused, so a compiled step is compiled during warm-up only.
    """
    engines = engines or {"eager": EngineConfig()}
    device = next(model.parameters()).device
    sampling = SamplingConfig(new_tokens, ignore_eos=True)
    in_place = set(in_place)
    copied = copy.deepcopy(model) if in_place else None
    runners = {
        _label(name, engine): BatchedRunner(
            *((copied, tokenizer, method, adapter_for(copied)) if name in in_place else
              (model, tokenizer, method, adapter)),
            sampling, engine=config, ledger=SparsityLedger(adapter, device),
            kept_weights="in_place" if name in in_place else "buffers",
        )
        for engine, config in engines.items()
        for name, method in methods.items()
    }  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for batch in batch_sizes:
        ids = torch.randint(3, min(tokenizer.vocab_size, 1000), (batch, prompt_len), generator=gen)
        ids, attn = ids.to(device), torch.ones(batch, prompt_len, dtype=torch.long, device=device)
        trials: dict[str, Callable[[], dict]] = {
            label: partial(run_once, runner, ids, attn) for label, runner in runners.items()
        }
        if with_hf_generate:
            trials[HF_GENERATE] = partial(_time_hf_generate, model, ids, new_tokens)
        rows += timed_rows(batch, trials, precision, warmup, weight_bytes(model), log)
    return rows


def timed_rows(
    batch: int,
    trials: Mapping[str, Callable[[], dict]],
    precision: Precision,
    warmup: int,
    bytes_: dict,
    log: Callable[[str], None] = lambda _: None,
) -> list[dict]:
    """`trials` (label -> one timed generation, `run_once`'s keys; "dense" among them, and
    `dense@e` for every engine `e` a label names) alternated until `precision` holds: one row
    per label, with its speedups vs dense on its engine and how the repeats met `precision`."""
    samples, stop = alternate_until(
        trials, precision, warmup, _speedups,
        lambda status: log(f"batch {batch}: {pair_status(status)}"),
    )  # fmt: skip
    summary = _summarize(batch, samples, bytes_, precision.confidence)
    return [{**row, "precision": stop} for row in summary]


def within_budget(
    parts: Iterable[tuple[str, Callable[[], T]]],
    deadline: float,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[tuple[str, T | None, float]]:
    """Runs `parts` in order, yielding (name, result, seconds) as each ends, so the caller can
    write it down before the next one starts. A part starts only if it would end by `deadline`
    (a `clock()` time) were it as long as the longest part so far; one that would not is yielded
    as (name, None, 0.0) and the following parts are weighed alike.

    Why: a lent GPU runs one command for a few minutes at most, and a command stopped at its limit
    returns only what it wrote, so a check must stop starting work it cannot finish rather than
    lose the part it is in. The longest part so far is the estimate because a check's parts are of
    one kind (compile, then time a few methods), and the first part has no estimate but the clock.
    """
    longest = 0.0
    for name, run in parts:
        if clock() + longest > deadline:
            yield name, None, 0.0
            continue
        start = clock()
        result = run()
        seconds = clock() - start
        longest = max(longest, seconds)
        yield name, result, seconds


def _label(method: str, engine: str) -> str:
    return method if engine == "eager" else f"{method}@{engine}"


def _speedups(samples: Mapping[str, list[dict]]) -> list[list[float]]:
    """Every trial's end-to-end speedup against dense on its engine, per repeat: what the
    repeats must pin down."""
    out = []
    for name, runs in samples.items():
        dense = _label("dense", _engine(name))
        if name != dense:
            out.append([d["e2e_s"] / r["e2e_s"] for d, r in zip(samples[dense], runs)])
    return out


def _engine(label: str) -> str:
    return label.partition("@")[2] or "eager"


def _ratio_spread(ratios: list[float], confidence: float) -> dict:
    """`spread` of speedups, with the interval of their median (`low`, `high`) where the repeats
    allow one."""
    out = spread(ratios)
    interval = median_interval(ratios, confidence)
    if interval is not None:
        out["low"], out["high"] = interval
    return out


def run_once(runner: BatchedRunner, ids, attn) -> dict:
    completions, timing = runner.generate_tokens(ids, attn)
    sparsity = combine(c.sparsity for c in completions)
    return {
        "prefill_s": timing.prefill_s,
        "decode_s": timing.decode_s,
        "e2e_s": timing.prefill_s + timing.decode_s,
        "step_ms": timing.median_step_ms,
        "tokens_per_s": timing.decode_tokens / timing.decode_s,
        "sparsity": sparsity,
        "phases": timing.phases,
    }


def measure_compaction(
    model: nn.Module,
    tokenizer,
    adapter: ModelAdapter,
    precision: Precision,
    batch: int = 8,
    short: int = 16,
    long: int = 256,
    warmup: int = 1,
) -> dict:
    """Decode time of a batch whose rows all stop after `short` tokens but one, which runs to
    `long`, with and without live-row compaction (dense, teacher-forced, alternated until the
    ratio's interval meets `precision`)."""
    device = next(model.parameters()).device
    ids = torch.randint(3, min(tokenizer.vocab_size, 1000), (batch, 32)).to(device)
    attn = torch.ones_like(ids)
    forced = Forcing(torch.randint(3, 300, (batch, long), device=device),
                     torch.tensor([long] + [short] * (batch - 1), device=device))  # fmt: skip
    runners = {
        flag: BatchedRunner(
            model,
            tokenizer,
            PruningMethod(),
            adapter,
            SamplingConfig(long),
            engine=EngineConfig(compaction=flag),
        )
        for flag in (True, False)
    }

    def decode_s(flag: bool) -> float:
        return runners[flag].generate_tokens(ids, attn, forced=forced)[1].decode_s

    def ratios(times: Mapping[str, list[float]]) -> list[list[float]]:
        return [[a / b for a, b in zip(times["with"], times["without"])]]

    times, stop = alternate_until(
        {"with": partial(decode_s, True), "without": partial(decode_s, False)},
        precision, warmup, ratios,
    )  # fmt: skip
    return {"batch": batch, "short": short, "long": long, "repeats": stop["pairs"],
            "decode_s_compaction": spread(times["with"]),
            "decode_s_without": spread(times["without"]),
            "ratio": _ratio_spread(ratios(times)[0], precision.confidence),
            "precision": stop}  # fmt: skip


def stream_lengths(items: int, short: tuple[int, int], long: int, long_fraction: float,
                   seed: int) -> list[int]:  # fmt: skip
    """A heavy-tailed workload: a `long_fraction` of the answers run to the `long` cap, the
    others stop after a uniform `short[0]` ... `short[1]` tokens (seeded)."""
    g = torch.Generator().manual_seed(seed)
    capped = torch.rand(items, generator=g) < long_fraction
    stops = torch.randint(short[0], short[1] + 1, (items,), generator=g)
    return torch.where(capped, torch.full_like(stops, long), stops).tolist()


def measure_streaming(
    model: nn.Module,
    tokenizer,
    adapter: ModelAdapter,
    precision: Precision,
    batch: int = 8,
    items: int = 32,
    short: tuple[int, int] = (16, 64),
    long: int = 256,
    long_fraction: float = 0.125,
    prompt_len: int = 64,
    warmup: int = 1,
    seed: int = 0,
) -> dict:
    """Decode tokens/s of the same heavy-tailed work (`stream_lengths`, dense, teacher-forced)
    in static batches of `batch` (with live-row compaction) and continuously batched in `batch`
    slots, alternated until the ratio's interval meets `precision`. Tokens/s counts every
    generated token over decode time (and, end to end, over decode plus prefill: a stream
    prefills its entering rows between steps)."""
    device = next(model.parameters()).device
    lengths = stream_lengths(items, tuple(short), long, long_fraction, seed)
    g = torch.Generator().manual_seed(seed)
    vocab = min(tokenizer.vocab_size, 1000)
    prompts = [torch.randint(3, vocab, (prompt_len,), generator=g).to(device) for _ in lengths]
    forced = [torch.randint(3, vocab, (n,), generator=g).to(device) for n in lengths]
    runner = BatchedRunner(model, tokenizer, PruningMethod(), adapter, SamplingConfig(long))
    stream = StreamRunner(runner, batch)

    def static() -> tuple[float, float]:
        decode = prefill = 0.0
        for start in range(0, items, batch):
            ids = torch.stack(prompts[start : start + batch])
            part = forced[start : start + batch]
            tokens = torch.zeros(len(part), long, dtype=torch.long, device=device)
            for row, f in enumerate(part):
                tokens[row, : len(f)] = f
            n = torch.tensor([len(f) for f in part], device=device)
            _, t = runner.generate_tokens(ids, torch.ones_like(ids), forced=Forcing(tokens, n))
            decode, prefill = decode + t.decode_s, prefill + t.prefill_s
        return decode, prefill

    def continuous() -> tuple[float, float]:
        times: list[BatchTiming] = []
        stream.run(prompts, lambda _i, _c, t: times.append(t), forced=forced)
        return sum(t.decode_s for t in times), sum(t.prefill_s for t in times)

    def ratios(runs: Mapping[str, list[tuple[float, float]]]) -> list[list[float]]:
        """Continuous over static tokens/s, per repeat: static decode time / continuous."""
        return [[s[0] / c[0] for s, c in zip(runs["static"], runs["continuous"])]]

    runs, stop = alternate_until(
        {"static": static, "continuous": continuous}, precision, warmup, ratios
    )
    tokens = sum(lengths)
    rates = {k: [tokens / d for d, _ in v] for k, v in runs.items()}
    e2e = {k: [tokens / (d + p) for d, p in v] for k, v in runs.items()}
    return {
        "batch": batch, "items": items, "short": list(short), "long": long,
        "long_fraction": long_fraction, "tokens": tokens, "capped": lengths.count(long),
        "repeats": stop["pairs"], "rebases": stream.rebases, "precision": stop,
        "tokens_per_s_static": spread(rates["static"]),
        "tokens_per_s_continuous": spread(rates["continuous"]),
        "ratio": _ratio_spread(
            [c / s for c, s in zip(rates["continuous"], rates["static"])], precision.confidence
        ),
        "ratio_e2e": _ratio_spread(
            [c / s for c, s in zip(e2e["continuous"], e2e["static"])], precision.confidence
        ),
    }  # fmt: skip


def _median_phases(phases: list[dict]) -> dict:
    """Each `PhaseLog.summary` key's median over the repeats that have it."""
    keys = dict.fromkeys(k for p in phases for k in p)
    return {k: statistics.median(p[k] for p in phases if k in p) for k in keys}


def _summarize(batch: int, samples: dict[str, list[dict]], bytes_: dict, confidence: float):
    """One row per label. A scheduled method's ideal from a measured sparse step
    (`ideal_measured_r`) takes that step from its own mask-frozen variant, labelled
    `<method>_frozen` on the same engine (conf/bench/default.yaml), not from whichever
    every-step-sparse method (Griffin, TriSP) ran."""
    frozen_r: dict[str, float] = {}  # label -> measured step speedup of an every-step-sparse row
    rows = []
    for name, runs in samples.items():
        engine = name.partition("@")[2]
        dense = samples[_label("dense", engine or "eager")]
        row = {"batch_size": batch, "method": name, "repeats": len(runs)}
        for key in ("prefill_s", "decode_s", "e2e_s", "step_ms", "tokens_per_s"):
            if key in runs[0]:
                row[key] = spread([r[key] for r in runs])
        row["speedup_e2e"] = _ratio_spread(
            [d["e2e_s"] / r["e2e_s"] for d, r in zip(dense, runs)], confidence
        )
        if "decode_s" in runs[0]:
            row["speedup_decode"] = _ratio_spread(
                [d["decode_s"] / r["decode_s"] for d, r in zip(dense, runs)], confidence
            )
            step_r = spread([d["step_ms"] / r["step_ms"] for d, r in zip(dense, runs)])["median"]
            realized = runs[0]["sparsity"]
            f = realized["sparse_step_fraction"]
            bound = sparse_step_bound(realized, bytes_)
            row.update(sparse_fraction=f, ffn_sparse_steps=realized["ffn_sparse_steps"],
                       step_speedup=step_r, bandwidth_bound=bound,
                       ideal_bandwidth=schedule_ideal(f, bound))  # fmt: skip
            if f == 1.0:
                frozen_r[name] = step_r
        if runs[0].get("phases"):
            row["phases"] = _median_phases([r["phases"] for r in runs])
        rows.append(row)
    for row in rows:
        method, at, engine = row["method"].partition("@")
        r = frozen_r.get(f"{method}_frozen{at}{engine}")
        if r is not None and "sparse_fraction" in row and 0 < row["sparse_fraction"] < 1:
            row["ideal_measured_r"] = schedule_ideal(row["sparse_fraction"], r)
    return rows
