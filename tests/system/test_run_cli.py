"""run.py as a command: one-line errors with exit code 2, Ctrl-C that says how to resume, and a
multirun sweep. Each test starts Python processes."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_cli_prints_one_line_for_bad_input(tmp_path):
    out = subprocess.run(
        [sys.executable, "run.py", "model=tiny_llama", "batch_size=0",
         f"paths.results_dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == "error: batch_size=0 must be >= 1"


@pytest.mark.parametrize("results_dir", ["FILE", "null"])
def test_cli_prints_one_line_for_an_unusable_results_dir(tmp_path, results_dir):
    """Hydra writes its logs under paths.results_dir before run.py's code runs."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    value = str(a_file) if results_dir == "FILE" else results_dir
    out = subprocess.run(
        [sys.executable, "run.py", "model=tiny_llama", f"paths.results_dir={value}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: paths.results_dir")


def test_ctrl_c_says_what_was_kept_and_how_to_resume(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "run.py", "model=tiny_llama", "limit=40", "batch_size=1",
         "progress=false", f"paths.results_dir={tmp_path}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("runs/**/timing.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"error: interrupted; \d+ batches \(\d+ samples\) are kept in .*; run "
                        r"the same command again to resume from there", last), last  # fmt: skip


@pytest.mark.slow
def test_multirun_sweep_from_the_command_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "run.py", "-m", "model=tiny_llama", "limit=2", "batch_size=1,2",
         "method=dense,ours", "progress=false", f"paths.results_dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list((tmp_path / "runs").glob("**/run.json"))) == 4
