"""scripts/gpu_check.py run as a command on CPU: every part runs, a spent budget skips parts and
says so, a failing part is recorded and the next parts still run.

The parts that compile run in a fresh process (dynamo's graph counts are per process); the checks
that compile nothing run the script in this one, which has torch loaded already."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from bwprune.report.tables import speed_table

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def _args(tmp_path: Path, *flags: str) -> list[str]:
    return ["--model", "tiny_llama", "--device", "cpu", "--backend", "eager",
            "--batch-sizes", "1", "2", "--new-tokens", "10", "--repeats", "1",
            "--long-tokens", "12", "--long-batch", "2", "--cache-dir", str(tmp_path / "cache"),
            "--vllm-batch-sizes", "--out", str(tmp_path / "out"), *flags]  # fmt: skip


def _record(tmp_path: Path) -> dict:
    (record,) = (tmp_path / "out").glob("*.json")
    return json.loads(record.read_text())


def _run(tmp_path: Path, *flags: str) -> dict:
    command = [sys.executable, str(SCRIPT), *_args(tmp_path, *flags)]
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=tmp_path)
    return _record(tmp_path)


def _run_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> dict:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *_args(tmp_path, *flags)])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts the checkout first
    runpy.run_path(str(SCRIPT), run_name="__main__")
    return _record(tmp_path)


@pytest.mark.slow
def test_the_check_runs_every_part_on_cpu(tmp_path):
    record = _run(tmp_path)
    assert [p["name"] for p in record["parts"]] == [
        "batch 1, eager", "batch 1, compiled", "long: 12 tokens at batch 2",
        "batch 2, eager", "batch 2, compiled",
    ]  # fmt: skip
    assert record["skipped"] == []
    labels = [{r["method"] for r in part["rows"]} for part in record["parts"]]
    assert labels[0] == {"dense", "ours", "ours_frozen", "teal"}
    assert labels[1] == {"dense@compiled", "ours@compiled", "ours_frozen@compiled", "teal@compiled"}
    assert labels[2] == {"dense", "dense@compiled"}
    compiled = [part["compiled"] for part in record["parts"]]
    # dense, TEAL's own, ours_frozen's and two of ours (its dense observing steps, its sparse
    # ones): off CUDA a kept set is an opaque op (bwprune.models.ffn_op) named by handle
    assert compiled[0]["graphs"] == 0 and compiled[1]["graphs"] == 5
    assert all(c["cudagraph_skips"] == 0 for c in compiled)  # none: no CUDA graphs on CPU
    batch_rows = [r for i in (0, 1, 3, 4) for r in record["parts"][i]["rows"]]
    assert record["rows"] == batch_rows  # what `make tables` renders, the long part apart
    assert len(speed_table("gpu", record["rows"]).frame) == len(batch_rows)
    summary = (tmp_path / "out" / "tiny_llama_random_cpu.md").read_text().split("## Eager vs")[1]
    assert "| long | dense |" in summary and "| batch 2 | ours_frozen |" in summary
    teal = next(line for line in summary.splitlines() if line.startswith("| batch 1 | teal |"))
    eager, compiled = (float(v) for v in teal.split("|")[-2].split(" / "))
    assert eager > 0.1 and compiled == pytest.approx(eager, abs=0.02)  # the graph accounts too


@pytest.mark.slow
def test_a_spent_budget_skips_every_part_and_says_so(monkeypatch, tmp_path):
    record = _run_here(monkeypatch, tmp_path, "--budget-s", "0")
    assert record["parts"] == []
    assert record["skipped"] == [
        "batch 1, eager", "batch 1, compiled", "long: 12 tokens at batch 2",
        "batch 2, eager", "batch 2, compiled",
    ]  # fmt: skip


@pytest.mark.slow
def test_a_failing_part_is_recorded_and_the_next_parts_still_run(monkeypatch, tmp_path):
    record = _run_here(monkeypatch, tmp_path, "--backend", "no_such_backend", "--long-tokens", "0")
    assert [f["name"] for f in record["failed"]] == ["batch 1, compiled", "batch 2, compiled"]
    assert "no_such_backend" in record["failed"][0]["error"]
    assert [p["name"] for p in record["parts"]] == ["batch 1, eager", "batch 2, eager"]


@pytest.mark.slow
def test_the_vllm_part_runs_where_vllm_is_installed(tmp_path):
    """Dense in our loop against dense and ours inside vLLM, on CPU with a model vLLM's
    attention takes (the compiled engine's part, dense alone, is left out: compiling costs
    the suite half a minute)."""
    pytest.importorskip("vllm", reason="the GPU check's vLLM part needs vllm")
    record = _run(tmp_path, "--model", "tiny_llama_wide", "--batch-sizes", "1",
                  "--long-tokens", "0", "--vllm-batch-sizes", "2", "--vllm-engines", "eager",
                  "--vllm-kv-cache-gib", "0.25")  # fmt: skip
    vllm = [p for p in record["parts"] if p["name"].startswith("vllm")]
    assert [p["name"] for p in vllm] == ["vllm eager: batch [2]"]
    assert record["failed"] == []
    assert {r["method"] for r in vllm[0]["rows"]} == {
        "dense", "dense@vllm", "ours@vllm", "ours_frozen@vllm"}  # fmt: skip
    frozen = next(r for r in vllm[0]["rows"] if r["method"] == "ours_frozen@vllm")
    assert frozen["sparse_fraction"] == 1.0
