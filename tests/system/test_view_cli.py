"""`scripts/view.py` end to end on a real tiny run, as `make view` runs it."""

import subprocess
import sys
from pathlib import Path

import pytest

from bwprune.experiment import run
from tests.conftest import compose_cfg
from tests.unit.test_viewer import TINY, page_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_view_of_a_real_tiny_run_with_traces(tmp_path):
    """End to end through `scripts/view.py`: default output path, traces with their tokens."""
    common = [*TINY, "generation.max_new_tokens=24", "quality.enabled=true",
              "quality.max_tokens=12", "quality.traces=true"]  # fmt: skip
    run(compose_cfg([*common, "method=dense"], tmp_path))
    record = run(compose_cfg([*common, "method=ours", "method.t_init=2"], tmp_path))
    folder = tmp_path / "runs" / record["run_key"]
    out = subprocess.run(
        [sys.executable, "scripts/view.py", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    page = tmp_path / "views" / f"{record['run_key']}.html"
    assert f"wrote {page}" in out
    data = page_json(page)
    assert data["scale"]["kl"] > 0 and len(data["rows"]) == 4
    for row in data["rows"]:
        assert len(row["trace"]["kl"]) == len(row["trace"]["pieces"]) <= 12
        if row["diverges_at"] is not None:  # the grey prefix is truly shared
            start = row["pruned_span"][0]
            assert start == row["dense_span"][0]
            assert row["pruned"]["text"][:start] == row["dense"]["text"][:start]
