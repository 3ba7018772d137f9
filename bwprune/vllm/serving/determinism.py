"""Served determinism: how often the same greedy request gets the same answer, alone and under
traffic (`scripts/served_determinism.py`, docs/serving.md).

A fresh server of the method; `serve.determinism.probes` prompts (the benchmark's first
problems), each sent `repeats` times with nothing else in flight, then `repeats` times more while
`clients` other requests (the next problems, over and over) keep the seats full. Each answer is
compared with the probe's first answer alone. A method whose decisions are batch-coupled (ours,
Griffin, TEAL and CATS with a shared mask) may answer differently when other requests share its
forwards, and one that keeps a memory across requests (ours in a stream) even alone; dense differs
only by floating-point order, which vLLM keeps fixed for a fixed batch. The record, under
`serve.determinism.dir/<model>/<method>.json`: every answer and the two fractions.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from omegaconf import DictConfig

from bwprune.benchmarks.selection import select_examples
from bwprune.config import build
from bwprune.engine.stopping import stop_token_ids
from bwprune.errors import UserError
from bwprune.generation.prompts import batch_prompts
from bwprune.runs.identity import method_name
from bwprune.vllm.serving.serve import SERVED_NAME, export_served, running_server, served_folder
from bwprune.vllm.serving.server import ServeSettings, refuse_taken


def served_determinism(cfg: DictConfig) -> dict:
    """The method's record: each probe's answers alone and under traffic, and how often each
    equals the probe's first answer alone."""
    d = cfg.serve.determinism
    refuse_taken(ServeSettings.from_config(cfg))
    examples = select_examples(build(cfg.benchmark).examples(), cfg)
    folder = served_folder(cfg)
    prepared = export_served(cfg, folder)
    prompts = batch_prompts(prepared.tokenizer, cfg.model, [(e, 0) for e in examples])
    probes, others = prompts[: d.probes], prompts[d.probes :]
    if not others:
        raise UserError(f"limit={cfg.limit} leaves no problem for traffic after "
                        f"serve.determinism.probes={d.probes}")  # fmt: skip
    stops = stop_token_ids(prepared.model, prepared.tokenizer)
    body = {"model": SERVED_NAME, "max_tokens": int(cfg.generation.max_new_tokens),
            "temperature": 0, "stop_token_ids": stops}  # fmt: skip
    out = Path(d.dir) / cfg.model.name
    out.mkdir(parents=True, exist_ok=True)
    with running_server(cfg, folder, out / f"{method_name(cfg)}.ledger.jsonl", prepared.method,
                        out / f"{method_name(cfg)}.server.log") as (server, _):  # fmt: skip
        alone = [[complete(server, body, p) for _ in range(d.repeats)] for p in probes]
        stop = threading.Event()
        with ThreadPoolExecutor(int(d.clients)) as pool:
            for c in range(int(d.clients)):
                pool.submit(keep_busy, server, body, others[c % len(others) :] + others, stop)
            try:
                busy = [[complete(server, body, p) for _ in range(d.repeats)] for p in probes]
            finally:
                stop.set()
    record = {
        "model": cfg.model.name, "method": method_name(cfg), "seats": int(cfg.batch_size),
        "clients": int(d.clients), "max_tokens": body["max_tokens"],
        "alone_same": same(alone, alone, skip_first=True), "traffic_same": same(busy, alone),
        "alone": alone, "traffic": busy,
    }  # fmt: skip
    (out / f"{method_name(cfg)}.json").write_text(json.dumps(record, indent=1))
    return record


def same(answers: list[list[str]], alone: list[list[str]], skip_first: bool = False) -> float:
    """The fraction of `answers` equal to their probe's first answer alone (the first itself left
    out when comparing the answers alone with it)."""
    pairs = [(a, first[0]) for probe, first in zip(answers, alone)
             for a in probe[1 if skip_first else 0 :]]  # fmt: skip
    return sum(a == b for a, b in pairs) / len(pairs)


def complete(server: ServeSettings, body: dict, prompt: str) -> str:
    """One completion's text."""
    headers = {"Content-Type": "application/json", **server.headers}
    data = json.dumps({**body, "prompt": prompt}).encode()
    request = urllib.request.Request(f"{server.url}/v1/completions", data, headers)
    with urllib.request.urlopen(request, timeout=3600) as r:
        return json.loads(r.read())["choices"][0]["text"]


def keep_busy(server: ServeSettings, body: dict, prompts: list[str], stop: threading.Event) -> None:
    """`prompts` one after another, over and over, until `stop`."""
    while not stop.is_set():
        for p in prompts:
            if stop.is_set():
                return
            complete(server, body, p)
