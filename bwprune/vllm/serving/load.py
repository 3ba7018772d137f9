"""A load test: a benchmark's prompts replayed against a served method, with Poisson arrivals.

The load comes from vLLM's own serving benchmark (`vllm bench serve`'s code, run in this process
against the server on the loopback address): the first `limit` problems' prompts, in order, each
asking for up to `max_new_tokens` tokens, greedy, ending at the run's stop tokens, sent at
`rate` requests per second with exponential gaps. A fresh server per test
(`bwprune.vllm.serving.serve.running_server`), so a method's memory starts empty and each record
stands alone. Each test is one record, written under `serve.records_dir`:

  config.yaml     the resolved config, first
  requests.jsonl  per request: the problem, the completion, its score, time to first token, time
                  per output token, end-to-end latency, tokens; the method's realized sparsity
  ledger.jsonl    the server's per-request ledger summaries (the plugin's, `serve.bind_served`;
                  one more request after the load makes the last ones leave, `last_request`)
  server.log      the server's output
  run.json        last: throughput, latency percentiles, accuracy, realized sparsity, the dense
                  model's NLL of the completions, provenance

Fidelity here is what a served completion can show without the method's logits: answer
agreement with dense served at the same rate (a table of the records), and the per-token NLL of
each completion teacher-forced through the dense model (`dense_nll`).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import math
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.base import Benchmark
from bwprune.benchmarks.selection import select_examples
from bwprune.config import build
from bwprune.engine.realized import combine
from bwprune.engine.stopping import stop_token_ids
from bwprune.errors import UserError
from bwprune.generation.prompts import batch_prompts
from bwprune.models.loading import load_model
from bwprune.runs.identity import identity, method_name
from bwprune.runs.provenance import provenance
from bwprune.scoring.common import prompt_opens_think
from bwprune.vllm.serving.serve import SERVED_NAME, export_served, running_server, served_folder
from bwprune.vllm.serving.server import ServeSettings, refuse_taken

log = logging.getLogger(__name__)
PERCENTILES = (50, 99)


def record_key(cfg: DictConfig, rate: float) -> str:
    """`<benchmark>/<model>/<method>/rate=<r>_bs=<B>_n=<requests>_<hash8>`: a run's identity
    and the offered rate (the `serve` keys say how the server runs, not what it computes)."""
    ident = {**identity(cfg), "rate": rate}
    ident.pop("serve", None)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
    leaf = f"rate={rate:g}_bs={cfg.batch_size}_n={cfg.limit}_{digest[:8]}"
    return f"{cfg.benchmark.name}/{cfg.model.name}/{method_name(cfg)}/{leaf}"


def load_test(cfg: DictConfig, rate: float) -> dict:
    """One load test at `rate` requests/s: a fresh server, the load, then scoring; its record
    (a complete one already on disk is returned as it is)."""
    if not rate > 0:
        raise UserError(f"rate={rate} must be > 0 (requests per second)")
    out = Path(cfg.serve.records_dir) / record_key(cfg, rate)
    if (out / "run.json").exists():
        log.info("complete load test found, skipping: %s", out)
        return json.loads((out / "run.json").read_text())
    refuse_taken(ServeSettings.from_config(cfg))  # before the method's preparation, not after
    if out.exists():  # an interrupted test: its requests ran against a server now gone
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(without_key(cfg), resolve=True))
    benchmark: Benchmark = build(cfg.benchmark)
    examples = select_examples(benchmark.examples(), cfg)
    folder = served_folder(cfg)
    prepared = export_served(cfg, folder)
    prompts = batch_prompts(prepared.tokenizer, cfg.model, [(e, 0) for e in examples])
    dataset = out / "prompts.jsonl"
    limit = int(cfg.generation.max_new_tokens)
    dataset.write_text("".join(json.dumps({"prompt": p, "output_tokens": limit}) + "\n"
                               for p in prompts))  # fmt: skip
    stops = stop_token_ids(prepared.model, prepared.tokenizer)
    ledger = out / "ledger.jsonl"
    with running_server(cfg, folder, ledger, prepared.method, out / "server.log") as (server, _):
        result = run_bench(bench_args(cfg, server, folder, dataset, rate, stops, out))
        last = last_request(server)
    dataset.unlink()
    if result["failed"]:
        errors = sorted({e for e in result["errors"] if e})[:3]
        raise UserError(f"{result['failed']} of {len(prompts)} requests failed: {errors} "
                        f"(the server's log: {out / 'server.log'})")  # fmt: skip
    dense = prepared.model if not prepared.method.edits_weights else \
        load_model(cfg.model, cfg.paths.cache_dir)[0]  # fmt: skip
    texts = result["generated_texts"]
    nll = [dense_nll(dense, prepared.tokenizer, p, t) for p, t in zip(prompts, texts)]
    summaries = [json.loads(line) for line in ledger.read_text().splitlines()]
    summaries = [s for s in summaries if not s["request"].startswith(f"{last}-")]
    if len(summaries) != len(prompts):
        raise UserError(f"the server's ledger has {len(summaries)} lines for {len(prompts)} "
                        f"requests ({ledger})")  # fmt: skip
    rows = request_rows(benchmark, examples, prompts, result, nll, limit)
    with open(out / "requests.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    record = {
        "key": record_key(cfg, rate),
        "benchmark": benchmark.name, "model": cfg.model.name, "method": method_name(cfg),
        "rate": rate, "batch_size": int(cfg.batch_size),
        "metrics": load_metrics(rows, result, combine(summaries)),
        "provenance": provenance(int(cfg.seed), str(next(dense.parameters()).device)),
    }  # fmt: skip
    (out / "run.json").write_text(json.dumps(record, indent=1))
    return record


def without_key(cfg: DictConfig) -> DictConfig:
    """The config a record keeps: `serve.api_key` masked (records are committed)."""
    shown = copy.deepcopy(cfg)
    if shown.serve.api_key is not None:
        shown.serve.api_key = "<set>"
    return shown


def bench_args(cfg: DictConfig, server: ServeSettings, folder: Path, dataset: Path, rate: float,
               stops: list[int], out: Path) -> list[str]:  # fmt: skip
    """`vllm bench serve`'s arguments: the prompts in order (no shuffling, no chat template: they
    are the run's rendered prompts), greedy, stopping where the run stops, with the server's API
    key if it has one (an argument of this process's benchmark, never of a command line)."""
    return [
        "--backend", "vllm", "--base-url", server.url, "--endpoint", "/v1/completions",
        "--model", SERVED_NAME, "--tokenizer", str(folder),
        "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--skip-chat-template", "--disable-shuffle", "--num-prompts", str(cfg.limit),
        "--custom-output-len", str(cfg.generation.max_new_tokens),  # its default: 256
        "--request-rate", str(rate), "--seed", str(cfg.seed), "--temperature", "0",
        "--extra-body", json.dumps({"stop_token_ids": stops}),
        "--ready-check-timeout-sec", "0", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", str(out),
        "--result-filename", "bench.json",
        *(["--header", *(f"{k}={v}" for k, v in server.headers.items())] if server.headers else []),
    ]  # fmt: skip


def last_request(server: ServeSettings) -> str:
    """One more request, after the load, and its id: a finished request is seen to leave the
    server's stream at the next forward (vLLM tells a model of no finished request), so this
    one's forward writes the ledger lines of every request before it."""
    body = {"model": SERVED_NAME, "prompt": "1", "max_tokens": 1, "temperature": 0}
    headers = {"Content-Type": "application/json", **server.headers}
    request = urllib.request.Request(f"{server.url}/v1/completions", json.dumps(body).encode(),
                                     headers)  # fmt: skip
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.loads(r.read())["id"]


def run_bench(args: list[str]) -> dict:
    """vLLM's serving benchmark in this process; its detailed result."""
    from vllm.benchmarks.serve import add_cli_args, main

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    return main(parser.parse_args(args))


@torch.inference_mode()
def dense_nll(model, tokenizer, prompt: str, completion: str) -> tuple[float, int]:
    """(Σ NLL, tokens) of `completion` after `prompt` under the dense `model`, teacher-forced."""
    head = tokenizer(prompt, add_special_tokens=False).input_ids
    tail = tokenizer(completion, add_special_tokens=False).input_ids
    if not tail:
        return 0.0, 0
    device = next(model.parameters()).device
    ids = torch.tensor([head + tail], device=device)
    logits = model(input_ids=ids).logits[0, len(head) - 1 : -1].float()
    nll = torch.nn.functional.cross_entropy(logits, ids[0, len(head) :], reduction="sum")
    return float(nll), len(tail)


def request_rows(benchmark: Benchmark, examples, prompts: list[str], result: dict,
                 nll: list[tuple[float, int]], limit: int) -> list[dict]:  # fmt: skip
    """One row per request, in the order they were sent (the problems' order)."""
    rows = []
    for i, (e, p) in enumerate(zip(examples, prompts)):
        text, tokens = result["generated_texts"][i], result["output_lens"][i]
        ttft, latency = result["ttfts"][i], result["latencies"][i]
        finish = "length" if tokens >= limit else "stop"
        score = benchmark.score(text, e.gold, finish, prompt_opens_think(p))
        rows.append({
            "index": e.index, "id": e.id, "completion": text, "prediction": score.prediction,
            "gold": e.gold, "correct": score.correct, "score_reason": score.reason,
            "new_tokens": tokens, "finish_reason": finish, "ttft_ms": 1e3 * ttft,
            "tpot_ms": 1e3 * (latency - ttft) / (tokens - 1) if tokens > 1 else None,
            "e2e_ms": 1e3 * latency, "dense_nll": nll[i][0], "nll_tokens": nll[i][1],
        })  # fmt: skip
    return rows


def load_metrics(rows: list[dict], result: dict, realized: dict) -> dict:
    """Throughput, latency percentiles, accuracy, realized sparsity, dense NLL per token."""

    def spread(key: str) -> dict:
        values = [r[key] for r in rows if r[key] is not None]
        if not values:
            return {}
        return {"mean": float(np.mean(values)),
                **{f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES}}  # fmt: skip

    scored = [r for r in rows if r["correct"] is not None]
    tokens = sum(r["nll_tokens"] for r in rows)
    return {
        "requests": len(rows), "duration_s": result["duration"],
        "request_throughput": result["request_throughput"],
        "output_throughput": result["output_throughput"],
        "ttft_ms": spread("ttft_ms"), "tpot_ms": spread("tpot_ms"), "e2e_ms": spread("e2e_ms"),
        "accuracy": sum(r["correct"] is True for r in rows) / len(rows),
        "scorable": len(scored), "new_tokens": sum(r["new_tokens"] for r in rows),
        "dense_nll_per_token": sum(r["dense_nll"] for r in rows) / tokens if tokens else math.nan,
        "realized_sparsity": realized,
    }  # fmt: skip
