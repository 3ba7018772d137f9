"""The paper's tables, built from `load_runs` output. Each returns markdown that lists its runs.

Main, batch-size and sparsity tables use each method's default variant (its yaml defaults); the
ablation tables vary one argument of `ours`. Realized sparsity follows bwprune/methods/ledger.py
(decode steps only): (a) FFN neurons over all decode steps, (c) all parameters skipped per token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bwprune.report.collect import method_variant

FOOTNOTE = (
    "acc = accuracy (pass@1); agree = answers equal to the matching dense run's; (a) realized FFN "
    "sparsity over decode steps; (c) fraction of all parameters skipped per decode token."
)


def default_variants(conf_dir: str | Path, methods: list[str]) -> dict[str, str]:
    """Each method's default variant, from its yaml (the only source of defaults)."""
    from omegaconf import OmegaConf

    from bwprune.config import compose_config

    out = {}
    for method in methods:
        cfg = compose_config(conf_dir, [f"method={method}"])
        out[method] = method_variant(OmegaConf.to_container(cfg.method, resolve=True))
    return out


def _defaults_only(runs: pd.DataFrame, defaults: dict[str, str]) -> pd.DataFrame:
    return runs[[defaults.get(m) == v for m, v in zip(runs["method"], runs["variant"])]]


def _markdown(table: pd.DataFrame, used: pd.DataFrame, title: str) -> str:
    keys = "\n".join(f"- `{k}`" for k in sorted(used["run_key"]))
    body = table.to_markdown(floatfmt=".3f") if not table.empty else "(no matching runs)"
    return f"## {title}\n\n{body}\n\n{FOOTNOTE}\n\nRuns used:\n{keys}\n"


def main_table(runs: pd.DataFrame, defaults: dict[str, str], batch_size: int = 4) -> str:
    """Accuracy per benchmark and their mean, agreement and realized sparsity, per method."""
    sel = _defaults_only(runs, defaults)
    sel = sel[
        (sel["batch_size"] == batch_size)
        & ((sel["method"] == "dense") | (sel["target_sparsity"] == 0.5))
    ]
    acc = sel.pivot_table(index=["model", "method"], columns="benchmark", values="accuracy")
    acc.columns = [f"acc {c}" for c in acc.columns]
    acc["acc mean (shown)"] = acc.mean(axis=1)
    extra = sel.groupby(["model", "method"])[
        ["agreement", "realized_ffn", "realized_params", "kl"]
    ].mean()
    extra.columns = ["agree", "(a) ffn", "(c) params", "KL to dense"]
    table = acc.join(extra)
    return _markdown(table, sel, f"Main table (batch {batch_size}, target ρ = 0.5)")


def batch_table(runs: pd.DataFrame, defaults: dict[str, str]) -> str:
    """Accuracy and agreement with dense vs batch size: the collapse of batch-shared masks."""
    sel = _defaults_only(runs, defaults)
    sel = sel[(sel["method"] == "dense") | (sel["target_sparsity"] == 0.5)]
    table = sel.pivot_table(
        index=["benchmark", "model", "method"],
        columns="batch_size",
        values=["accuracy", "agreement"],
    )
    return _markdown(table, sel, "Batch size (target ρ = 0.5)")


def sparsity_table(runs: pd.DataFrame, defaults: dict[str, str], batch_size: int = 4) -> str:
    """Accuracy and realized FFN sparsity (a) vs target sparsity."""
    sel = _defaults_only(runs, defaults)
    sel = sel[(sel["batch_size"] == batch_size) & (sel["method"] != "dense")]
    table = sel.pivot_table(
        index=["benchmark", "model", "method"], columns="target_sparsity",
        values=["accuracy", "realized_ffn"],
    )  # fmt: skip
    return _markdown(table, sel, f"Target sparsity (batch {batch_size})")


def ablation_table(runs: pd.DataFrame, argument: str) -> str:
    """`ours` runs that differ in `argument` (memory, aggregate, select, t_init, ...)."""
    sel = runs[runs["method"] == "ours"].copy()
    sel[argument] = [json.loads(v).get(argument) for v in sel["variant"]]
    table = sel.groupby(["benchmark", "model", "batch_size", "target_sparsity", argument])[
        ["accuracy", "agreement", "realized_ffn", "realized_ffn_sparse_steps", "kl"]
    ].mean()
    return _markdown(table, sel, f"Ablation: {argument}")


ABLATIONS = ("memory", "aggregate", "select", "t_init", "t_explore", "t_prune")

RUNS_COLUMNS = [
    "benchmark", "model", "method", "batch_size", "n", "accuracy", "agreement", "target_sparsity",
    "realized_ffn", "realized_ffn_sparse_steps", "realized_params", "kl", "decode_tokens_per_s",
    "device",
]  # fmt: skip


def runs_table(runs: pd.DataFrame) -> str:
    """Every recorded run, one line each, target vs realized sparsity side by side."""
    table = runs.sort_values(["benchmark", "model", "method", "batch_size", "target_sparsity"])
    return _markdown(table.set_index("run_key")[RUNS_COLUMNS], table, "All runs")


def all_tables(runs: pd.DataFrame, defaults: dict[str, str]) -> dict[str, str]:
    """File stem -> markdown, for `make tables`."""
    tables = {
        "runs": runs_table(runs),
        "main": main_table(runs, defaults),
        "batch_size": batch_table(runs, defaults),
        "sparsity": sparsity_table(runs, defaults),
    }
    for argument in ABLATIONS:
        tables[f"ablation_{argument}"] = ablation_table(runs, argument)
    return tables
