"""A soak test (`make soak`): one server at saturation for many requests, watched for drift.

A fresh server (`bwprune.vllm.serving.serve.running_server`) answers `serve.soak.requests` requests,
the benchmark's first `limit` prompts over and over, greedy, each allowed
`generation.max_new_tokens` tokens, from `serve.soak.clients` clients at once: more than the seats,
so every forward is full and requests queue. Every `serve.soak.sample_s` the resident memory of each
of the server's processes and the ledger's line count are read. Per minute of the run (`minutes`):
requests finished, output tokens/s, end-to-end latency p50/p99, the worker's resident memory, the
ledger's lines. What a soak must show (`verdict`): every request answered, one ledger line per
request once the server has stopped, the worker's memory after the first minute grown by less than
`serve.soak.rss_growth_mib` beyond what vLLM alone grows under the same load, and latency without
a trend; vLLM's preemptions are counted (a small `serve.kv_cache_gib` makes it preempt). The
record, under `serve.soak.dir`: config.yaml, requests.jsonl, samples.jsonl, ledger.jsonl,
server.log, soak.json (minutes and verdict) and soak.png (`figure`).

Why a control: under preemption vLLM's own worker grows, with no method inside (about 210 MiB in
1000 preempting requests here, docs/serving.md), so an absolute bound would blame every method for
it. `serve.soak.vllm_alone=true` soaks vLLM without any of this package's pieces (`control_key`:
one record per load, whatever the method); a method's verdict bounds its growth beyond that
record's when there is one, else its whole growth.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.selection import select_examples
from bwprune.config import build
from bwprune.engine.stopping import stop_token_ids
from bwprune.errors import UserError
from bwprune.generation.prompts import batch_prompts
from bwprune.runs.identity import identity, method_name
from bwprune.vllm.serving.load import without_key
from bwprune.vllm.serving.serve import SERVED_NAME, export_served, running_server, served_folder
from bwprune.vllm.serving.server import ServeSettings, refuse_taken

log = logging.getLogger(__name__)
ROLES = {"Worker": "worker", "EngineCore": "engine", "api_server": "api"}  # in a process's cmdline
ALONE = "vllm-alone"  # the control's name where a method's would be
PREEMPTIONS = re.compile(r"^vllm:num_preemptions(?:_total)?(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


def soak_key(cfg: DictConfig) -> str:
    """`<model>/<method>/n=<requests>_kv=<GiB>_<hash8>`: what the server computes, its KV cache
    and the load (the other `serve` keys say how it runs); vLLM alone is `ALONE` and no method."""
    soak = OmegaConf.to_container(cfg.serve.soak, resolve=True)
    alone = soak.pop("vllm_alone")
    soak.pop("dir")
    ident = {**identity(cfg), "kv_cache_gib": cfg.serve.kv_cache_gib, "soak": soak}
    ident.pop("serve", None)
    if alone:
        ident.pop("method", None)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
    name = ALONE if alone else method_name(cfg)
    return f"{cfg.model.name}/{name}/n={soak['requests']}_kv={cfg.serve.kv_cache_gib:g}_" \
        f"{digest[:8]}"  # fmt: skip


def control_key(cfg: DictConfig) -> str:
    """The key of vLLM alone's soak under the same load as `cfg`'s."""
    alone = copy.deepcopy(cfg)
    alone.serve.soak.vllm_alone = True
    return soak_key(alone)


def control_growth(cfg: DictConfig) -> float | None:
    """The worker's growth (MiB) in vLLM alone's soak under `cfg`'s load, None if not soaked."""
    record = Path(cfg.serve.soak.dir) / control_key(cfg) / "soak.json"
    if not record.exists():
        log.warning("no soak of vLLM alone under this load (%s): the memory bound is on "
                    "the worker's whole growth; serve.soak.vllm_alone=true makes one",
                    record)  # fmt: skip
        return None
    return json.loads(record.read_text())["verdict"]["worker_rss_growth_mib"]


def soak(cfg: DictConfig) -> dict:
    """The soak test of the run's method; its record (written as it ends)."""
    soak = cfg.serve.soak
    alone = bool(soak.vllm_alone)
    if alone and cfg.method.name != "dense":
        raise UserError(f"serve.soak.vllm_alone=true serves the model with no method inside; "
                        f"method={cfg.method.name} would only choose the exported weights: "
                        f"run it with method=dense")  # fmt: skip
    out = Path(soak.dir) / soak_key(cfg)
    refuse_taken(ServeSettings.from_config(cfg))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(without_key(cfg), resolve=True))
    examples = select_examples(build(cfg.benchmark).examples(), cfg)
    folder = served_folder(cfg)
    prepared = export_served(cfg, folder)
    prompts = batch_prompts(prepared.tokenizer, cfg.model, [(e, 0) for e in examples])
    stops = stop_token_ids(prepared.model, prepared.tokenizer)
    body = {"model": SERVED_NAME, "max_tokens": int(cfg.generation.max_new_tokens),
            "temperature": 0, "stop_token_ids": stops}  # fmt: skip
    ledger = out / "ledger.jsonl"
    ledger.unlink(missing_ok=True)
    with running_server(cfg, folder, ledger, prepared.method, out / "server.log",
                        plugin=not alone) as (server, proc):  # fmt: skip
        start, samples, done = time.monotonic(), [], threading.Event()
        results: list[dict] = []
        watcher = threading.Thread(target=watch, args=(proc.pid, ledger, float(soak.sample_s),
                                                        start, results, samples, done))  # fmt: skip
        watcher.start()
        pool = ThreadPoolExecutor(int(soak.clients))
        try:
            sent = [pool.submit(send, server, {**body, "prompt": prompts[i % len(prompts)]},
                                start) for i in range(int(soak.requests))]  # fmt: skip
            results.extend(f.result() for f in as_completed(sent))
        finally:  # stopped early (a signal), the requests not yet sent are not
            pool.shutdown(wait=False, cancel_futures=True)
            done.set()
            watcher.join()
            with open(out / "requests.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r) + "\n" for r in results)
            with open(out / "samples.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(s) + "\n" for s in samples)
        if proc.poll() is not None:
            failed = sum(r["error"] is not None for r in results)
            tail = (out / "server.log").read_text(errors="replace")[-3000:]
            raise UserError(f"the vLLM server exited ({proc.returncode}) during the soak; "
                            f"{failed} of {len(results)} requests failed; the end of "
                            f"{out / 'server.log'}:\n{tail}")  # fmt: skip
        preempted = preemptions(server)
    lines = len(ledger.read_text().splitlines()) if ledger.exists() else 0
    per_minute = minutes(results, samples)
    control = None if alone else control_growth(cfg)
    record = {
        "key": soak_key(cfg), "model": cfg.model.name,
        "method": ALONE if alone else method_name(cfg),
        "batch_size": int(cfg.batch_size), "kv_cache_gib": float(cfg.serve.kv_cache_gib),
        "requests": len(results), "duration_s": max(r["end_s"] for r in results),
        "preemptions": preempted, "ledger_lines": lines, "minutes": per_minute,
        "verdict": verdict(results, None if alone else lines, per_minute,
                           float(soak.rss_growth_mib), control),
    }  # fmt: skip
    (out / "soak.json").write_text(json.dumps(record, indent=1))
    figure(record).savefig(out / "soak.png", dpi=120)
    return record


def send(server: ServeSettings, body: dict, start: float) -> dict:
    """One completion request; when it started and ended (s since `start`), its tokens."""
    headers = {"Content-Type": "application/json", **server.headers}
    request = urllib.request.Request(f"{server.url}/v1/completions", json.dumps(body).encode(),
                                     headers)  # fmt: skip
    begun = time.monotonic() - start
    try:
        with urllib.request.urlopen(request, timeout=3600) as r:
            tokens, error = int(json.loads(r.read())["usage"]["completion_tokens"]), None
    except OSError as e:
        tokens, error = 0, str(e)
    return {"start_s": begun, "end_s": time.monotonic() - start, "tokens": tokens, "error": error}


def watch(group: int, ledger: Path, every_s: float, start: float, results: list[dict],
          samples: list[dict], done: threading.Event) -> None:  # fmt: skip
    """Until `done`: every `every_s`, the resident memory (MiB) of the server's processes by role,
    the ledger's lines and the requests finished so far."""
    while True:
        lines = len(ledger.read_text().splitlines()) if ledger.exists() else 0
        samples.append({"t_s": time.monotonic() - start, "answered": len(results),
                        "ledger_lines": lines, **group_memory(group)})  # fmt: skip
        if done.wait(every_s):
            return


def group_memory(group: int) -> dict[str, float]:
    """Resident memory (MiB) of each process of process group `group`, by role (`ROLES`)."""
    memory = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != group:
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (proc / "status").read_text()
        except OSError:  # ended while this looked
            continue
        role = next((r for key, r in ROLES.items() if key in command), None)
        rss = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        if role is not None and rss is not None:
            memory[f"{role}_rss_mib"] = memory.get(f"{role}_rss_mib", 0.0) + int(rss[1]) / 1024
    return memory


def preemptions(server: ServeSettings) -> int | None:
    """vLLM's count of preempted requests so far (its /metrics), None if it reports none."""
    request = urllib.request.Request(f"{server.url}/metrics", headers=server.headers)
    with urllib.request.urlopen(request, timeout=30) as r:
        found = PREEMPTIONS.findall(r.read().decode())
    return int(sum(float(v) for v in found)) if found else None


def minutes(results: list[dict], samples: list[dict]) -> list[dict]:
    """Per minute of the run: the requests that finished in it (count, output tokens/s, latency
    percentiles) and the last sample taken in it (memory, ledger lines)."""
    rows = []
    last = max(r["end_s"] for r in results)
    for minute in range(int(last // 60) + 1):
        ended = [r for r in results if minute * 60 <= r["end_s"] < (minute + 1) * 60]
        span = min(60.0, last - minute * 60)
        e2e = [1e3 * (r["end_s"] - r["start_s"]) for r in ended]
        taken = [s for s in samples if s["t_s"] < (minute + 1) * 60]
        rows.append({
            "minute": minute + 1, "finished": len(ended), "span_s": span,
            "tok_per_s": sum(r["tokens"] for r in ended) / span if span > 0 else 0.0,
            "e2e_p50_ms": float(np.percentile(e2e, 50)) if e2e else None,
            "e2e_p99_ms": float(np.percentile(e2e, 99)) if e2e else None,
            **{k: v for k, v in (taken[-1] if taken else {}).items() if k != "t_s"},
        })  # fmt: skip
    return rows


def verdict(results: list[dict], lines: int | None, per_minute: list[dict], growth_mib: float,
            control_mib: float | None = None) -> dict:  # fmt: skip
    """Every request answered, one ledger line each (`lines` None: vLLM alone writes none), the
    worker's memory after the first minute grown by less than `growth_mib` beyond `control_mib`
    (vLLM alone's growth under the same load, if known), and the p50 latency's trend per minute
    (least squares over the full minutes after the first, as a fraction of their mean: near 0 is
    flat)."""
    full = [m for m in per_minute[1:] if m["span_s"] >= 60 and m["e2e_p50_ms"] is not None]
    rss = [m["worker_rss_mib"] for m in per_minute if "worker_rss_mib" in m]
    growth = max(rss[1:]) - rss[0] if len(rss) > 1 else None
    p50 = np.array([m["e2e_p50_ms"] for m in full])
    trend = float(np.polyfit(np.arange(len(p50)), p50, 1)[0] / p50.mean()) if len(p50) > 2 else None
    return {
        "failed": sum(r["error"] is not None for r in results),
        "one_ledger_line_per_request": None if lines is None else lines == len(results),
        "worker_rss_growth_mib": growth,
        "vllm_alone_growth_mib": control_mib,
        "memory_within_bound": growth is not None and growth - (control_mib or 0.0) < growth_mib,
        "p50_trend_per_minute": trend,
    }


def figure(record: dict) -> Figure:
    """Per full minute: output tokens/s, end-to-end latency p50 and p99, the worker's memory (a
    last, partial minute is the queue draining: fewer requests, shorter waits)."""
    rows = [m for m in record["minutes"] if m["span_s"] >= 60]
    x = [m["minute"] for m in rows]
    fig = Figure(figsize=(10, 3.2), layout="constrained")
    tput, latency, memory = fig.subplots(1, 3)
    tput.plot(x, [m["tok_per_s"] for m in rows], "o-")
    tput.set(xlabel="minute", ylabel="output tokens/s")
    for q in ("p50", "p99"):
        latency.plot(x, [m[f"e2e_{q}_ms"] and m[f"e2e_{q}_ms"] / 1e3 for m in rows], "o-", label=q)
    latency.set(xlabel="minute", ylabel="end-to-end latency (s)")
    latency.legend()
    memory.plot(x, [m.get("worker_rss_mib") for m in rows], "o-")
    memory.set(xlabel="minute", ylabel="worker resident memory (MiB)")
    for ax in (tput, latency, memory):
        ax.grid(alpha=0.3)
    fig.suptitle(f"{record['model']}, {record['method']}: {record['requests']} requests, "
                 f"{record['batch_size']} seats, KV cache {record['kv_cache_gib']:g} GiB, "
                 f"{record['preemptions']} preemptions")  # fmt: skip
    return fig
