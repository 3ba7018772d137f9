"""Run folders that cannot be corrupted: one owner at a time, batches recorded whole, no row twice.

The concurrency tests start real processes of run.py on the tiny model, as two people (or a
parallel sweep) would.
"""

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import bwprune.records as records
from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.records import RunRecorder, run_key
from bwprune.rescore import rescore
from bwprune.run_lock import LOCK_NAME, hold, holder

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model=tiny_llama", "limit=6", "batch_size=2"]


def test_a_second_owner_waits_for_the_first(tmp_path):
    folder = tmp_path / "run"
    order = []

    def second():
        with hold(folder):
            order.append("second")

    with hold(folder):
        assert "pid" in holder(folder) and str(os.getpid()) in holder(folder)
        thread = threading.Thread(target=second)  # flock: another open file, another owner
        thread.start()
        time.sleep(0.5)
        order.append("first")
    thread.join(timeout=30)
    assert order == ["first", "second"]
    assert not folder.exists()  # nothing was written: the folder is gone with its lock


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": "here", "since": "0"}))
    with hold(folder):  # flock died with its holder: no wait
        assert str(os.getpid()) in holder(folder)


def test_a_batch_without_its_timing_is_generated_again(cfg_factory, monkeypatch):
    """The disk fills between a batch's samples and its timing: the resumed run redoes it."""
    cfg = cfg_factory(*TINY)
    real = records._append_jsonl
    writes = []

    def full_on_second_timing(path, rows):
        writes.append(path.name)
        if writes.count("timing.jsonl") == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, rows)

    monkeypatch.setattr(records, "_append_jsonl", full_on_second_timing)
    with pytest.raises(UserError, match="No space left on device; every batch recorded"):
        run(cfg)
    recorder = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    assert len(recorder.samples()) == 4 and len(recorder.timings()) == 1  # batch 2 half-written
    monkeypatch.setattr(records, "_append_jsonl", real)
    record = run(cfg)
    samples, timings = recorder.rows()
    assert len(samples) == 6 and len(timings) == 3
    assert record["metrics"]["decode_s"] == pytest.approx(sum(t["decode_s"] for t in timings))


def test_run_json_refuses_an_inconsistent_folder(cfg_factory):
    cfg = cfg_factory(*TINY)
    recorder = RunRecorder(cfg.paths.runs_dir, run(cfg)["run_key"])
    recorder.write(recorder.samples(), recorder.timings()[:-1])  # the last batch's timing is lost
    with pytest.raises(UserError, match=r"inconsistent.*\[\(4, 0\), \(5, 0\)\].*delete the"):
        rescore(recorder.dir)


def test_a_row_written_twice_is_read_once(tmp_path):
    recorder = RunRecorder(tmp_path, "run")
    recorder.dir.mkdir()
    row = {"index": 0, "sample": 0, "completion": "first"}
    timing = {"indices": [0], "samples": [0], "decode_s": 1.0}
    recorder.append([row], timing)
    recorder.append([{**row, "completion": "again"}], timing)
    samples, timings = recorder.rows()
    assert [s["completion"] for s in samples] == ["first"] and len(timings) == 1


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
