"""The batch-invariant control view (`bwprune.report.control`) on real tiny-model runs.

Per-token TEAL computed row by row must write the same completions and the same KL at every batch
size; the control view must say so, label its three curves, and keep its runs out of the tables
that follow the papers' protocol.
"""

from __future__ import annotations

import pytest

from bwprune.experiment import run
from bwprune.report.collect import load_runs
from bwprune.report.control import control_runs, label, protocol_runs
from bwprune.report.figures import collapse_control
from bwprune.report.selection import default_variants
from bwprune.report.tables import all_tables
from tests.conftest import CONF_DIR, compose_cfg

BASE = ["model=tiny_llama", "method=teal", "limit=4", "generation.max_new_tokens=16",
        "quality.enabled=true", "quality.max_tokens=8", "calibration.num_sequences=2"]  # fmt: skip
# Curve label -> its overrides and the batch sizes run; per row in batches has no batch-1 run of
# its own (at batch 1 a row is alone either way: the batch-invariant run is its point).
CURVES = {
    "teal": ([], (1, 4)),
    "teal shared_mask=false": (["method.shared_mask=false"], (4,)),
    "teal shared_mask=false, batch-invariant": (
        ["method.shared_mask=false", "generation.batch_invariant=true"], (1, 4)
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("control")
    for extra, sizes in CURVES.values():
        for batch in sizes:
            run(compose_cfg([*BASE, *extra, f"batch_size={batch}", "speed.paired=false"], root))
    run(compose_cfg(["model=tiny_llama", "method=dense", "limit=4", "batch_size=4",
                     "generation.max_new_tokens=16", "speed.paired=false"], root))  # fmt: skip
    return load_runs(root / "runs")


def test_the_control_curve_is_the_same_bits_at_every_batch_size(runs):
    control = control_runs(runs, default_variants(CONF_DIR, runs))
    assert set(control["label"]) == set(CURVES)
    assert "dense" not in set(control["method"])  # no batch-invariant dense run: not a curve
    flat = control[control["label"] == "teal shared_mask=false, batch-invariant"]
    assert list(flat["batch_size"]) == [1, 4] and list(flat["identical"]) == [1.0, 1.0]
    assert flat["kl"].iloc[0] == flat["kl"].iloc[1]
    assert (control[control["batch_size"] == 1]["identical"] == 1.0).all()
    batched = control[control["label"] == "teal shared_mask=false"]
    assert list(batched["batch_size"]) == [1, 4]  # batch 1 taken from the batch-invariant curve
    assert batched["run_key"].iloc[0] == flat["run_key"].iloc[0]
    assert collapse_control(control).axes  # draws


def test_the_control_runs_stay_out_of_the_protocol_tables(runs):
    defaults = default_variants(CONF_DIR, runs)
    invariant_keys = set(runs[runs["batch_invariant"]]["run_key"])
    assert len(invariant_keys) == 2
    assert not invariant_keys & set(protocol_runs(runs)["run_key"])
    tables = all_tables(runs, defaults)
    control = tables["batch_control"].markdown()
    assert all(key in control for key in invariant_keys)
    assert "KL B=4" in control and "same B=4" in control
    assert not any(key in tables["batch_size"].markdown() for key in invariant_keys)


def test_labels_name_what_differs_from_the_default_only():
    default = '{"aggregate": "mean", "shared_mask": true}'
    assert label("teal", default, default, False) == "teal"
    per_row = '{"aggregate": "mean", "shared_mask": false}'
    assert label("cats", per_row, default, True) == "cats shared_mask=false, batch-invariant"


def test_curves_join_only_runs_computed_alike(runs):
    """A batched run made with other settings (here: more calibration text) is not a point of
    the control's curves: it has no batch-invariant run of its own to be controlled by."""
    other = runs.copy()
    per_row = other["variant"].str.contains('"shared_mask": false') & ~other["batch_invariant"]
    moved = other.loc[per_row, "settings"].str.replace(
        '"max_new_tokens": 16', '"max_new_tokens": 17'
    )
    assert (moved != other.loc[per_row, "settings"]).all()
    other.loc[per_row, "settings"] = moved
    control = control_runs(other, default_variants(CONF_DIR, other))
    assert "teal shared_mask=false" not in set(control["label"])  # no curve of one borrowed point
    assert len(control) == 4  # teal at 1 and 4, batch-invariant at 1 and 4
