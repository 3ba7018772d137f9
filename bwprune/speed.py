"""Decode-speed measurement users can trust, with the memory-bandwidth bound next to it.

All methods are measured in ONE process on the same prompts, after warm-up, alternating the order
every repeat (A B C, C B A, ...) so drift hits all of them alike; every generation is forced to
exactly `new_tokens` tokens (no early EOS) so every method does the same work. Speedups are taken
pair by pair against dense within a repeat, then the median and range over repeats are reported.

The bound: a decode step reads every weight once, so skipping FFN neurons can at best speed a step
up by bytes(dense) / bytes(kept). For a scheduled method (dense and sparse steps mixed) the ideal
is 1 / (f_dense + f_sparse / r), with r either that bound or the measured sparse-step speedup.
This module imports neither Hydra nor OmegaConf, so it runs where only torch and transformers are.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch
from torch import nn

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.realized import combine
from bwprune.generation.runner import BatchedRunner, EngineConfig, Forcing, SamplingConfig
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import ModelAdapter

HF_GENERATE = "hf_generate"  # label of the reference: transformers' own generate loop, dense


def decode_weight_bytes(model: nn.Module, adapter: ModelAdapter) -> tuple[int, int]:
    """(bytes one dense decode step reads, bytes of all FFN weights).

    Every parameter is read once per step, lm_head included; an untied input embedding is not (a
    lookup reads B rows, not the table).
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    if model.get_output_embeddings().weight is not embedding:
        total -= embedding.numel() * embedding.element_size()
    size = embedding.element_size()
    return total, sum(f.num_params for f in adapter.ffns()) * size


def bandwidth_bound(dense_bytes: int, ffn_bytes: int, ffn_sparsity: float) -> float:
    """Upper bound on a sparse step's speedup: bytes(dense) / bytes(kept)."""
    return dense_bytes / (dense_bytes - ffn_bytes * ffn_sparsity)


def schedule_ideal(sparse_fraction: float, step_speedup: float) -> float:
    """Speedup of a generation whose `sparse_fraction` of steps run `step_speedup`× faster."""
    return 1.0 / ((1.0 - sparse_fraction) + sparse_fraction / step_speedup)


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _time_hf_generate(model: nn.Module, ids: torch.Tensor, new_tokens: int) -> float:
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0,
    )  # fmt: skip
    sync()
    return time.perf_counter() - start


def measure(
    model: nn.Module,
    tokenizer,
    adapter: ModelAdapter,
    methods: Mapping[str, PruningMethod],
    batch_sizes: list[int],
    new_tokens: int = 128,
    prompt_len: int = 64,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    with_hf_generate: bool = True,
    log: Callable[[str], None] = lambda _: None,
    engines: Mapping[str, EngineConfig] | None = None,
) -> list[dict]:
    """One row per (batch size, method, engine): timings with spread, speedup vs dense, bounds.

    `methods` must contain "dense"; each method must already be prepared. Prompts are random
    token ids of `prompt_len` (no padding), the same for every method. `engines` maps a label to
    an engine (default: the eager engine alone); rows of engine `e` are labelled `method@e`
    (plain `method` for `eager`) and their speedups are against `dense` on the same engine.
    Runners are made once and reused, so a compiled step is compiled during warm-up only.
    """
    engines = engines or {"eager": EngineConfig()}
    device = next(model.parameters()).device
    dense_bytes, ffn_bytes = decode_weight_bytes(model, adapter)
    sampling = SamplingConfig(new_tokens, ignore_eos=True)
    runners = {
        _label(name, engine): BatchedRunner(
            model, tokenizer, method, adapter, sampling, engine=config,
            ledger=SparsityLedger(adapter, device),
        )
        for engine, config in engines.items()
        for name, method in methods.items()
    }  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for batch in batch_sizes:
        ids = torch.randint(3, min(tokenizer.vocab_size, 1000), (batch, prompt_len), generator=gen)
        ids, attn = ids.to(device), torch.ones(batch, prompt_len, dtype=torch.long, device=device)
        samples: dict[str, list[dict]] = {label: [] for label in runners}
        if with_hf_generate:
            samples[HF_GENERATE] = []
        order = list(samples)
        for rep in range(warmup + repeats):
            for label in order if rep % 2 == 0 else order[::-1]:
                if label == HF_GENERATE:
                    result = {"e2e_s": _time_hf_generate(model, ids, new_tokens)}
                else:
                    result = _run_once(runners[label], adapter, ids, attn)
                if rep >= warmup:
                    samples[label].append(result)
            log(f"batch {batch}: repeat {rep + 1}/{warmup + repeats} done")
        rows += _summarize(batch, samples, dense_bytes, ffn_bytes)
    return rows


def _label(method: str, engine: str) -> str:
    return method if engine == "eager" else f"{method}@{engine}"


def _run_once(runner: BatchedRunner, adapter: ModelAdapter, ids, attn) -> dict:
    with runner.method.attach(runner.model, adapter):
        completions, timing = runner.generate_tokens(ids, attn)
    sparsity = combine(c.sparsity for c in completions)
    return {
        "prefill_s": timing.prefill_s,
        "decode_s": timing.decode_s,
        "e2e_s": timing.prefill_s + timing.decode_s,
        "step_ms": timing.median_step_ms,
        "tokens_per_s": timing.decode_tokens / timing.decode_s,
        "sparse_fraction": sparsity["sparse_step_fraction"],
        "ffn_sparse_steps": sparsity["ffn_sparse_steps"],
    }


def measure_compaction(
    model: nn.Module,
    tokenizer,
    adapter: ModelAdapter,
    batch: int = 8,
    short: int = 16,
    long: int = 256,
    repeats: int = 3,
    warmup: int = 1,
) -> dict:
    """Decode time of a batch whose rows all stop after `short` tokens but one, which runs to
    `long`, with and without live-row compaction (dense, teacher-forced, alternated)."""
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
    times: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(warmup + repeats):
        for flag in (True, False) if rep % 2 == 0 else (False, True):
            _, timing = runners[flag].generate_tokens(ids, attn, forced=forced)
            if rep >= warmup:
                times[flag].append(timing.decode_s)
    ratios = [a / b for a, b in zip(times[True], times[False])]
    return {"batch": batch, "short": short, "long": long, "repeats": repeats,
            "decode_s_compaction": _spread(times[True]),
            "decode_s_without": _spread(times[False]), "ratio": _spread(ratios)}  # fmt: skip


def _summarize(batch: int, samples: dict[str, list[dict]], dense_bytes: int, ffn_bytes: int):
    frozen_r: dict[str, float] = {}  # per engine: measured speedup of an every-step-sparse method
    rows = []
    for name, runs in samples.items():
        engine = name.partition("@")[2]
        dense = samples[_label("dense", engine or "eager")]
        row = {"batch_size": batch, "method": name, "repeats": len(runs)}
        for key in ("prefill_s", "decode_s", "e2e_s", "step_ms", "tokens_per_s"):
            if key in runs[0]:
                row[key] = _spread([r[key] for r in runs])
        row["speedup_e2e"] = _spread([d["e2e_s"] / r["e2e_s"] for d, r in zip(dense, runs)])
        if "decode_s" in runs[0]:
            row["speedup_decode"] = _spread(
                [d["decode_s"] / r["decode_s"] for d, r in zip(dense, runs)]
            )
            step_r = _spread([d["step_ms"] / r["step_ms"] for d, r in zip(dense, runs)])["median"]
            f = runs[0]["sparse_fraction"]
            s = runs[0]["ffn_sparse_steps"]
            bound = bandwidth_bound(dense_bytes, ffn_bytes, s)
            row.update(sparse_fraction=f, ffn_sparse_steps=s, step_speedup=step_r,
                       bandwidth_bound=bound, ideal_bandwidth=schedule_ideal(f, bound))  # fmt: skip
            if f == 1.0:
                frozen_r[engine] = step_r
        rows.append(row)
    for row in rows:
        r = frozen_r.get(row["method"].partition("@")[2])
        if r is not None and "sparse_fraction" in row and 0 < row["sparse_fraction"] < 1:
            row["ideal_measured_r"] = schedule_ideal(row["sparse_fraction"], r)
    return rows
