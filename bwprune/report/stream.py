"""Fidelity under streams: each continuously batched run next to its static twin.

A run with `generation.batching=continuous` is paired with the run equal to it in everything but
the batching (same method and options, batch size, problems, seed), so the table and figure show
what keeping the batch full does to a method's KL to dense and to the cost it realizes. Runs in
static batches only are everything else's business: `static_runs` keeps streams out of the other
tables and figures. Pure pandas on `load_runs` output.
"""

from __future__ import annotations

import json

import pandas as pd

# Shown per run, static and continuous side by side: load_runs column -> label.
MEASURES = {
    "kl": "KL",
    "nll_increase": "ΔNLL",
    "realized_params": "(c)",
    "realized_ffn": "(a)",
}


def static_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs in static batches: every table and figure but the stream view (runs recorded
    before `batching` existed, or frames without the column, are static)."""
    if "batching" not in runs:
        return runs
    return runs[runs["batching"].fillna("static") == "static"]


def _twin_key(settings: str) -> str:
    """A run's settings without its batching: what a continuous run shares with its twin."""
    ident = json.loads(settings)
    ident.get("generation", {}).pop("batching", None)
    return json.dumps(ident, sort_keys=True)


def variant_label(name: str, policy: str | None, on_enter: str | None) -> str:
    """`ours (decay)`, `ours (decay, defer)`: a method with its memory policy, if it has one, and
    how it takes entering prompts where that is not the default (`prompt`)."""
    parts = [p for p in (policy, None if on_enter == "prompt" else on_enter) if p]
    return f"{name} ({', '.join(parts)})" if parts else name


def label(method: str, variant: str) -> str:
    """A run's label: ours with its memory policy (runs recorded before policies: `max`)."""
    if method != "ours":
        return method
    settings = json.loads(variant)
    return variant_label(method, settings.get("memory_policy") or "max", settings.get("on_enter"))


def stream_pairs(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per continuous run that has a static twin: benchmark, model, problems, batch
    size, label, every `MEASURES` column as `<col>_static` / `<col>_continuous`, and the two
    runs' keys (`run_keys`)."""
    streams = runs[runs["batching"] == "continuous"]
    if streams.empty:
        return pd.DataFrame()
    twins = {_twin_key(row["settings"]): row for _, row in static_runs(runs).iterrows()}
    rows = []
    for _, run in streams.iterrows():
        twin = twins.get(_twin_key(run["settings"]))
        if twin is None:
            continue
        row = {k: run[k] for k in ("benchmark", "model", "problems", "batch_size", "method")}
        row["label"] = label(run["method"], run["variant"])
        row["run_keys"] = (twin["run_key"], run["run_key"])
        for col in MEASURES:
            row[f"{col}_static"], row[f"{col}_continuous"] = twin[col], run[col]
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.sort_values(["benchmark", "model", "problems", "batch_size", "label"])
