"""Accuracy with its interval and its paired test against dense, as the tables report them."""

import pandas as pd
import pytest

from bwprune.report.accuracy import accuracy_columns
from bwprune.report.collect import _against_dense
from bwprune.report.selection import default_variants
from bwprune.report.significance import mcnemar_exact, wilson
from bwprune.report.tables import accuracy_table
from tests.conftest import CONF_DIR


def test_against_dense_counts_the_problems_only_one_side_answered():
    runs = pd.DataFrame({"run_key": ["d", "m", "other"], "method": ["dense", "ours", "ours"],
                         "pairing": ["p", "p", "q"]})  # fmt: skip
    outcomes = {
        "d": {(0, 0): True, (1, 0): True, (2, 0): False, (3, 0): False},
        "m": {(0, 0): True, (1, 0): False, (2, 0): True, (3, 0): True, (9, 0): True},
        "other": {(0, 0): True},  # no dense run of its pairing
    }
    # dense is the reference (no counts); sample 9 has no dense twin and is left out
    assert _against_dense(runs, outcomes) == [(None,) * 3, (4, 2, 1), (None,) * 3]


def test_a_cell_pools_its_seeds_as_more_problems():
    keys = ["model", "method"]
    runs = pd.DataFrame({
        "model": ["m"] * 3, "method": ["dense", "ours", "ours"], "correct": [12, 3, 1],
        "n": [20, 10, 10], "paired_problems": [None, 10, 10], "only_method": [None, 1, 0],
        "only_dense": [None, 6, 7],
    })  # fmt: skip
    table = accuracy_columns(runs, keys).set_index("method")
    assert table.loc["ours", "acc"] == pytest.approx(4 / 20)
    low, high = wilson(4, 20)
    assert (table.loc["ours", "low"], table.loc["ours", "high"]) == pytest.approx((low, high))
    assert table.loc["ours", "Δ dense"] == pytest.approx((1 - 13) / 20)
    assert table.loc["ours", "p"] == pytest.approx(mcnemar_exact(1, 13))
    assert pd.isna(table.loc["dense", "p"]) and table.loc["dense", "acc"] == pytest.approx(0.6)


def test_the_accuracy_table_has_a_row_per_batch_size_with_dense_first(results_tree):
    from bwprune.report.collect import load_runs

    runs = load_runs(results_tree[0])
    frame = accuracy_table(runs, default_variants(CONF_DIR, runs)).frame
    assert not frame.empty
    for _, group in frame.groupby(["benchmark", "model", "B"]):
        if "dense" in set(group["method"]):
            assert group["method"].iloc[0] == "dense"
            assert group["p"].iloc[1:].notna().all()  # every method is paired with it
    scored = runs[runs["correct"].notna()]
    assert set(frame["B"]) == set(scored["batch_size"])


def test_a_tiny_p_value_is_written_as_a_bound_not_as_zero():
    from bwprune.report.accuracy import p_cell

    assert p_cell(mcnemar_exact(1, 39)) == "< 0.001"
    assert p_cell(mcnemar_exact(0, 7)) == "0.016"


def test_an_ablation_cell_pools_only_runs_that_differ_in_its_argument(results_tree):
    """The memory ablation reports accuracy as the accuracy table does (pooled counts, Wilson
    interval, McNemar p against dense), from the runs that differ from ours' defaults in memory
    only: a run that also changed t_init is in neither cell."""
    import json

    from bwprune.report.collect import load_runs
    from bwprune.report.tables import ablation_table

    runs = load_runs(results_tree[0])
    defaults = default_variants(CONF_DIR, runs)
    ours = runs[(runs["method"] == "ours") & (runs["batch_size"] == 2)]
    other = ours.iloc[[0]].assign(run_key="other", correct=ours["n"].iloc[0], only_method=9,
                                  variant=lambda f: [json.dumps({**json.loads(v), "t_init": 0})
                                                     for v in f["variant"]])  # fmt: skip
    frame = ablation_table(pd.concat([runs, other]), defaults, ("memory",)).frame
    assert {"n", "acc", "95 % CI", "Δ dense", "p", "slip"} <= set(frame.columns)
    for _, row in frame[frame["batch_size"] == 2].iterrows():
        run = ours[[f'"memory": {row["memory"].lower()}' in v for v in ours["variant"]]]
        assert len(run) == 1 and row["n"] == run["n"].iloc[0]
        correct, n = int(run["correct"].iloc[0]), int(run["n"].iloc[0])
        assert row["95 % CI"] == "[{:.2f}, {:.2f}]".format(*wilson(correct, n))
        only = int(run["only_method"].iloc[0]), int(run["only_dense"].iloc[0])
        assert float(row["p"]) == pytest.approx(mcnemar_exact(*only), abs=5e-4)


def test_a_period_run_changes_two_arguments_and_is_a_row_of_the_period_table_only(results_tree):
    """Ours at the paper's small-model period (t_prune 8, t_explore 2) differs from the defaults
    in two arguments: the period table has it, each single-argument table leaves it out."""
    import json

    from bwprune.report.collect import load_runs
    from bwprune.report.tables import ablation_table

    runs = load_runs(results_tree[0])
    defaults = default_variants(CONF_DIR, runs)
    ours = runs[(runs["method"] == "ours") & (runs["variant"] == runs["model"].map(
        lambda m: defaults.get(f"{m}/ours")))].iloc[[0]]  # fmt: skip
    period = {"t_prune": 8, "t_explore": 2}
    moved = ours.assign(run_key="period10", variant=[json.dumps({**json.loads(v), **period})
                                                     for v in ours["variant"]])  # fmt: skip
    both = pd.concat([runs, moved])
    table = ablation_table(both, defaults, ("t_prune", "t_explore"))
    assert "period10" in table.run_keys
    row = table.frame[(table.frame["t_prune"] == "8") & (table.frame["t_explore"] == "2")]
    assert len(row) == 1 and row["n"].iloc[0] == ours["n"].iloc[0]
    for argument in ("t_prune", "t_explore"):
        assert "period10" not in ablation_table(both, defaults, (argument,)).run_keys


def test_the_slip_column_is_the_share_of_samples_that_write_a_false_equation(
    results_tree, tmp_path
):
    """A run whose first sample writes `13 × 2 = 22` has that one sample slipped; the accuracy
    table's `slip` is the share, read from samples.jsonl."""
    import json
    import shutil

    from bwprune.report.collect import load_runs

    runs_dir = shutil.copytree(results_tree[0], tmp_path / "runs")
    table = accuracy_table(load_runs(runs_dir), default_variants(CONF_DIR, load_runs(runs_dir)))
    key = next(k for k in table.run_keys if "/ours/" in k)
    path = next(p for p in runs_dir.rglob("samples.jsonl") if key in str(p))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["completion"] = r"Sold: \[ 13 \times 2 = 22 \] and \[ 16 - 3 = 13 \]"
    for row in rows[1:]:
        row["completion"] = r"\[ 16 - 3 = 13 \]"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    runs = load_runs(runs_dir)
    run = runs.set_index("run_key").loc[key]
    assert run["slipped"] == pytest.approx(1 / len(rows))
    frame = accuracy_table(runs, default_variants(CONF_DIR, runs)).frame
    cell = frame[(frame["method"] == "ours") & (frame["B"] == run["batch_size"])]
    others = runs[runs["run_key"].isin(table.run_keys) & (runs["method"] == "ours")
                  & (runs["batch_size"] == run["batch_size"])]  # fmt: skip
    assert cell["slip"].iloc[0] == pytest.approx(others["slipped"].mean())
    assert cell["slip"].iloc[0] > 0
