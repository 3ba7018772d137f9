"""`make bench`'s vLLM part from its script, on a tiny model: the rows it records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_speed.py"


@pytest.mark.slow
def test_the_vllm_part_can_leave_our_loop_out(tmp_path):
    """`bench.vllm.hf_loop=false` (a model whose HF and vLLM copies do not both fit in memory)
    times only the engines' rows, each against dense on its own engine."""
    pytest.importorskip("vllm", reason="the bench's vLLM part needs vllm")
    overrides = [
        "model=tiny_llama_wide", "bench.parts=[vllm]", "bench.vllm.batch_sizes=[2]",
        "~bench.vllm.engines.vllm_compiled", "~bench.vllm.methods.griffin",
        "~bench.vllm.methods.trisp", "bench.new_tokens=4", "bench.prompt_len=8",
        "bench.repeats=2", "bench.max_repeats=2", "bench.warmup=0",
        "generation.vllm.kv_cache_gib=0.25", "bench.vllm.hf_loop=false",
        f"paths.results_dir={tmp_path}",
    ]  # fmt: skip
    subprocess.run([sys.executable, str(SCRIPT), *overrides], check=True, capture_output=True,
                   text=True, cwd=tmp_path)  # fmt: skip
    record = json.loads((tmp_path / "speed" / "tiny_llama_wide_cpu_2t_vllm.json").read_text())
    rows = {r["method"]: r for r in record["vllm"]}
    assert set(rows) == {"dense@vllm", "ours@vllm", "ours_frozen@vllm"}
    assert rows["dense@vllm"]["speedup_decode"]["median"] == 1.0
    assert record["bench"]["vllm"]["hf_loop"] is False
