"""run.py as a command: one-line errors with exit code 2 (before torch loads, for bad values),
Ctrl-C that says how to resume, and a multirun sweep. Each test starts Python processes."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from bwprune.runs.identity import run_key
from tests.conftest import QUICK_SPEED

ROOT = Path(__file__).resolve().parents[2]


def test_a_bad_value_gets_one_line_before_torch_loads(tmp_path):
    """run.py checks the values before it imports the model stack: a typo answers in a second."""
    argv = ["run.py", "model=tiny_llama", "batch_size=0", f"paths.results_dir={tmp_path}"]
    code = (
        f"import runpy, sys\nsys.argv = {argv!r}\n"
        "try:\n    runpy.run_path('run.py', run_name='__main__')\n"
        "finally:\n    print('torch loaded' if 'torch' in sys.modules else 'no torch')\n"
    )  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == "error: batch_size=0 must be >= 1"
    assert out.stdout.splitlines()[-1] == "no torch"


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
    assert re.fullmatch(r"error: interrupted; kept \d+ batch(es)? \(\d+ samples?\) in .*; run "
                        r"the same command again to resume from there", last), last  # fmt: skip


@pytest.mark.slow
def test_multirun_sweep_from_the_command_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "run.py", "-m", "model=tiny_llama", "limit=2", "batch_size=1,2",
         "method=dense,ours", "progress=false", f"paths.results_dir={tmp_path}", *QUICK_SPEED],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list((tmp_path / "runs").glob("**/run.json"))) == 4


def _composed_by_run_py(*overrides: str) -> DictConfig:
    """What run.py composes for `overrides` (Hydra's `--cfg job`: nothing runs)."""
    out = subprocess.run([sys.executable, "run.py", *overrides, "--cfg", "job", "--resolve"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return OmegaConf.create(out.stdout)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    "command",
    [["limit=8", "batch_size=4"],  # `make run`
     ["method=ours", "batch_size=4", "sparsity=0.5", "limit=8"]],  # the README's example
)  # fmt: skip
def test_a_fresh_clone_s_first_runs_generate(command):
    """`make run` once found a committed complete run of its own key, and printed another day's
    numbers: a person's runs go to a git-ignored folder that no committed record is in."""
    cfg = _composed_by_run_py(*command)
    folder = f"{cfg.paths.runs_dir}/{run_key(cfg)}"
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", f"{folder}/run.json"],
                             cwd=ROOT)  # fmt: skip
    assert ignored.returncode == 0, f"{folder} is not git-ignored"
    assert _git("ls-files", "--", cfg.paths.runs_dir) == ""  # nothing committed there


def test_an_experiment_finds_its_committed_records():
    """The command of results/LOG.md that made the main table's GSM8K `ours` run still writes
    (so finds) it where it is committed."""
    cfg = _composed_by_run_py(
        "experiment=main_table", "limit=100", "benchmark=gsm8k", "method=ours",
        "generation.max_new_tokens=128", "quality.enabled=true", "quality.max_tokens=32",
        "calibration.num_sequences=8",
    )  # fmt: skip
    assert cfg.paths.runs_dir == "results/runs"
    assert _git("ls-files", "--", f"{cfg.paths.runs_dir}/{run_key(cfg)}/run.json").strip()
