"""A sweep through Hydra's submitit launcher on submitit's local executor (`hydra/launcher=local`):
the pickled-job path a SLURM sweep takes, run as two processes here, then tables built from it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_submitit_sweep_writes_complete_runs_that_tables_read(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the two jobs run at once: one core each
    sweep = subprocess.run(
        [sys.executable, "run.py", "-m", "hydra/launcher=local", "model=tiny_llama",
         "method=dense,ours", "limit=2", "batch_size=2", "generation.max_new_tokens=8",
         "speed.paired=false", "progress=false", f"paths.results_dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    runs = sorted((tmp_path / "runs").glob("**/run.json"))
    assert len(runs) == 2, runs
    assert len(list(tmp_path.glob("hydra/multirun/*/*/.submitit/*/*_result.pkl"))) == 2

    tables = subprocess.run(
        [sys.executable, "scripts/make_tables.py", f"paths.results_dir={tmp_path}",
         "report.runs=all"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert tables.returncode == 0, tables.stderr[-2000:]
    assert "from 2 runs" in tables.stdout, tables.stdout
    listed = (tmp_path / "tables" / "runs.md").read_text()
    for run in runs:
        assert run.parent.name in listed, run.parent
