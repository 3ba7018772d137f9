"""Tables and figures build from a results tree of real (tiny-model) runs."""

import pytest

from bwprune.experiment import run
from bwprune.report.collect import load_runs
from bwprune.report.tables import all_tables, default_variants
from tests.conftest import CONF_DIR


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from tests.conftest import compose_cfg

    root = tmp_path_factory.mktemp("results")
    keys = []
    for overrides in (
        ["method=dense", "batch_size=1"],
        ["method=dense", "batch_size=2"],
        ["method=ours", "batch_size=2"],
        ["method=ours", "batch_size=2", "method.memory=false"],
        ["method=ours", "batch_size=1"],
    ):
        cfg = compose_cfg(
            ["model=tiny_llama", "limit=2", "generation.max_new_tokens=24", *overrides], root
        )
        keys.append(run(cfg)["run_key"])
    return root / "runs", keys


def test_load_runs_pairs_methods_with_dense(results):
    runs_dir, keys = results
    runs = load_runs(runs_dir)
    assert sorted(runs["run_key"]) == sorted(keys)
    dense = runs[runs["method"] == "dense"]
    assert (dense["agreement"] == 1.0).all()
    ours = runs[runs["method"] == "ours"]
    assert ours["agreement"].between(0, 1).all()


def test_every_table_lists_its_runs(results):
    runs_dir, keys = results
    runs = load_runs(runs_dir)
    tables = all_tables(runs, default_variants(CONF_DIR, ["dense", "ours"]))
    assert all(k in tables["runs"] for k in keys)
    memory = tables["ablation_memory"]
    assert "False" in memory and "True" in memory
    default, ablation = keys[2], keys[3]
    assert default in tables["batch_size"] and ablation not in tables["batch_size"]


def test_figures_build(results):
    from bwprune.report import figures

    runs = load_runs(results[0])
    for fig in (figures.collapse(runs), figures.accuracy_vs_realized_sparsity(runs),
                figures.drift(runs)):  # fmt: skip
        assert fig.axes
    assert figures.collapse(runs).axes[0].get_title() == "gsm8k"
    speed = [
        {"batch_size": b, "method": m, "speedup_decode": {"median": s}, "ideal_bandwidth": 1.3}
        for b in (1, 4) for m, s in (("dense", 1.0), ("ours", 1.2))
    ]  # fmt: skip
    assert len(figures.speedup_vs_batch(speed).axes[0].lines) == 3  # dense, ours, ours' ideal


def test_no_runs_gives_empty_frame(tmp_path):
    assert load_runs(tmp_path).empty
