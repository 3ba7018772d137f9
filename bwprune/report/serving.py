"""Served methods under load: the load-test records (`bwprune.vllm.serving.load`) as one frame, its
table.

One row per record (a method served at one offered request rate): what the server achieved
(requests and output tokens per second), latencies as the clients saw them (time to first token,
time per output token, end to end; p50 and p99), accuracy, answer agreement with dense served at
the same rate on the same problems, the dense model's NLL per token of the completions, and the
realized sparsity the plugin's ledger recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from bwprune.report.stream import variant_label

COLUMNS = {
    "method": "method", "rate": "offered req/s", "request_throughput": "req/s",
    "output_throughput": "tok/s", "ttft_p50": "TTFT p50 ms", "ttft_p99": "TTFT p99 ms",
    "tpot_p50": "TPOT p50 ms", "tpot_p99": "TPOT p99 ms", "e2e_p50": "E2E p50 s",
    "e2e_p99": "E2E p99 s", "accuracy": "acc", "agreement": "agree", "nll": "dense NLL/tok",
    "ffn": "(a)", "params": "(c)",
}  # fmt: skip
NOTE = (
    "Each row: one load test (bwprune/vllm/serving/load.py): the benchmark's first n problems' "
    "prompts sent to vLLM's OpenAI server with the method inside, Poisson arrivals at the offered "
    "rate (vllm bench serve), greedy, a fresh server per test, batch = the server's seats. req/s "
    "and tok/s: achieved (completed requests, output tokens per second of the test); TTFT: time to "
    "first token; TPOT: time per output token after the first; E2E: request latency. agree = "
    "answers equal to dense's at the same offered rate, over the problems where either gave one; "
    "dense NLL/tok = the dense model's per-token NLL of the method's completions, teacher-forced "
    "(lower: text dense finds likelier); (a) realized FFN sparsity over decode steps, (c) "
    "parameters skipped per decode token, from the server's per-request ledger."
)


def method_label(config: dict) -> str:
    """The method's name, with its memory policy where it has one (`ours`: served, it runs as a
    stream, whose default policy is not the paper's) and its `on_enter` where that is not the
    default (`bwprune.report.stream.variant_label`)."""
    method = config.get("method", {})
    return variant_label(method.get("name", "?"), method.get("memory_policy"),
                         method.get("on_enter"))  # fmt: skip


def load_records(root: str | Path) -> pd.DataFrame:
    """Every complete load-test record under `root`, one row each."""
    rows = []
    for run in sorted(Path(root).glob("**/run.json")):
        record, folder = json.loads(run.read_text()), run.parent
        config = yaml.safe_load((folder / "config.yaml").read_text())
        requests = [json.loads(line) for line in (folder / "requests.jsonl").open()]
        m = record["metrics"]
        rows.append({
            "benchmark": record["benchmark"], "model": record["model"],
            "method": method_label(config), "batch_size": record["batch_size"],
            "problems": m["requests"], "rate": record["rate"],
            "request_throughput": m["request_throughput"],
            "output_throughput": m["output_throughput"],
            **{f"{k}_{q}": m[f"{k}_ms"].get(q) for k in ("ttft", "tpot") for q in ("p50", "p99")},
            **{f"e2e_{q}": m["e2e_ms"][q] / 1e3 for q in ("p50", "p99")},
            "accuracy": m["accuracy"], "nll": m["dense_nll_per_token"],
            "ffn": m["realized_sparsity"]["ffn"], "params": m["realized_sparsity"]["params"],
            "predictions": {r["index"]: r["prediction"] for r in requests},
            "key": record["key"],
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["agreement"] = _agreement(frame)
    return frame


def _agreement(frame: pd.DataFrame) -> list[float | None]:
    """Each record's answers against dense's at the same rate (same benchmark, model, seats)."""
    setting = ["benchmark", "model", "batch_size", "problems", "rate"]
    dense = {tuple(r[c] for c in setting): r["predictions"]
             for _, r in frame[frame["method"] == "dense"].iterrows()}  # fmt: skip
    out = []
    for _, r in frame.iterrows():
        ref = dense.get(tuple(r[c] for c in setting))
        answered = [i for i in r["predictions"] if ref is not None and
                    (r["predictions"][i] is not None or ref.get(i) is not None)]  # fmt: skip
        out.append(sum(r["predictions"][i] == ref.get(i) for i in answered) / len(answered)
                   if answered else None)  # fmt: skip
    return out


def serving_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The table's frame: per benchmark, model and seats, methods by offered rate."""
    if frame.empty:
        return frame
    order = ["benchmark", "model", "batch_size", "problems", "method", "rate"]
    table = frame.sort_values(order)[["benchmark", "model", "batch_size", "problems",
                                      *COLUMNS]]  # fmt: skip
    return table.rename(columns={**COLUMNS, "batch_size": "batch", "problems": "n"})
