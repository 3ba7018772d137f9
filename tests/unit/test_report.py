"""Tables and figures build from a results tree of real (tiny-model) runs."""

import pandas as pd
import pytest
from omegaconf import OmegaConf

from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.report.cells import largest_evaluations
from bwprune.report.collect import _agreement, load_runs, method_variant
from bwprune.report.selection import default_runs, default_variants
from bwprune.report.spans import span_cell
from bwprune.report.tables import all_tables, batch_table, speed_table, write_tables
from tests.conftest import CONF_DIR, compose_cfg


def test_load_runs_pairs_methods_with_dense(results_tree):
    runs_dir, keys = results_tree
    runs = load_runs(runs_dir)
    assert sorted(runs["run_key"]) == sorted(keys)
    dense = runs[runs["method"] == "dense"]
    # A tiny random model may never answer before its token limit: agreement is then undefined.
    assert ((dense["agreement"] == 1.0) | dense["agreement"].isna()).all()
    ours = runs[runs["method"] == "ours"]
    assert (ours["agreement"].between(0, 1) | ours["agreement"].isna()).all()


def test_a_method_s_name_is_not_part_of_its_variant():
    args = {"_target_": "bwprune.methods.ours.BWAP", "sparsity": 0.5, "memory": True}
    assert method_variant({**args, "name": "ours"}) == method_variant(args) == '{"memory": true}'


def test_a_model_s_own_method_values_are_its_default_variant():
    """`ours` at period 10 is Qwen3-1.7B's default (conf/model_method/), not SmolLM2's."""
    qwen3 = compose_cfg(["model=qwen3_1p7b", "method=ours"]).method
    variant = method_variant(OmegaConf.to_container(qwen3, resolve=True))
    runs = pd.DataFrame({"model": ["qwen3_1p7b", "smollm2_135m"], "method": ["ours"] * 2,
                         "variant": [variant] * 2, "perplexity": [float("nan")] * 2})  # fmt: skip
    assert list(default_runs(runs, default_variants(CONF_DIR, runs))["model"]) == ["qwen3_1p7b"]


def test_agreement_counts_only_samples_where_either_run_answered():
    runs = pd.DataFrame(
        {"run_key": ["d", "m", "silent"], "method": ["dense", "ours", "ours"], "pairing": ["p"] * 3}
    )
    dense = {(0, 0): "18", (1, 0): None, (2, 0): "3", (3, 0): None}
    predictions = {
        "d": dense,
        "m": {(0, 0): "18", (1, 0): None, (2, 0): None, (3, 0): "7"},  # agrees on 1 of 3
        "silent": {k: None for k in dense},
    }
    assert _agreement(runs, predictions) == [1.0, 1 / 3, 0.0]
    assert _agreement(runs, {**predictions, "d": {k: None for k in dense}})[2] is None


def test_every_table_lists_its_runs(results_tree, tmp_path):
    runs_dir, keys = results_tree
    runs = load_runs(runs_dir)
    tables = all_tables(runs, default_variants(CONF_DIR, runs))
    assert all(k in tables["runs"].markdown() for k in keys)
    memory = tables["ablation_memory"].markdown()
    assert "False" in memory and "True" in memory
    default, ablation = keys[2], keys[3]
    batch = tables["batch_size"]
    assert default in batch.run_keys and ablation not in batch.run_keys
    assert {"acc B=1", "acc B=2", "(a) B=1"} <= set(batch.frame.columns)  # agree: none answered
    write_tables(tables, tmp_path)
    for stem, table in tables.items():
        tex = (tmp_path / f"{stem}.tex").read_text()
        assert "\\begin{tabular}" in tex and all(f"% {k}" in tex for k in table.run_keys)
        assert (tmp_path / f"{stem}.md").read_text() == table.markdown()
    assert "\\caption{Ablation: t\\_init}" in tables["ablation_t_init"].latex()


def test_footnotes_say_how_each_run_s_samples_ended(results_tree):
    runs = load_runs(results_tree[0])
    main = all_tables(runs, default_variants(CONF_DIR, runs))["runs"]
    for r in runs.itertuples():  # tiny runs: 2 problems, cut at 24 tokens
        wrong = r.n - r.correct - r.unscorable
        line = f"`{r.run_key}` — {r.correct} correct, {wrong} wrong, {r.unscorable} unscorable"
        assert line in main.markdown() and line.replace("`", "") in main.latex()
        assert sum(r.unscorable_reasons.values()) == r.unscorable
    assert "truncated: cut at the token limit" in main.markdown()


def test_a_cell_uses_the_run_with_the_most_problems(results_tree):
    runs = load_runs(results_tree[0])
    smaller = runs.iloc[[0]].assign(run_key="small", n=1, problems=1, finished_at="9999")  # newer
    cells = largest_evaluations(pd.concat([smaller, runs], ignore_index=True))
    assert "small" not in set(cells["run_key"]) and len(cells) == len(runs)


def test_drift_draws_each_model_on_its_own():
    from bwprune.report import figures

    runs = pd.DataFrame(
        {"benchmark": "gsm8k", "model": ["a", "b", "a"], "method": "teal", "batch_size": [4, 4, 16],
         "target_sparsity": 0.5, "realized_ffn_sparse_steps": [0.1, 0.3, 0.2]}
    )  # fmt: skip
    fig = figures.drift(runs)
    drawn = {a.get_title(): list(a.get_lines()[0].get_ydata()) for a in fig.axes if a.get_lines()}
    assert drawn == {"gsm8k, a, batch 4": [0.1], "gsm8k, b, batch 4": [0.3],
                     "gsm8k, a, batch 16": [0.2]}  # fmt: skip


def test_batch_sweep_joins_batch_sizes_measured_on_different_numbers_of_problems():
    """The accuracy plan measures batch 1 on 50 problems and 4, 16 on 100: one line, the odd n
    marked."""
    from bwprune.report import figures

    runs = pd.DataFrame(
        {"benchmark": "gsm8k", "model": "m", "max_new_tokens": 1024,
         "method": ["dense", "teal", "teal", "teal"], "batch_size": [4, 1, 4, 16],
         "target_sparsity": [0.0, 0.5, 0.5, 0.5], "correct": [57, 27, 34, 19],
         "n": [100, 50, 100, 100], "paired_problems": None}
    )  # fmt: skip
    (ax,) = figures.batch_sweep_accuracy(runs).axes
    assert list(ax.get_lines()[0].get_xydata()[:, 1]) == [0.54, 0.34, 0.19]
    assert [t.get_text() for t in ax.texts] == ["n=50"]
    assert ax.get_title() == "gsm8k, m, ≤1024 tokens, 100 problems"


def test_speed_record_becomes_a_table():
    row = {"batch_size": 1, "method": "dense", "e2e_s": {"min": 1, "median": 2, "max": 3},
           "speedup_e2e": {"min": 1, "median": 1, "max": 1}}  # fmt: skip
    table = speed_table("cpu", [row])
    assert "2.00 [1.00, 3.00]" in table.markdown() and "make bench" in table.markdown()
    assert "2.00 [1.00, 3.00]" in table.latex()


def test_figures_build(results_tree):
    from bwprune.report import figures

    runs = load_runs(results_tree[0])
    for fig in (figures.collapse(runs), figures.accuracy_vs_realized_sparsity(runs),
                figures.drift(runs)):  # fmt: skip
        assert fig.axes
    assert figures.collapse(runs, "accuracy").axes[0].get_title().startswith("gsm8k")
    sweep = figures.batch_sweep_accuracy(runs).axes[0]  # a line per method, dense a band
    methods = {t.get_text() for t in sweep.get_legend().get_texts()}
    assert "ours" in methods and any(m.startswith("dense") for m in methods)
    assert figures.accuracy_vs_realized_cost(runs).axes
    speed = [
        {"batch_size": b, "method": m, "speedup_decode": {"median": s}, "ideal_bandwidth": 1.3}
        for b in (1, 4) for m, s in (("dense", 1.0), ("ours", 1.2))
    ]  # fmt: skip
    assert len(figures.speedup_vs_batch(speed).axes[0].lines) == 3  # dense, ours, ours' ideal


def test_no_runs_gives_empty_frame(tmp_path):
    assert load_runs(tmp_path).empty


def test_collapse_draws_the_largest_swept_evaluation_only():
    from bwprune.report import figures

    rows = [  # gsm8k: n=16 at B 1 and 4, n=100 at B 1 and 4, n=200 only at B 4; math500: one B
        {"benchmark": b, "model": "m", "method": "ours", "problems": n, "batch_size": bs,
         "target_sparsity": 0.5, "kl": 0.1 * bs}
        for b, n, bs in [("gsm8k", 16, 1), ("gsm8k", 16, 4), ("gsm8k", 100, 1),
                         ("gsm8k", 100, 4), ("gsm8k", 200, 4), ("math500", 40, 4)]
    ]  # fmt: skip
    runs = pd.DataFrame(rows)
    assert set(figures.largest_sweep(runs, "batch_size")["problems"]) == {100}
    fig = figures.collapse(runs, "kl")
    assert [ax.get_title() for ax in fig.axes] == ["gsm8k, 100 problems"]
    assert [list(line.get_xdata()) for line in fig.axes[0].lines] == [[1, 4]]
    # the same problems at another generation length (a stream experiment's static twins): the
    # longer generations are the curve, never an average of both lengths
    tokens = runs[runs["problems"] == 100].assign(max_new_tokens=128)
    shorter = tokens.assign(max_new_tokens=64, kl=9.0)
    chosen = figures.largest_sweep(pd.concat([tokens, shorter]), "batch_size")
    assert set(chosen["max_new_tokens"]) == {128} and len(chosen) == 2


def test_a_cell_never_averages_runs_of_different_settings(tmp_path):
    """Same method, batch and problems, another `generation.max_new_tokens`: not one cell (the
    batch table gives each evaluation its own row; a one-run-per-cell table takes the longer
    generations); another setting in one row is an error."""
    base = ["model=tiny_llama", "method=ours", "limit=2", "batch_size=2"]
    for tokens in (24, 16):
        run(compose_cfg([*base, f"generation.max_new_tokens={tokens}"], tmp_path))
    runs = load_runs(tmp_path / "runs")
    assert sorted(batch_table(runs, default_variants(CONF_DIR, runs)).frame["tokens"]) == [16, 24]
    assert list(largest_evaluations(runs)["max_new_tokens"]) == [24]
    run(compose_cfg([*base, "generation.max_new_tokens=24", "generation.top_p=0.9"], tmp_path))
    with pytest.raises(UserError, match="one table cell would average runs of different settings"):
        largest_evaluations(load_runs(tmp_path / "runs"))
    run(compose_cfg([*base, "generation.max_new_tokens=16", "generation.top_p=0.9"], tmp_path))
    runs = load_runs(tmp_path / "runs")
    with pytest.raises(UserError, match=r"differ in generation.top_p \((1.0|0.9) vs"):
        batch_table(runs, default_variants(CONF_DIR, runs))


def test_quality_settings_must_agree_only_among_runs_that_measured_quality(tmp_path):
    """Quality adds measurements to the same samples: on or off is one cell, two KLs are not."""
    base = ["model=tiny_llama", "method=ours", "limit=2", "batch_size=2"]
    for quality in (["quality.enabled=false"], ["quality.enabled=true", "quality.max_tokens=4"]):
        run(compose_cfg([*base, *quality], tmp_path))
    defaults = default_variants(CONF_DIR, load_runs(tmp_path / "runs"))
    assert len(batch_table(load_runs(tmp_path / "runs"), defaults).run_keys) == 2
    run(compose_cfg([*base, "quality.enabled=true", "quality.max_tokens=6"], tmp_path))
    with pytest.raises(UserError, match=r"differ in max_tokens \((4|6) vs"):
        batch_table(load_runs(tmp_path / "runs"), defaults)


def test_a_speedup_cell_shows_its_interval_with_its_pairs_and_flags_else_its_range():
    def timed(low, high, kind, pairs=6, reached=True, overloaded=False):
        return {"speedup_step_low": low, "speedup_step_high": high, "speedup_kind": kind,
                "speedup_pairs": pairs, "speedup_reached": reached,
                "speedup_overloaded": overloaded}  # fmt: skip

    old = pd.DataFrame([timed(0.74, 1.02, "range", 3, None, None)])
    assert span_cell(old, "speedup_step_low", "speedup_step_high") == "0.74–1.02"
    new = pd.DataFrame([timed(1.00, 1.05, "interval", 14), timed(0.98, 1.03, "interval", 9, False)])
    assert span_cell(new, "speedup_step_low", "speedup_step_high") == "[0.98, 1.05] n=23†"
    loaded = pd.DataFrame([timed(1.00, 1.05, "interval", 14, True, True)])
    assert span_cell(loaded, "speedup_step_low", "speedup_step_high") == "[1.00, 1.05] n=14‡"
    mixed = pd.concat([old, new])  # one run without an interval: the cell is a range
    assert span_cell(mixed, "speedup_step_low", "speedup_step_high") == "0.74–1.05"


def test_the_cut_off_rate_comes_from_each_run_s_samples(results_tree):
    """Every run's share of samples that hit the token limit, read from samples.jsonl (runs
    recorded before run.json carried it have it too), in the accuracy tables' `cut` column."""
    import json
    from pathlib import Path

    runs_dir = Path(results_tree[0])
    runs = load_runs(runs_dir)
    for r in runs.itertuples():
        rows = [json.loads(line) for path in runs_dir.rglob("samples.jsonl")
                if r.run_key in str(path) for line in path.read_text().splitlines()]  # fmt: skip
        cut = sum(row["finish_reason"] == "length" for row in rows) / len(rows)
        assert r.cut_off_rate == pytest.approx(cut)
    assert "cut B=" in batch_table(runs, default_variants(CONF_DIR, runs)).markdown()
