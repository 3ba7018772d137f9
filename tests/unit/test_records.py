"""Run folders that cannot be corrupted: one owner at a time, batches recorded whole, no row twice.

The concurrency tests start real processes of run.py on the tiny model, as two people (or a
parallel sweep) would.
"""

import errno
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import bwprune.runs.recorder as records
from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.rescore import rescore
from bwprune.runs.run_lock import LOCK_NAME, hold, holder

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
    with pytest.raises(UserError, match=r"inconsistent.*\[\(4, 0\), \(5, 0\)\]") as e:
        rescore(recorder.dir)
    assert "delete" not in str(e.value) and "run.json aside" in str(e.value)


def test_a_row_written_twice_is_read_once(tmp_path):
    recorder = RunRecorder(tmp_path, "run")
    recorder.dir.mkdir()
    row = {"index": 0, "sample": 0, "completion": "first"}
    timing = {"indices": [0], "samples": [0], "decode_s": 1.0}
    recorder.append([row], timing)
    recorder.append([{**row, "completion": "again"}], timing)
    samples, timings = recorder.rows()
    assert [s["completion"] for s in samples] == ["first"] and len(timings) == 1


# Rows with multi-byte characters: a write cut short can end inside one (invalid UTF-8).
ROWS = [{"index": i, "sample": 0, "completion": f"{i} × ½ = ü"} for i in range(3)]


def _batch(*indices: int) -> dict:
    return {"indices": list(indices), "samples": [0] * len(indices), "decode_s": 1.0}


def _recorder_with_two_batches(tmp_path: Path) -> RunRecorder:
    recorder = RunRecorder(tmp_path, "run")
    recorder.dir.mkdir(parents=True)
    recorder.append(ROWS[:2], _batch(0, 1))
    recorder.append(ROWS[2:], _batch(2))
    return recorder


@pytest.mark.parametrize("name", ["samples.jsonl", "timing.jsonl"])
def test_a_last_line_cut_at_any_byte_is_dropped_with_one_log_line(tmp_path, caplog, name):
    """A full disk or a kill -9 cuts the last line anywhere, inside a character too: at every
    offset, the batches before it are read back and resumed, and one line says what was dropped."""
    recorder = _recorder_with_two_batches(tmp_path)
    path = recorder.dir / name
    *kept, last = path.read_bytes().splitlines(keepends=True)
    assert name == "timing.jsonl" or len(last.decode()) < len(last)  # a character to cut inside
    for cut in range(1, len(last) - 1):  # len - 1: the whole row, only its newline missing
        path.write_bytes(b"".join(kept) + last[:cut])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="bwprune.runs.recorder"):
            recorder.start(OmegaConf.create({}))
        assert [r.getMessage() for r in caplog.records] == [
            f"{path}: dropped its last line, cut short by an interrupted write ({cut} bytes); "
            "its batch is generated again on resume"
        ]
        assert recorder.rows() == (ROWS[:2], [_batch(0, 1)]), cut  # the first batch, whole
        assert path.read_bytes() == b"".join(kept)  # rewritten clean: appends start a new line
        recorder.append(ROWS[2:], _batch(2))  # the resumed batch


def test_damage_before_the_last_line_names_file_line_and_changes_nothing(tmp_path):
    recorder = _recorder_with_two_batches(tmp_path)
    recorder.append([{**ROWS[0], "index": 3}], _batch(3))
    lines = recorder.samples_path.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1][:20] + b"\xff garbage\n"
    damaged = b"".join(lines)
    recorder.samples_path.write_bytes(damaged)
    with pytest.raises(UserError) as e:
        recorder.start(OmegaConf.create({}))
    message = str(e.value)
    assert message.startswith(f"{recorder.samples_path} line 2 is not a JSON row (not UTF-8)")
    assert "\n" not in message and "delete" not in message and "remove it" in message
    assert recorder.samples_path.read_bytes() == damaged


def _torn_like_a_full_disk(folder: Path) -> None:
    """A write torn by a full disk: the last batch's timing never written, its samples cut inside
    a two-byte character."""
    (folder / "run.json").unlink()
    timing = (folder / "timing.jsonl").read_text().splitlines(keepends=True)
    (folder / "timing.jsonl").write_text("".join(timing[:-1]))
    with (folder / "samples.jsonl").open("ab") as f:
        f.write('{"index": 12, "completion": "5 ×'.encode()[:-1])


def test_a_run_torn_by_a_full_disk_resumes_and_rescore_says_one_line(cfg_factory, caplog):
    cfg = cfg_factory("model=tiny_llama", "limit=8", "batch_size=4")
    whole = run(cfg)
    folder = Path(cfg.paths.runs_dir) / whole["run_key"]
    reference = RunRecorder(folder.parent, folder.name).samples()
    _torn_like_a_full_disk(folder)
    rescored = subprocess.run([sys.executable, "scripts/rescore.py", str(folder)], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert rescored.returncode == 1 and rescored.stderr.count("\n") <= 2, rescored.stderr
    assert rescored.stderr.strip().endswith("is not complete (no run.json); run its command "
                                            "again: it resumes the run and scores it with the "
                                            "current scorers")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="bwprune.runs.recorder"):
        resumed = run(cfg)
    assert len(caplog.records) == 1 and "cut short" in caplog.text
    assert resumed["metrics"]["n"] == 8
    assert RunRecorder(folder.parent, folder.name).samples() == reference
