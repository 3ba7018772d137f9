"""`python -m bwprune.lmeval` as a command: a bad value is our one-line error and exit code 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")  # the optional `[lmeval]` extra

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cli_prints_our_error_and_exits_2():
    out = subprocess.run(
        [sys.executable, "-m", "bwprune.lmeval", "--model", "bwprune",
         "--model_args", "model=tiny_llama,sparsity=1.5", "--tasks", "gsm8k_local",
         "--include_path", "tests/lmeval_tasks"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == "error: sparsity=1.5 is outside [0, 1)"
