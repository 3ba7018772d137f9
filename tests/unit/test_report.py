"""Tables and figures build from a results tree of real (tiny-model) runs."""

from bwprune.experiment import run
from bwprune.report.collect import load_runs
from bwprune.report.figures import accuracy_vs_realized_sparsity
from bwprune.report.tables import runs_table


def test_tables_and_figures_from_runs(cfg_factory):
    keys = [
        run(cfg_factory("model=tiny_llama", "limit=2", f"batch_size={bs}"))["run_key"]
        for bs in (1, 2)
    ]
    runs = load_runs(cfg_factory().paths.runs_dir)
    assert sorted(runs["run_key"]) == sorted(keys)
    assert set(runs["batch_size"]) == {1, 2}
    table = runs_table(runs)
    assert all(k in table for k in keys) and "ρ ffn (a)" in table
    fig = accuracy_vs_realized_sparsity(runs)
    assert fig.axes and fig.axes[0].get_title() == "gsm8k"


def test_no_runs_gives_empty_frame(tmp_path):
    assert load_runs(tmp_path).empty
