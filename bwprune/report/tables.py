"""Tables built from `load_runs` output; each returns markdown and lists the runs it used."""

from __future__ import annotations

import pandas as pd

RUNS_COLUMNS = {
    "benchmark": "benchmark",
    "model": "model",
    "method": "method",
    "batch_size": "bs",
    "n": "n",
    "accuracy": "acc",
    "target_sparsity": "ρ target",
    "realized_ffn": "ρ ffn (a)",
    "realized_ffn_sparse_steps": "ρ sparse steps (b)",
    "realized_params": "params skipped (c)",
    "decode_tokens_per_s": "decode tok/s",
    "device": "device",
}


def runs_table(runs: pd.DataFrame) -> str:
    """Every recorded run, one line each, with target vs realized sparsity side by side."""
    table = runs.sort_values(["benchmark", "model", "method", "batch_size", "target_sparsity"])
    shown = table[list(RUNS_COLUMNS)].rename(columns=RUNS_COLUMNS)
    body = shown.to_markdown(index=False, floatfmt=".3f")
    used = "\n".join(f"- `{k}`" for k in table["run_key"])
    return (
        f"{body}\n\nRealized sparsity: see bwprune/methods/ledger.py (decode steps only).\n\n"
        f"Runs used:\n{used}\n"
    )
