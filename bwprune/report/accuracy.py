"""Accuracy as a table reports it: with its Wilson interval, and against dense on the same problems.

One cell is one setting; its seeds are pooled as more problems (their correct answers and their
McNemar counts are summed), never averaged as rates, so the interval and the p-value are those of
every sample the cell holds. The counts come from `load_runs` (`correct`, `n`, and the paired
`only_method` / `only_dense` against each run's matching dense run); the statistics from
`bwprune.report.significance`. Pure pandas, no files.
"""

from __future__ import annotations

import pandas as pd

from bwprune.report.significance import mcnemar_exact, wilson

NOTE = (
    "Accuracy here pools a cell's seeds: n counts its samples, acc = correct / n with its 95 % "
    "Wilson interval [low, high]; Δ dense = accuracy minus the "
    "matching dense run's on the same problems (the same batch size, seed and evaluation); "
    "p = exact two-sided McNemar test on the problems exactly one of the two answered "
    "(bwprune/report/significance.py)."
)


def accuracy_columns(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per group of `keys`: problems `n`, `acc`, its 95 % interval `low`–`high`, `Δ dense` and
    McNemar `p`,
    from the group's pooled counts (generation runs only: a run without `correct` is skipped)."""
    scored = runs[runs["correct"].notna()]
    rows = []
    for key, cell in scored.groupby(keys, dropna=False):
        correct, n = int(cell["correct"].sum()), int(cell["n"].sum())
        low, high = wilson(correct, n)
        paired = cell[cell["paired_problems"].notna()]
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        row.update({"n": n, "acc": correct / n, "low": low, "high": high})
        if paired.empty:
            row.update({"Δ dense": None, "p": None})
        else:
            only_method, only_dense = (
                int(paired["only_method"].sum()),
                int(paired["only_dense"].sum()),
            )
            problems = int(paired["paired_problems"].sum())
            row.update(
                {"Δ dense": (only_method - only_dense) / problems,
                 "p": mcnemar_exact(only_method, only_dense)}
            )  # fmt: skip
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*keys, "n", "acc", "low", "high", "Δ dense", "p"])
    # no scored run: still keyed as `runs` is, so a table can merge it with the runs' other columns
    return frame.astype(runs[keys].dtypes.to_dict()) if frame.empty else frame


def accuracy_cells(runs: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """`accuracy_columns` as a table shows them: `keys`, n, acc, its "95 % CI", Δ dense and p
    (written by `interval_cell` and `p_cell`), for any table that reports accuracy."""
    table = accuracy_columns(runs, keys)
    table["95 % CI"] = [interval_cell(lo, hi) for lo, hi in zip(table["low"], table["high"])]
    table["p"] = [None if pd.isna(v) else p_cell(v) for v in table["p"]]
    return table[[*keys, "n", "acc", "95 % CI", "Δ dense", "p"]]


def interval_cell(low: float, high: float) -> str:
    """An interval as a table writes it."""
    return f"[{low:.2f}, {high:.2f}]"


def p_cell(p: float) -> str:
    """A p-value as a table writes it: three decimals, and "< 0.001" below (an exact test's p is
    never 0, which three decimals would show)."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"
