"""A two-job sweep of the tiny model through one Hydra launcher, then the tables built from its
records: the shape of each tests/system/test_*_sweep.py, which adds what shows its launcher ran."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ["model=tiny_llama", "method=dense,ours", "limit=2", "batch_size=2",
         "generation.max_new_tokens=8", "speed.paired=false", "progress=false"]  # fmt: skip


def sweep_then_tables(results_dir: Path, launcher: list[str], env: dict[str, str]) -> list[Path]:
    """Runs the sweep with the `launcher` overrides, checks that both runs are complete and that
    `make tables` reads both; returns the jobs' `.hydra` folders (one per job, job order)."""
    sweep = subprocess.run(
        [sys.executable, "run.py", "-m", *launcher, *SWEEP, f"paths.results_dir={results_dir}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    runs = sorted((results_dir / "runs").glob("**/run.json"))
    assert len(runs) == 2, runs

    tables = subprocess.run(
        [sys.executable, "scripts/make_tables.py", f"paths.results_dir={results_dir}",
         "report.runs=all"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert tables.returncode == 0, tables.stderr[-2000:]
    assert "from 2 runs" in tables.stdout, tables.stdout
    listed = (results_dir / "tables" / "runs.md").read_text()
    for run in runs:
        assert run.parent.name in listed, run.parent
    jobs = sorted(results_dir.glob("hydra/multirun/*/*/*/.hydra"), key=lambda d: int(d.parent.name))
    assert len(jobs) == 2, jobs
    return jobs


def job_id(job: Path) -> str:
    """The id Hydra gave a job (`hydra.job.id`), from its `.hydra/hydra.yaml`."""
    return str(OmegaConf.load(job / "hydra.yaml").hydra.job.id)
