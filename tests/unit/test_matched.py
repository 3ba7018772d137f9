"""Matched-cost runs in the report (bwprune/report/matched.py): they leave the nominal-ρ views,
and their own table shows what each search chose."""

import pandas as pd

from bwprune.report.matched import COLUMNS, is_matched, matched_frame, nominal


def runs() -> pd.DataFrame:
    base = {c: 0 for c in COLUMNS} | {"benchmark": "gsm8k", "model": "m", "seed": 0}
    return pd.DataFrame([
        base | {"method": "ours", "cost_target": 0.3, "target_sparsity": 0.41},
        base | {"method": "dense", "cost_target": None, "target_sparsity": 0.0},
        base | {"method": "cats", "cost_target": 0.3, "target_sparsity": 0.55, "batch_size": 4},
        base | {"method": "ours", "cost_target": 0.2, "target_sparsity": 0.3},
    ])  # fmt: skip


def test_nominal_views_leave_out_runs_that_searched_their_rho():
    frame = runs()
    assert is_matched(frame).tolist() == [True, False, True, True]
    assert nominal(frame)["method"].tolist() == ["dense"]
    no_column = frame.drop(columns="cost_target")  # runs recorded before matched cost existed
    assert not is_matched(no_column).any() and len(nominal(no_column)) == len(frame)


def test_the_matched_table_is_in_setting_order_with_its_labels():
    table = matched_frame(runs()[is_matched(runs())])
    assert list(table.columns) == ["benchmark", "model", *COLUMNS.values()]
    assert table["target"].tolist() == [0.2, 0.3, 0.3]  # target, then batch size, then method
    assert table["method"].tolist() == ["ours", "ours", "cats"]
    assert table["ρ chosen"].tolist() == [0.3, 0.41, 0.55]
