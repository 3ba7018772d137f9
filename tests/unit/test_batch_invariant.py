"""`generation.batch_invariant`: a row's outputs do not depend on the rest of its batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.runs.recorder import RunRecorder
from tests.conftest import small_calibration

TINY = ["model=tiny_llama", "limit=3", "generation.max_new_tokens=12", "quality.enabled=true",
        "quality.max_tokens=8", "generation.batch_invariant=true",
        "speed.paired=false"]  # fmt: skip
UNCOUPLED = [
    ["method=dense"],
    ["method=teal", "method.shared_mask=false"],
    ["method=cats", "method.shared_mask=false"],
    ["method=wanda", "method.pattern=unstructured"],
    ["method=trisp", "sparsity=0.2"],
]


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> list[str]:
    return small_calibration(tmp_path_factory.mktemp("calibration"))


def _outputs(cfg) -> list[tuple]:
    """Per problem: the completion, its ledger row and its fidelity to dense, as recorded."""
    record = run(cfg)
    folder = Path(cfg.paths.runs_dir) / record["run_key"]
    samples = sorted(RunRecorder(folder.parent, folder.name).samples(), key=RunRecorder.row_key)
    return [(s["completion"], s["sparsity"], s["quality"]) for s in samples]


@pytest.mark.parametrize("method", UNCOUPLED, ids=lambda m: "-".join(m))
def test_a_row_gets_the_same_bits_at_batch_1_and_batch_3(method, cfg_factory, calibration):
    alone = _outputs(cfg_factory(*TINY, *calibration, *method, "batch_size=1"))
    together = _outputs(cfg_factory(*TINY, *calibration, *method, "batch_size=3"))
    assert together == alone  # completions, realized sparsity and KL/NLL floats, exactly


def test_a_batch_coupled_method_is_refused_by_name(cfg_factory):
    with pytest.raises(UserError, match=r"method=ours shares decisions.*batch_coupled"):
        run(cfg_factory(*TINY, "method=ours", "batch_size=2"))
