"""Collect finished runs (`run.json` + `config.yaml`) into one table, one row per run.

Tables and figures are built from these files only, never from W&B, so anyone with the results
folder can rebuild them. Agreement with dense is computed here too: a run's final answers are
compared with those of the dense run that matches it in everything but the method.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

# Method arguments that say what is pruned how much, not which variant of a method this is.
NOT_VARIANT = ("_target_", "sparsity", "calibration", "cache_dir")
# What must match for a dense run to be a method run's reference.
PAIRING = ("benchmark", "model", "batch_size", "seed", "limit", "subset", "generation")


def method_variant(method_cfg: dict) -> str:
    """The method's non-default-able arguments as canonical JSON (e.g. memory/aggregate)."""
    return json.dumps({k: v for k, v in method_cfg.items() if k not in NOT_VARIANT}, sort_keys=True)


def pairing_key(cfg: dict, benchmark: str, model: str) -> str:
    """What a method run and its dense reference share (`PAIRING`), as one comparable string."""
    picked = {k: cfg.get(k) for k in PAIRING if k not in ("benchmark", "model")}
    return json.dumps([benchmark, model, picked], sort_keys=True, default=str)


def load_runs(runs_dir: str | Path) -> pd.DataFrame:
    """One row per complete run under `runs_dir`: names, config, metrics, agreement with dense.

    A shard (`num_shards` > 1) is part of a run, not a run: it is left out, and its run appears
    once the shards are merged (`bwprune.shards`).
    """
    rows, predictions = [], {}
    for path in sorted(Path(runs_dir).glob("*/*/*/*/run.json")):
        record = json.loads(path.read_text())
        cfg = yaml.safe_load((path.parent / "config.yaml").read_text())
        if cfg.get("num_shards", 1) > 1:
            continue
        m = record["metrics"]
        rs = m.get("realized_sparsity") or {}
        quality = m.get("quality") or {}
        key = record["run_key"]
        predictions[key] = _predictions(path.parent / "samples.jsonl")
        rows.append(
            {
                "run_key": key,
                "finished_at": record.get("finished_at"),
                "benchmark": record.get("benchmark"),
                "model": record.get("model"),
                "method": record.get("method"),
                "variant": method_variant(cfg["method"]),
                "pairing": pairing_key(cfg, record.get("benchmark"), record.get("model")),
                "batch_size": cfg["batch_size"],
                "seed": cfg["seed"],
                "limit": cfg.get("limit"),
                "n": m.get("n"),
                "problems": m.get("problems", m.get("n")),
                "accuracy": m.get("accuracy"),
                "unscorable": m.get("unscorable"),
                "target_sparsity": m["target_sparsity"],
                "realized_ffn": rs.get("ffn"),
                "realized_ffn_sparse_steps": rs.get("ffn_sparse_steps"),
                "realized_params": rs.get("params"),
                "sparse_step_fraction": rs.get("sparse_step_fraction"),
                "perplexity": m.get("perplexity"),
                "nll_increase": quality.get("nll_increase"),
                "kl": quality.get("kl"),
                "decode_tokens_per_s": m.get("decode_tokens_per_s"),
                "decode_ms_per_step": m.get("decode_ms_per_step"),
                "device": record["provenance"]["device"],
                "git_sha": record["provenance"].get("git_sha"),
            }
        )
    runs = pd.DataFrame(rows)
    if not runs.empty:
        for count in ("n", "problems"):  # counts stay integers next to perplexity runs' None
            runs[count] = runs[count].astype("Int64")
        runs["agreement"] = _agreement(runs, predictions)
    return runs


def _predictions(samples_path: Path) -> dict:
    if not samples_path.exists():
        return {}
    out = {}
    for line in samples_path.read_text(encoding="utf-8").splitlines():
        s = json.loads(line)
        out[(s["index"], s.get("sample", 0))] = s["prediction"]
    return out


def _agreement(runs: pd.DataFrame, predictions: dict) -> list[float | None]:
    """Fraction of samples whose answer equals the matching dense run's (None: no dense run)."""
    dense = {r.pairing: r.run_key for r in runs.itertuples() if r.method == "dense"}
    out = []
    for r in runs.itertuples():
        ref = dense.get(r.pairing)
        if ref is None:
            out.append(None)
            continue
        mine, theirs = predictions[r.run_key], predictions[ref]
        common = [k for k in mine if k in theirs]
        out.append(sum(mine[k] == theirs[k] for k in common) / len(common) if common else None)
    return out
