"""Collect finished runs (`run.json` files) into one table, one row per run.

Tables and figures are built from these files only, never from W&B, so anyone with the results
folder can rebuild them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def load_runs(runs_dir: str | Path) -> pd.DataFrame:
    """One row per complete run under `runs_dir`: names, metrics, realized sparsity, provenance."""
    rows = []
    for path in sorted(Path(runs_dir).glob("**/run.json")):
        record = json.loads(path.read_text())
        m = record["metrics"]
        rs = m["realized_sparsity"]
        key = record["run_key"]
        leaf = dict(part.split("=", 1) for part in key.rsplit("/", 1)[-1].split("_")[:-1])
        rows.append(
            {
                "run_key": key,
                "benchmark": record.get("benchmark"),
                "model": record.get("model"),
                "method": record.get("method"),
                "batch_size": int(leaf["bs"]),
                "seed": int(leaf["seed"]),
                "n": m["n"],
                "accuracy": m["accuracy"],
                "unscorable": m["unscorable"],
                "target_sparsity": m["target_sparsity"],
                "realized_ffn": rs["ffn"],
                "realized_ffn_sparse_steps": rs["ffn_sparse_steps"],
                "realized_params": rs["params"],
                "decode_tokens_per_s": m["decode_tokens_per_s"],
                "decode_ms_per_step": m["decode_ms_per_step"],
                "device": record["provenance"]["device"],
                "git_sha": record["provenance"].get("git_sha"),
            }
        )
    return pd.DataFrame(rows)
