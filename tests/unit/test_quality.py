"""Teacher-forced fidelity to dense: exact for dense itself, KL bins, wiring into run records."""

import pytest
import torch

from bwprune.experiment import run
from bwprune.generation.quality import binned_kl, dense_reference, forced_quality
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.models.adapters import adapter_for
from tests.conftest import PROMPTS, chat, method_from_conf, prepared


def test_binned_kl_is_exact_with_all_tokens_and_a_lower_bound_otherwise():
    torch.manual_seed(0)
    p = torch.randn(3, 50).log_softmax(-1)
    q = torch.randn(3, 50).log_softmax(-1)
    exact = (p.exp() * (p - q)).sum(-1)
    full = p.topk(50)
    torch.testing.assert_close(binned_kl(full.values, full.indices, q), exact)
    part = p.topk(10)
    approx = binned_kl(part.values, part.indices, q)
    assert torch.all(approx <= exact + 1e-6) and torch.all(approx >= 0)


def dense_setup(tiny, new_tokens, top_k):
    """(model, tokenizer, adapter, ids, attn, the dense greedy reference) for PROMPTS."""
    model, tok = tiny
    adapter = adapter_for(model)
    dense = BatchedRunner(
        model, tok, method_from_conf("dense"), adapter, SamplingConfig(new_tokens)
    )
    ids, attn = dense.encode(chat(tok, PROMPTS))
    return model, tok, adapter, dense, ids, attn, dense_reference(dense, ids, attn, top_k)


def test_dense_against_itself_has_zero_kl_and_equal_nll(tiny):
    *_, dense, ids, attn, ref = dense_setup(tiny, 16, 32)
    rows = forced_quality(dense, ids, attn, ref)
    for row, length in zip(rows, ref.forcing.lengths.tolist()):
        assert row["tokens"] == length
        assert row["nll"] == pytest.approx(row["nll_dense"], abs=1e-5)
        assert abs(row["kl"]) < 1e-5


def test_pruned_method_diverges_from_dense(tiny):
    model, tok, adapter, _, ids, attn, ref = dense_setup(tiny, 24, 64)
    method = method_from_conf("ours", sparsity=0.7, t_init=2, t_explore=2, t_prune=6)
    prepared(method, model, tok)
    pruned = BatchedRunner(model, tok, method, adapter, SamplingConfig(24))
    rows = forced_quality(pruned, ids, attn, ref)
    traced = forced_quality(pruned, ids, attn, ref, traces=True)
    assert all(r["kl"] > 0 for r in rows)
    assert all("trace" not in r for r in rows), "traces are opt-in: they are large"
    for row, t in zip(rows, traced):
        assert {k: v for k, v in t.items() if k != "trace"} == row
        for key in ("kl", "nll"):  # one value per reference token; their mean is the row's mean
            assert len(t["trace"][key]) == row["tokens"]
            assert sum(t["trace"][key]) / row["tokens"] == pytest.approx(row[key], abs=1e-3)


def test_quality_metrics_are_recorded(cfg_factory):
    record = run(cfg_factory("model=tiny_llama", "method=ours", "limit=2", "quality.enabled=true",
                             "quality.max_tokens=8", "generation.max_new_tokens=8"))  # fmt: skip
    q = record["metrics"]["quality"]
    assert q["tokens"] > 0 and q["kl"] >= 0 and set(q) >= {"nll", "nll_dense", "nll_increase"}


def test_a_finished_run_gets_the_quality_a_run_with_it_on_records(cfg_factory, tmp_path):
    """Measured after the fact, in the batches the run was generated in, KL and NLL to dense are
    what the same run records when it measures them itself; nothing else in the record moves."""
    import json
    from pathlib import Path

    from bwprune.generation.requality import requality

    same = ["model=tiny_llama", "method=ours", "limit=4", "batch_size=2", "quality.max_tokens=8",
            "generation.max_new_tokens=8", "speed.paired=false"]  # fmt: skip
    with_it = run(cfg_factory(*same, "quality.enabled=true", f"paths.results_dir={tmp_path}/on"))
    cfg = cfg_factory(*same, f"paths.results_dir={tmp_path}/off")
    record = run(cfg)
    assert not record["metrics"].get("quality")
    folder = Path(cfg.paths.runs_dir) / record["run_key"]
    timings = (folder / "timing.jsonl").read_text()
    new = requality(folder, cfg_factory("quality.max_tokens=8"))
    assert new["metrics"]["quality"] == pytest.approx(with_it["metrics"]["quality"])
    assert new["quality_measured"]["device"] == "cpu"
    assert (folder / "timing.jsonl").read_text() == timings
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert all(r["quality"]["tokens"] > 0 for r in rows)
    assert {k: v for k, v in new["metrics"].items() if k != "quality"} == {
        k: v for k, v in record["metrics"].items() if k != "quality"
    }
