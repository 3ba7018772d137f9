"""What one table cell may hold: runs of the same settings only (everything but the seed).

Seeds of one setting are averaged; anything else that differs (generation, limit or subset,
model or method arguments) makes a different experiment, and averaging two would report a number
no run measured. Where a table's rows and columns would put two settings in one cell, building
the table stops with a `UserError` naming the runs and the keys they differ in. Quality settings
(`measured`) only add measurements to the same samples, so they must agree only among the runs
that measured quality.
"""

from __future__ import annotations

import json

import pandas as pd

from bwprune.errors import UserError

# The coordinates of a table cell before seeds are averaged; runs that differ only in how many
# problems they saw (limit/subset) or in generation settings are candidates for one cell.
CELL = ("benchmark", "model", "method", "variant", "batch_size", "target_sparsity")


def check_cells(runs: pd.DataFrame, keys: list[str]) -> None:
    """Raise `UserError` when the runs that share `keys` (one cell) differ in their settings."""
    for _, cell in runs.groupby(keys, dropna=False):
        for column in ("settings", "measured"):
            values = cell[column].dropna().unique()
            if len(values) > 1:
                mine = cell[cell[column].isin(values[:2])].drop_duplicates(column)
                raise UserError(
                    f"one table cell would average runs of different settings: "
                    f"{' and '.join(mine['run_key'])} differ in {_differences(*values[:2])}; "
                    "remove one of them from git (or from the runs folder), or rerun to match"
                )


def fullest(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of `keys`, the runs of the fullest evaluation: the most problems and, among
    those, the longest generations (a shorter one was made for another view, as the stream
    experiment's 64-token static twins beside the main table's 128). Frames without a generation
    length (perplexity, stream pairs) are ranked by problems only."""
    most = runs.groupby(keys, dropna=False)["problems"].transform("max")
    runs = runs[(runs["problems"] == most).fillna(False)]
    if "max_new_tokens" not in runs:
        return runs
    tokens = runs["max_new_tokens"]
    longest = tokens.groupby([runs[k] for k in keys], dropna=False).transform("max")
    return runs[(tokens == longest) | longest.isna()]


def largest_evaluations(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell, the runs of its fullest evaluation (`fullest`; every seed of it). Two settings
    still tied are a conflict (`check_cells`)."""
    if runs.empty:
        return runs
    chosen = fullest(runs, list(CELL))
    check_cells(chosen, list(CELL))
    return chosen


def _differences(a: str, b: str) -> str:
    """The dotted keys whose values differ between two settings (JSON), with both values."""
    flat_a, flat_b = _flatten(json.loads(a)), _flatten(json.loads(b))
    keys = sorted(k for k in flat_a.keys() | flat_b.keys() if flat_a.get(k) != flat_b.get(k))
    return ", ".join(f"{k} ({flat_a.get(k)!r} vs {flat_b.get(k)!r})" for k in keys)


def _flatten(node: object, prefix: str = "") -> dict:
    """`{"a": {"b": 1}}` as `{"a.b": 1}`."""
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node}
    flat: dict = {}
    for key, value in node.items():
        flat.update(_flatten(value, f"{prefix}{key}."))
    return flat
