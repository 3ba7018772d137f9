"""What the report side imports, checked in a fresh interpreter."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_records_and_report_import_no_torch():
    """Tables, rescoring and the W&B source run where no model does (and start fast)."""
    modules = (
        "bwprune.runs.identity",
        "bwprune.runs.recorder",
        "bwprune.runs.rescore",
        "bwprune.benchmarks.selection",
        "bwprune.report.tables",
        "bwprune.report.collect",
        "bwprune.report.figures",
        "bwprune.report.wandb_source",
    )
    code = f"import sys; import {', '.join(modules)}; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_a_run_imports_vllm_only_when_it_uses_it():
    """vLLM takes seconds to import and patches torch: an HF run never pays for it."""
    code = "import sys; import bwprune.experiment, bwprune.cli; sys.exit('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
