"""`make bench`'s vLLM part on the real models, from its script, on a tiny model in their place."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_speed.py"


def _bench(tmp_path: Path, *overrides: str) -> dict:
    subprocess.run([sys.executable, str(SCRIPT), "model=tiny_llama", "bench.parts=[vllm_models]",
                    "bench.vllm_models.batch_sizes=[2]", "bench.vllm_models.new_tokens=4",
                    "bench.prompt_len=8", "bench.repeats=2", "bench.max_repeats=2",
                    "bench.warmup=0", "generation.vllm.kv_cache_gib=0.25",
                    f"paths.results_dir={tmp_path}", *overrides],
                   check=True, capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    return json.loads((tmp_path / "speed" / "tiny_llama_cpu_2t_vllm_models.json").read_text())


@pytest.mark.slow
def test_each_model_s_vllm_part_runs_in_its_own_process_without_our_loop(tmp_path):
    """Each model's rows come from a process of its own, the run's own overrides go with it, and
    with `hf_loop: false` (the 1.5B's two copies of the weights page on 24 GiB) only the engines'
    rows, each against dense vLLM; that model's own vLLM record is left as it was (the part's
    process writes elsewhere); a model that is not installed is a line in the record, not the
    end of the bench."""
    pytest.importorskip("vllm", reason="the bench's vLLM part needs vllm")
    own = tmp_path / "speed" / "tiny_llama_wide_cpu_2t_vllm.json"
    own.parent.mkdir()
    own.write_text('{"made": "by bench.parts=[vllm] model=tiny_llama_wide"}')
    record = _bench(tmp_path, "bench.vllm_models.models=[tiny_llama_wide,no_such_model]")
    rows = {r["method"]: r for r in record["vllm_models"]["tiny_llama_wide"]}
    assert set(rows) == {"dense@vllm", "ours@vllm", "ours_frozen@vllm"}
    assert rows["dense@vllm"]["speedup_decode"]["median"] == 1.0
    assert {r["batch_size"] for r in rows.values()} == {2}
    assert rows["ours@vllm"]["repeats"] == 2  # bench.max_repeats, passed on
    assert json.loads(own.read_text()) == {"made": "by bench.parts=[vllm] model=tiny_llama_wide"}
    assert record["vllm_models"]["no_such_model"] == []
    assert "vLLM on no_such_model (not measured:" in (
        tmp_path / "speed" / "tiny_llama_cpu_2t_vllm_models.md").read_text()  # fmt: skip
