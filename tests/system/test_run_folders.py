"""Run folders under real processes: two identical commands at once, a parallel sweep of one
run, and a real full file system (a size-limited tmpfs) — each through run.py, as a user runs it."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bwprune.cli import PROBE_BYTES
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.run_lock import LOCK_NAME

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny_llama", "limit=6", "batch_size=2"]


def _run_py(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "run.py", *args, *TINY, "progress=false", f"paths.results_dir={tmp_path}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _one_intact_record(runs_dir: Path) -> dict:
    (folder,) = [p.parent for p in runs_dir.glob("*/*/*/*/run.json")]
    samples, timings = RunRecorder(folder.parent, folder.name).rows()
    lines = (folder / "samples.jsonl").read_text().splitlines()
    assert len(lines) == len(samples) == 6 and len(timings) == 3  # every example once
    record = json.loads((folder / "run.json").read_text())
    assert record["metrics"]["n"] == 6 and record["metrics"]["samples_per_problem"] == 1.0
    assert not (folder / LOCK_NAME).exists()
    return record


@pytest.mark.slow
def test_two_identical_commands_at_once_leave_one_intact_record(tmp_path):
    procs = [_run_py(tmp_path), _run_py(tmp_path)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    record = _one_intact_record(tmp_path / "runs")
    stored = [out for out, _ in outs if "stored: numbers of the run" in out]
    assert len(stored) == 1 and f"finished at {record['finished_at']}" in stored[0]


@pytest.mark.slow
def test_a_parallel_sweep_with_two_jobs_of_one_run(tmp_path):
    """dense ignores `sparsity`: both jobs are one run key, run at once by the joblib launcher."""
    proc = _run_py(tmp_path, "-m", "hydra/launcher=parallel", "sparsity=0.3,0.5")
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    _one_intact_record(tmp_path / "runs")


def _mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here: {mounted.stderr.strip()}")


def _free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


@pytest.mark.slow
def test_a_real_full_disk_gives_one_line_and_the_run_resumes_whole(tmp_path):
    """On a real full file system: the run stops with one line, a rerun while the disk is
    still full says so in one line (Hydra saves its config before any of our code runs), and
    once there is space the rerun resumes from the kept batches to the uninterrupted result."""
    disk = tmp_path / "disk"
    _mount_tmpfs(disk, "1m")
    try:
        args = ["model=tiny_llama", "limit=32", "batch_size=4", "generation.max_new_tokens=64"]
        runs = disk / "runs"

        def run_py() -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "run.py", *args, "logger=none", "progress=false",
                 f"paths.results_dir={disk}"],
                cwd=ROOT, capture_output=True, text=True, timeout=600,
            )  # fmt: skip

        empty = _free_bytes(disk)
        assert run_py().returncode == 0
        (folder,) = [p.parent for p in runs.glob("*/*/*/*/run.json")]
        reference = RunRecorder(folder.parent, folder.name).samples()
        needed = empty - _free_bytes(disk)
        shutil.rmtree(runs)
        shutil.rmtree(disk / "hydra")
        free = needed - 16 * 1024  # Hydra's files fit, the run's samples do not
        assert free > PROBE_BYTES
        (disk / "filler").write_bytes(bytes(_free_bytes(disk) - free))

        for expected in ("error: cannot write to ", "error: paths.results_dir="):  # then full
            failed = run_py()
            assert failed.returncode == 2, failed.stderr[-2000:]
            assert failed.stderr.count("\n") == 1 and failed.stderr.startswith(expected)
            assert "run the same command again" in failed.stderr
        kept = RunRecorder(folder.parent, folder.name)
        assert 0 < len(kept.timings()) < 8  # stopped part-way, some batches kept

        (disk / "filler").unlink()
        resumed = run_py()
        assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr
        assert RunRecorder(folder.parent, folder.name).samples() == reference
    finally:
        subprocess.run(["umount", str(disk)], check=False)
