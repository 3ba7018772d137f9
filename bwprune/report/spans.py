"""How a speedup's uncertainty is written in a table cell, one way for every table.

A run timed with a target precision has an interval of its median (`bwprune.runs.speedup`), shown
as `[low, high] n=pairs`, with † when the pairs stopped short of the target and ‡ when the machine
was loaded above its cores while they were timed; a run timed before intervals has only its
slowest and fastest trial, shown as `low–high`, the form the tables had. The claims in the READMEs
are checked against these cells (tests/results/test_speed_claims.py), so the form is parsed there.
"""

from __future__ import annotations

import pandas as pd

from bwprune.runs.interference import OWN_LOAD_MARGIN

NOT_REACHED, OVERLOADED = "†", "‡"
NOTE = (
    "[low, high] n=N: interval of the median of N paired ratios (95 % unless the run says "
    "otherwise; bwprune/runs/speedup.py), pairs added until it was within the target half-width; "
    f"{NOT_REACHED} target not reached, {OVERLOADED} timed while other work loaded the machine "
    f"(load above the cores + {OWN_LOAD_MARGIN}); "
    "low–high: slowest to fastest trial, for runs timed before intervals."
)


def span_cell(rows: pd.DataFrame, low: str, high: str) -> str | None:
    """The span of `rows` (one run, or the runs one cell averages) between columns `low` and
    `high`: their envelope, an interval only when every run has one; None without a timing."""
    timed = rows[rows[low].notna()]
    if timed.empty:
        return None
    lo, hi = timed[low].min(), timed[high].max()
    if not (timed["speedup_kind"] == "interval").all():
        return f"{lo:.2f}–{hi:.2f}"
    flags = ("" if timed["speedup_reached"].all() else NOT_REACHED) + (
        OVERLOADED if timed["speedup_overloaded"].any() else ""
    )
    return f"[{lo:.2f}, {hi:.2f}] n={int(timed['speedup_pairs'].sum())}{flags}"


def span_column(runs: pd.DataFrame, low: str, high: str) -> list[str | None]:
    """`span_cell` of every run of `runs` alone."""
    return [span_cell(runs.loc[[i]], low, high) for i in runs.index]


def has_intervals(runs: pd.DataFrame) -> bool:
    """Whether any of `runs` was timed with an interval (its table's note then says how)."""
    return "speedup_kind" in runs and bool((runs["speedup_kind"] == "interval").any())


def with_spans(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with `speedup_step_span` and `time_to_answer_span` (`span_cell` of each run)."""
    if runs.empty:
        return runs.assign(speedup_step_span=None, time_to_answer_span=None)
    return runs.assign(
        speedup_step_span=span_column(runs, "speedup_step_low", "speedup_step_high"),
        time_to_answer_span=span_column(runs, "tta_low", "tta_high"),
    )
