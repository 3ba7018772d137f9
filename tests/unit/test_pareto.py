"""The Pareto view: measures against realized cost (c), read at common (c) by interpolation.

Built on a synthetic results tree: run folders written by hand with chosen realized costs and
measures (configs composed as run.py would), so every interpolated value is known exactly.
"""

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from bwprune.report import figures
from bwprune.report.collect import load_runs
from bwprune.report.pareto import X_LABEL, X, curves, interpolate
from bwprune.report.selection import default_variants
from bwprune.report.tables import all_tables, pareto_table
from bwprune.runs.identity import run_key
from tests.conftest import CONF_DIR, compose_cfg

DENSE_ANSWERS = ["1", "2", "3", "4"]
NAMES_IT = ("runs", "matched_cost")  # the tables that list a matched-cost run
# method -> [(ρ, realized (c), KL, answers equal to dense's)] at batch 1; batch 4 adds 0.02 to (c)
CURVES = {
    "ours": [(0.3, 0.10, 0.2, 4), (0.5, 0.20, 0.4, 3), (0.7, 0.30, 1.0, 2)],
    "teal": [(0.3, 0.25, 0.5, 3), (0.5, 0.40, 0.9, 1)],
    "cats": [(0.3, 0.05, 0.1, 4), (0.7, 0.15, 0.3, 2)],
}


def write_run(
    runs_dir: Path,
    overrides: list[str],
    params: float,
    kl: float,
    agree: int,
    problems: int = 4,
    cost: dict | None = None,
) -> str:
    """A complete run folder with these realized (c), KL and answers (`agree` of them dense's),
    recorded as an evaluation of `problems` problems; `cost`: a matched-cost run's search (its
    target in the config, its chosen ρ the run's target ρ)."""
    matched = [f"cost.target={cost['target']}"] if cost else []
    cfg = compose_cfg(["model=tiny_llama", "limit=4", "quality.enabled=true", *overrides, *matched])
    key = run_key(cfg)
    folder = runs_dir / key
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    answers = DENSE_ANSWERS[:agree] + ["0"] * (len(DENSE_ANSWERS) - agree)
    samples = [{"index": i, "sample": 0, "prediction": a} for i, a in enumerate(answers)]
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    correct = sum(a == "2" for a in answers)  # gold: "2" everywhere
    metrics = {
        "n": 4, "problems": problems, "accuracy": correct / 4, "correct": correct, "unscorable": 0,
        "unscorable_reasons": {}, "target_sparsity": float(cfg.method.get("sparsity", 0.0)),
        "realized_sparsity": {"params": params, "ffn": 2 * params},
        "quality": {"kl": kl, "nll_increase": kl / 2},
    }  # fmt: skip
    if cost:
        metrics.update(cost=cost, target_sparsity=cost["rho"])
    names = {"benchmark": "gsm8k", "model": "tiny_llama", "method": str(cfg.method.name)}
    record = {"run_key": key, "metrics": metrics, "provenance": {"device": "cpu"}, **names}
    (folder / "run.json").write_text(json.dumps(record))
    return key


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> pd.DataFrame:
    root = tmp_path_factory.mktemp("pareto") / "runs"
    for batch, shift in ((1, 0.0), (4, 0.02)):
        write_run(root, ["method=dense", f"batch_size={batch}"], 0.0, 0.0, 4)
        for method, points in CURVES.items():
            for rho, params, kl, agree in points:
                overrides = [f"method={method}", f"sparsity={rho}", f"batch_size={batch}"]
                write_run(root, overrides, params + shift, kl, agree)
    return load_runs(root)


def test_a_value_is_read_off_the_curve_between_its_points_only(runs):
    ours = curves(runs, "kl")[("gsm8k", "tiny_llama", 4, 16, 1, "ours")]
    assert list(ours["target_sparsity"]) == [0.3, 0.5, 0.7]
    assert interpolate(ours, "kl", 0.15) == pytest.approx(0.3)
    assert interpolate(ours, "kl", 0.3) == pytest.approx(1.0)  # its last point
    assert interpolate(ours, "kl", 0.25) == pytest.approx(0.7)
    assert interpolate(ours, "kl", 0.31) is None and interpolate(ours, "kl", 0.05) is None


def test_an_end_that_shows_as_the_value_reaches_it():
    """A matched run's (c) lands near, not on, its target: 0.2004 shows as 0.200 and is the
    curve's value at 0.2; 0.2006 shows as 0.201 and is not."""
    for first, reached in ((0.2004, True), (0.2006, False)):
        points = pd.DataFrame({X: [first, 0.25], "kl": [0.4, 0.9]})
        assert interpolate(points, "kl", 0.2) == (0.4 if reached else None)


def test_the_table_compares_methods_at_one_cost_and_never_extrapolates(runs):
    defaults = default_variants(CONF_DIR, runs)
    table = pareto_table(runs, defaults, [0.1, 0.2, 0.3])
    frame = table.frame.set_index(["B", "method"])
    assert "dense" not in set(table.frame["method"])  # the reference, at (c) = 0
    assert frame.loc[(1, "ours"), "KL @0.2"] == pytest.approx(0.4)
    assert frame.loc[(4, "ours"), "KL @0.2"] == pytest.approx(0.2 + 0.2 * 0.08 / 0.1)
    assert frame.loc[(1, "ours"), "ΔNLL @0.3"] == pytest.approx(0.5)
    assert frame.loc[(1, "ours"), "agree @0.3"] == pytest.approx(0.5)
    assert frame.loc[(1, "ours"), "acc @0.1"] == pytest.approx(0.25)
    assert frame.loc[(1, "cats"), "KL @0.1"] == pytest.approx(0.2)
    # cats stops at (c) 0.15, teal starts at 0.25: blank there, not extrapolated
    assert pd.isna(frame.loc[(1, "cats"), "KL @0.2"]) and pd.isna(frame.loc[(1, "teal"), "KL @0.2"])
    assert frame.loc[(1, "teal"), "KL @0.3"] == pytest.approx(0.5 + 0.4 * 0.05 / 0.15)
    assert list(frame.loc[(1, "teal"), ["(c) min", "(c) max"]]) == [0.25, 0.4]
    markdown = table.markdown()
    assert re.search(r"\|\s+–\s+\|", markdown) and "realized cost (c) = 0.1, 0.2, 0.3" in markdown
    assert set(table.run_keys) == set(runs.loc[runs["method"] != "dense", "run_key"])
    assert "$\\Delta$NLL @0.1" in table.latex()


def test_the_figure_draws_a_curve_per_method_and_a_panel_per_batch_size(runs, tmp_path):
    fig = figures.pareto(runs, "kl")
    assert [ax.get_title() for ax in fig.axes] == [
        "gsm8k, tiny_llama\n4 problems, 16 tokens, batch 1",
        "gsm8k, tiny_llama\n4 problems, 16 tokens, batch 4",
    ]  # fmt: skip
    assert {ax.get_xlabel() for ax in fig.axes} == {X_LABEL}
    assert fig.axes[0].get_ylabel() == "KL to dense"
    lines = {line.get_label(): line for line in fig.axes[1].get_lines()}
    assert set(lines) == {"dense", "ours", "teal", "cats"}
    assert list(lines["ours"].get_xdata()) == pytest.approx([0.12, 0.22, 0.32])
    assert list(lines["dense"].get_xdata()) == [0.0]
    rhos = sorted(t.get_text() for t in fig.axes[0].texts)  # each point labelled with its ρ
    assert rhos == ["0.3"] * 3 + ["0.5"] * 2 + ["0.7"] * 2
    fig.savefig(tmp_path / "pareto_kl.png")


def test_a_ratio_over_dense_is_drawn_on_a_log_axis_labelled_with_round_ratios(runs):
    """One method 8x faster to its answers must not flatten the others' curves near 1: the
    time-to-answer panels are log, labelled at round ratios with 1 among them, not crowded."""
    tta = runs["realized_params"] * 10 + runs["method"].map({"teal": 4.0}).fillna(0.8)
    fig = figures.pareto(runs.assign(time_to_answer=tta.where(runs["method"] != "dense")),
                         "time_to_answer")  # fmt: skip
    for ax in fig.axes:
        ticks = list(ax.get_yticks())
        low, high = ax.get_ylim()
        assert ax.get_yscale() == "log" and 1.0 in ticks and ticks == sorted(ticks)
        assert 4 <= len([t for t in ticks if low <= t <= high]) <= 10, ticks
        assert ax.yaxis.get_major_formatter()(2.0) == "2"  # a ratio, not 2×10⁰
    assert figures.pareto(runs, "kl").axes[0].get_yscale() == "linear"


def test_no_runs_with_the_measure_says_so(runs):
    fig = figures.pareto(runs.assign(kl=None), "kl")
    assert "no runs with kl" in fig.axes[0].texts[0].get_text()


def test_a_larger_evaluation_at_one_rho_takes_no_point_off_a_curve(tmp_path):
    """A ρ-0.5-only sweep on more problems (a batch sweep) beside the Pareto sweep: the Pareto
    curve keeps its own ρ-0.5 point, and the single-ρ setting is no curve of its own."""
    root = tmp_path / "runs"
    write_run(root, ["method=dense", "batch_size=1"], 0.0, 0.0, 4)
    for rho, params, kl, agree in CURVES["ours"]:
        write_run(root, ["method=ours", f"sparsity={rho}", "batch_size=1"], params, kl, agree)
    for method in ("dense", "ours"):  # more problems, ρ 0.5 only, another KL
        write_run(root, [f"method={method}", "batch_size=1", "limit=8"], 0.21, 9.0, 4, problems=8)
    runs = load_runs(root)
    table = pareto_table(runs, default_variants(CONF_DIR, runs), [0.2]).frame
    assert list(table["n"]) == [4]  # the 8-problem setting has one ρ: not a sweep
    assert table["KL @0.2"].iloc[0] == pytest.approx(0.4)  # its own ρ-0.5 point
    assert [ax.get_title() for ax in figures.pareto(runs, "kl").axes] == [
        "gsm8k, tiny_llama\n4 problems, 16 tokens, batch 1"
    ]


def test_a_matched_cost_run_is_a_point_of_the_pareto_view_only(tmp_path):
    """A run whose search chose ρ 0.5 for a (c) target beside the ρ-0.5 run of the same method:
    its own point on the curve (no conflict), in its own table, and in no table at a nominal ρ."""
    root = tmp_path / "runs"
    write_run(root, ["method=dense", "batch_size=1"], 0.0, 0.0, 4)
    for rho, params, kl, agree in CURVES["ours"]:
        write_run(root, ["method=ours", f"sparsity={rho}", "batch_size=1"], params, kl, agree)
    search = {"quantity": "params", "target": 0.25, "rho": 0.5, "realized": 0.255}
    key = write_run(root, ["method=ours", "batch_size=1"], 0.25, 0.6, 3, cost=search)
    runs = load_runs(root)
    assert key.split("/")[-1].startswith("params=0.25_")

    ours = curves(runs, "kl")[("gsm8k", "tiny_llama", 4, 16, 1, "ours")]
    assert list(ours[X]) == [0.10, 0.20, 0.25, 0.30]
    assert interpolate(ours, "kl", 0.25) == pytest.approx(0.6)  # measured, not interpolated

    defaults = default_variants(CONF_DIR, runs)
    tables = all_tables(runs, defaults)  # the batch table at ρ 0.5 would average both runs
    assert all(key not in t.run_keys for stem, t in tables.items() if stem not in NAMES_IT)
    matched = tables["matched_cost"]
    assert matched.run_keys == [key]
    row = matched.frame.iloc[0]
    assert (row["quantity"], row["target"], row["ρ chosen"]) == ("params", 0.25, 0.5)
    assert (row["realized (calib.)"], row["(c)"], row["KL"]) == (0.255, 0.25, 0.6)
    assert pareto_table(runs, defaults, [0.25]).frame["KL @0.25"].iloc[0] == pytest.approx(0.6)

    labels = sorted(t.get_text() for t in figures.pareto(runs, "kl").axes[0].texts)
    assert labels == ["0.3", "0.5", "0.5 (matched)", "0.7"]
