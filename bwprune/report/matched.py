"""Matched-cost runs (`cost.target`, bwprune/generation/cost_target.py): each method at one realized
cost.

A matched run chose its ρ so that its realized cost landed on a target, so its ρ says nothing by
itself: the papers' tables and figures, which compare methods at one nominal ρ, leave these runs
out (`nominal`), and the Pareto view (`bwprune.report.pareto`) takes them as points on their
method's curves. Their own table shows what the search chose and what the evaluation realized.
Pure pandas on `load_runs` output.
"""

from __future__ import annotations

import pandas as pd

# Shown per matched run: load_runs column -> label.
COLUMNS = {
    "problems": "n", "max_new_tokens": "tokens", "batch_size": "B", "method": "method",
    "cost_quantity": "quantity", "cost_target": "target", "target_sparsity": "ρ chosen",
    "cost_realized": "realized (calib.)", "realized_params": "(c)", "realized_ffn": "(a)",
    "kl": "KL", "nll_increase": "ΔNLL", "agreement": "agree", "accuracy": "acc",
    "95 % CI": "95 % CI", "Δ dense": "Δ dense", "p": "p",  # from accuracy_cells
    "speedup_step": "step", "speedup_step_span": "step span", "time_to_answer": "TTA",
    "time_to_answer_span": "TTA span",
}  # fmt: skip


def is_matched(runs: pd.DataFrame) -> pd.Series:
    """Which runs chose their ρ by a cost target (frames without the column have none)."""
    if "cost_target" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["cost_target"].notna()


def nominal(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs at the ρ they were given: every view that compares methods at one ρ."""
    return runs[~is_matched(runs)]


def matched_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run of `runs` (matched runs), in setting order: the target, the ρ its search
    chose, the cost that ρ realized on the calibration problems and on the evaluation, and its
    measures."""
    order = ["benchmark", "model", "problems", "max_new_tokens", "cost_quantity", "cost_target",
             "batch_size", "method", "seed"]  # fmt: skip
    sel = runs.sort_values(order)
    return sel[["benchmark", "model", *COLUMNS]].rename(columns=COLUMNS).reset_index(drop=True)
