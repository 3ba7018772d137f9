"""WikiText-2 perplexity: windows, the NLL sum, how methods are driven, and dense SmolLM2 (slow)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bwprune.benchmarks.wikitext2 import WikiText2
from bwprune.config import build
from bwprune.engine.ledger import SparsityLedger
from bwprune.errors import UserError
from bwprune.generation.perplexity import evaluate_perplexity
from bwprune.methods.base import Phase, PruningMethod, StepSparsity
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model
from tests.conftest import compose_cfg, method_from_conf, prepared, tiny_model

TEXT = "The quick brown fox jumps over the lazy dog . " * 8  # 368 bytes = byte-tokenizer tokens


@pytest.fixture
def text_file(tmp_path) -> Path:
    path = tmp_path / "test.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


@pytest.mark.parametrize(("seq_len", "stride"), [(64, None), (64, 16), (50, 50), (7, 3)])
def test_windows_score_every_token_once(seq_len, stride):
    """Strided: every token after the first, once. Blocked: all but each block's first token."""
    bench = WikiText2("w", "unused", seq_len=seq_len, stride=stride)
    windows = bench.windows(200)
    scored = [p for w in windows for p in range(w.first_target, w.end)]
    starts = {w.begin for w in windows} if bench.stride == seq_len else {0}
    assert scored == [p for p in range(200) if p not in starts]
    assert all(w.end - w.begin <= seq_len and w.begin < w.first_target for w in windows)
    assert WikiText2("w", "x", seq_len, stride, max_windows=3).windows(200) == windows[:3]


def test_bad_settings_name_the_value():
    for kwargs, match in [
        ({"seq_len": 1}, "seq_len=1"),
        ({"stride": 0}, "stride=0"),
        ({"seq_len": 8, "stride": 9}, "stride=9"),
        ({"max_windows": 0}, "max_windows=0"),
    ]:
        with pytest.raises(UserError, match=match):
            WikiText2("w", "unused", **kwargs)


def test_config_builds_a_perplexity_benchmark_on_the_test_file():
    bench = build(compose_cfg(["benchmark=wikitext2"]).benchmark)
    assert bench.kind == "perplexity" and bench.data_file.endswith("wikitext2/test.txt")
    assert bench.stride == bench.seq_len == 512
    with pytest.raises(UserError, match="perplexity"):
        bench.examples()


def test_one_window_equals_the_mean_cross_entropy(text_file):
    model, tok = tiny_model("tiny_llama")
    ids = tok(TEXT, return_tensors="pt").input_ids
    bench = WikiText2("w", str(text_file), seq_len=ids.shape[1])
    m = evaluate_perplexity(model, tok, method_from_conf("dense"), adapter_for(model), bench)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    ce = F.cross_entropy(logits[0, :-1], ids[0, 1:])
    assert m["n_windows"] == 1 and m["n_tokens"] == ids.shape[1] - 1
    assert m["perplexity"] == pytest.approx(math.exp(float(ce)), rel=1e-5)


def test_batch_size_and_stride_bookkeeping(text_file):
    model, tok = tiny_model("tiny_qwen2")
    n = len(tok(TEXT).input_ids)
    blocked = WikiText2("w", str(text_file), seq_len=40)
    one = evaluate_perplexity(
        model, tok, method_from_conf("dense"), adapter_for(model), blocked, batch_size=1
    )
    four = evaluate_perplexity(
        model, tok, method_from_conf("dense"), adapter_for(model), blocked, batch_size=4
    )
    assert one["n_tokens"] == four["n_tokens"] == n - one["n_windows"]  # block starts unscored
    assert one["perplexity"] == pytest.approx(four["perplexity"], rel=1e-5)
    strided = WikiText2("w", str(text_file), seq_len=40, stride=10)
    s = evaluate_perplexity(
        model, tok, method_from_conf("dense"), adapter_for(model), strided, batch_size=3
    )
    assert s["n_tokens"] == n - 1 and s["n_windows"] > one["n_windows"]
    assert math.isfinite(s["perplexity"]) and s["perplexity"] != one["perplexity"]


class Recorder(PruningMethod):
    """Records the calls the evaluation makes; reports a fixed sparsity."""

    def __init__(self, layers: int) -> None:
        self.calls: list[tuple] = []
        self.layers = layers

    def start(self, batch_size):
        self.calls.append(("start", batch_size))

    def begin_step(self, ctx):
        self.calls.append(("begin_step", ctx.phase, ctx.batch_size, ctx.entering.tolist()))

    def end_step(self, ctx):
        self.calls.append(("end_step", ctx.phase))
        return StepSparsity(ffn=torch.full((self.layers,), 0.25))


def test_method_sees_prefill_steps_and_ledger_counts_every_window(text_file):
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    method = Recorder(len(adapter.layers))
    bench = WikiText2("w", str(text_file), seq_len=100, max_windows=3)
    ledger = SparsityLedger(adapter, torch.device("cpu"))
    m = evaluate_perplexity(model, tok, method, adapter, bench, batch_size=2, ledger=ledger)
    assert method.calls[:3] == [
        ("start", 2),
        ("begin_step", Phase.PREFILL, 2, [0, 1]),  # a scored window: every row's text, whole
        ("end_step", Phase.PREFILL),
    ]
    assert ("start", 1) in method.calls
    rs = m["realized_sparsity"]
    assert rs["decode_steps"] == 3 and rs["ffn"] == pytest.approx(0.25)


def test_trisp_perplexity_records_what_it_removed(text_file):
    model, tok = tiny_model("tiny_llama")
    model = copy.deepcopy(model)
    adapter = adapter_for(model)
    ledger = SparsityLedger(adapter, torch.device("cpu"))  # before prepare: the original model
    before = adapter.num_params()
    calibration = {"text_file": str(text_file), "num_sequences": 2, "seq_len": 32, "seed": 0}
    method = method_from_conf("trisp", sparsity=0.3, calibration=calibration, recovery="bias")
    prepared(method, model, tok)
    bench = WikiText2("w", str(text_file), seq_len=64, max_windows=2)
    m = evaluate_perplexity(model, tok, method, adapter, bench, ledger=ledger)
    assert math.isfinite(m["perplexity"])
    removed = (before - adapter.num_params()) / ledger.total_params
    assert m["realized_sparsity"]["params"] == pytest.approx(removed)


@pytest.mark.slow
@pytest.mark.integration
def test_dense_smollm2_perplexity_is_finite_and_reproducible():
    """Two evaluations (batch 1 and 2) of the same windows give the same finite perplexity."""
    cfg = compose_cfg(["benchmark=wikitext2", "benchmark.seq_len=128", "benchmark.max_windows=2"])
    model, tok = load_model(cfg.model, cfg.paths.cache_dir)
    bench = build(cfg.benchmark)
    runs = [
        evaluate_perplexity(
            model, tok, method_from_conf("dense"), adapter_for(model), bench, batch_size=bs
        )
        for bs in (1, 2)
    ]
    assert runs[0]["n_tokens"] == runs[1]["n_tokens"] == 2 * 127
    assert 1.0 < runs[0]["perplexity"] < 1000.0
    assert runs[0]["perplexity"] == pytest.approx(runs[1]["perplexity"], rel=1e-5)
