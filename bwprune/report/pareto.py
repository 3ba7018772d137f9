"""The Pareto view: fidelity and accuracy against the cost a method realized,
parameters skipped per decode token (c), rather than against its nominal ρ.

At one ρ the methods skip very different amounts (bwprune/engine/ledger.py defines (c)), so a
method is drawn as a curve through its runs at several ρ and matched-cost targets, and methods
are compared where their curves reach the same (c). A curve is one setting: benchmark, model,
evaluation size (problems), batch size and method; the seeds of one ρ are averaged into one point.
Values at a common (c) are read off a curve by linear interpolation between its measured points
and are missing outside them: never extrapolated. Pure pandas on `load_runs` output, no files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bwprune.report.cells import check_cells

X = "realized_params"
X_LABEL = "parameters skipped per decode token (c)"
# The measures against (c): load_runs column -> label.
METRICS = {
    "kl": "KL to dense",
    "nll_increase": "NLL increase over dense",
    "agreement": "agreement with dense",
    "accuracy": "accuracy",
    "time_to_answer": "time-to-answer speedup over dense",  # runs with a paired timing only
}
# Dense's own value of a measure its runs do not carry: a speedup over dense is 1 for dense.
DENSE = {"time_to_answer": 1.0}
# Ratios over dense: drawn on a log axis, where 2x and 0.5x lie equally far from dense.
RATIOS = ("time_to_answer",)
# One panel (figure) or row group: an evaluation (problems, generation length) at a batch size.
SETTING = ("benchmark", "model", "problems", "max_new_tokens", "batch_size")
CURVE = (*SETTING, "method")
SHOWN_DIGITS = 3  # (c) as the tables show it
# One point of a curve: a ρ, or a cost target (`report.matched`; its ρ is what the search chose,
# and may equal a swept ρ without being the same run).
POINT = ("target_sparsity", "cost_target")


def curves(runs: pd.DataFrame, y: str) -> dict[tuple, pd.DataFrame]:
    """CURVE key -> its points (`POINT`, X, `y`) in order of X: the seeds of a ρ (or a cost
    target) averaged (one setting per point, `check_cells`), runs that did not measure `y` left
    out.

    Every evaluation size is its own curve, so a curve keeps all its ρ even where a larger
    evaluation measured one of them (one-run-per-cell selection would take that point away).
    Settings where no method has two points or more (a ρ-0.5-only batch sweep, a stream
    experiment's static twins) are no Pareto sweep and are left out, dense with them."""
    measured = runs[runs[y].notna() & runs[X].notna()]
    check_cells(measured, [*CURVE, "variant", *POINT])
    points = measured.groupby([*CURVE, *POINT], as_index=False, dropna=False)[[X, y]].mean()
    count = points.groupby(list(CURVE))[X].transform("size")
    swept = set(points.loc[count > 1, list(SETTING)].itertuples(index=False, name=None))
    rows = [tuple(r) in swept for r in points[list(SETTING)].itertuples(index=False, name=None)]
    points = points[pd.Series(rows, index=points.index, dtype=bool)]
    return {key: part.sort_values(X) for key, part in points.groupby(list(CURVE))}


def interpolate(points: pd.DataFrame, y: str, at: float) -> float | None:
    """`y` at X = `at` on the curve through `points` (sorted by X); None outside its span. An end
    of the span reaches `at` when it shows as `at` (`SHOWN_DIGITS`): a matched-cost run that
    realized (c) 0.2003 for a target of 0.2 is the curve's value at 0.2, not a blank."""
    x = points[X].to_numpy()
    if not len(x) or not round(x[0], SHOWN_DIGITS) <= at <= round(x[-1], SHOWN_DIGITS):
        return None
    return float(np.interp(at, x, points[y].to_numpy()))
