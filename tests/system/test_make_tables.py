"""`make tables` as a command: it reads only the runs git tracks (unless told otherwise), and a bad
report source is one line on stderr."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_tables_reads_only_the_runs_git_tracks(results_tree, tmp_path):
    """An ad-hoc run (`make run`, a smoke run) must not enter, or rewrite, committed tables."""
    runs_dir, keys = results_tree
    repo_runs = tmp_path / "results" / "runs"
    for key in keys[:2]:  # the two dense runs
        shutil.copytree(runs_dir / key, repo_runs / key)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-f", str(repo_runs / keys[0])], check=True)

    def make_tables(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "scripts/make_tables.py", f"paths.results_dir={tmp_path / 'results'}",
             *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        assert ("left out 1 run(s)" in out.stdout) == (not args)
        return (tmp_path / "results" / "tables" / "runs.md").read_text()

    committed = make_tables()
    assert keys[0] in committed and keys[1] not in committed
    assert keys[1] in make_tables("report.runs=all")


def test_a_bad_source_is_one_line_naming_the_choices(tmp_path):
    out = subprocess.run(
        [sys.executable, "scripts/make_tables.py", "report.source=s3",
         f"paths.results_dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == "error: report.source='s3' is not valid; choose one of ['local', 'wandb']"
    )
