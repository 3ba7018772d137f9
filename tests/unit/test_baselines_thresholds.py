"""TEAL and CATS (threshold methods) and the layer-by-layer calibration they share."""

from functools import partial
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from baselines.cats import EDGES, quantile_edge
from baselines.teal import histogram, icdf
from bwprune.config import package_data_dir
from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.methods.base import ModelShape, Phase, RowsStart, StepContext, Tokens
from bwprune.methods.calibrated import LayerStream, calibration_artifact
from bwprune.methods.calibration import calibration_windows
from bwprune.methods.thresholds import SiteCost
from bwprune.models.adapters import adapter_for
from tests.conftest import PROMPTS, chat, method_from_conf, prepared, tiny_model

WIKI = Path(package_data_dir()) / "wikitext2"
METHODS = ("teal", "cats")


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    """A 30 kB slice of WikiText-2 valid (the byte tokenizer needs ~5 s for the whole file)."""
    folder = tmp_path_factory.mktemp("cal")
    text = folder / "valid_head.txt"
    text.write_text(WIKI.joinpath("valid.txt").read_text(encoding="utf-8")[:30_000])
    return {"text_file": str(text), "num_sequences": 8, "seq_len": 128, "seed": 0,
            "cache_dir": str(folder)}  # fmt: skip


@pytest.fixture(scope="module")
def held_out(calibration):
    """(8, 48) windows of WikiText-2 test: calibration-like text that was not calibrated on."""
    text = Path(calibration["cache_dir"]) / "test_head.txt"
    text.write_text(WIKI.joinpath("test.txt").read_text(encoding="utf-8")[:20_000])
    return calibration_windows(tiny_model("tiny_llama")[1], text, 8, 48, seed=1)


def calibrated(name: str, calibration: dict, **args):
    """TEAL or CATS from its config, calibrated on `calibration`, its artifacts cached there."""
    return method_from_conf(name, calibration=calibration, cache_dir=calibration["cache_dir"],
                            **args)  # fmt: skip


@torch.no_grad()
def teacher_forced(model, method, ids: torch.Tensor) -> torch.Tensor:
    """Feed `ids` (B, T) one token per decode step (all rows active) through the driver; the
    (B,) realized FFN sparsity (a) of each row."""
    adapter = adapter_for(model)
    cache = DynamicCache(config=model.config)
    batch = ids.shape[0]
    driver = MethodDriver(method, model, adapter)
    with driver.attached():
        driver.start(batch)
        for t in range(ids.shape[1]):
            step = partial(model, input_ids=ids[:, t : t + 1], cache=cache, use_cache=True)
            driver.decode(t, torch.zeros(batch, dtype=torch.bool), lambda _, step=step: step())
    return torch.tensor([row["ffn"] for row in driver.rows()])


def generate(model, tok, method, prompts, n=12):
    from bwprune.generation.runner import BatchedRunner, SamplingConfig

    adapter = adapter_for(model)
    prepared(method, model, tok)
    runner = BatchedRunner(model, tok, method, adapter, SamplingConfig(n))
    return runner.generate(chat(tok, prompts))[0]


# -- shared calibration machinery ------------------------------------------------------------------
def test_layer_stream_reproduces_the_full_forward(tiny):
    model, _ = tiny
    adapter = adapter_for(model)
    windows = torch.randint(0, 256, (3, 20))
    stream = LayerStream(model, adapter, windows, batch_size=2)
    for i in range(len(adapter.layers)):
        stream.advance(i)
    final = []
    handle = model.model.norm.register_forward_pre_hook(lambda m, a: final.append(a[0]))
    with torch.no_grad():
        model(input_ids=windows, use_cache=False)
    handle.remove()
    torch.testing.assert_close(torch.cat(stream.hidden), final[0])


def test_calibration_cache_hit_skips_recomputation(calibration):
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    calls = []

    def compute(stream):
        calls.append(1)
        return {"x": torch.tensor([float(len(stream.hidden))])}

    def run(**cal):
        args = ("m", model, adapter, tok, {**calibration, **cal}, None, {"a": 1}, compute)
        return calibration_artifact(*args)

    first, again = run(), run()
    assert len(calls) == 1 and torch.equal(first["x"], again["x"])
    run(seed=3)  # different windows: a different artifact
    assert len(calls) == 2


# -- histogram -> threshold math -----------------------------------------------------------------
def test_teal_icdf_inverts_the_histogram():
    values = torch.linspace(-1, 1, 100_001)
    counts, centres = histogram(values, num_bins=1000, outlier=0.01)
    assert counts.sum() == values.numel()
    for s in (0.2, 0.5, 0.8):  # uniform on [-1, 1]: P(|x| <= s) = s  ->  t = s
        assert float(icdf(counts, centres, 0.5 + s / 2)) == pytest.approx(s, abs=2e-3)


def test_cats_threshold_is_the_quantile_at_bin_resolution():
    magnitudes = torch.rand(4, 50_000) * 0.5
    counts = torch.stack([torch.histogram(m, bins=EDGES)[0] for m in magnitudes])
    for s in (0.3, 0.5):
        t = quantile_edge(counts, s)
        assert torch.all((t - s * 0.5).abs() <= 0.0021)  # one bin of width 2/998


# -- TEAL and CATS ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("shared", [True, False])
def test_sparsity_zero_is_dense(tiny, name, shared):
    model, tok = tiny
    dense = generate(model, tok, method_from_conf("dense"), PROMPTS)
    method = method_from_conf(name, sparsity=0.0, shared_mask=shared)
    out = generate(model, tok, method, PROMPTS)
    assert [c.token_ids for c in out] == [c.token_ids for c in dense]
    assert all(c.sparsity["sparse_steps"] == 0 for c in out)


@pytest.mark.parametrize("name", METHODS)
def test_calibrated_threshold_realizes_rho_at_batch_one(name, calibration, held_out):
    model, tok = tiny_model("tiny_llama")
    for rho in (0.3, 0.6):
        method = calibrated(name, calibration, sparsity=rho, shared_mask=False)
        prepared(method, model, tok)
        realized = teacher_forced(model, method, held_out[:2, :32]).mean()
        assert realized == pytest.approx(rho, abs=0.05)


@pytest.mark.parametrize("name", METHODS)
def test_per_token_rows_are_independent(name, calibration):
    model, tok = tiny_model("tiny_qwen2")
    method = calibrated(name, calibration, sparsity=0.5, shared_mask=False)
    prompts = PROMPTS[1:]  # a short and a long prompt: left padding in prefill
    batched = generate(model, tok, method, prompts)
    for prompt, together in zip(prompts, batched):
        alone = generate(model, tok, method, [prompt])[0]
        assert alone.token_ids == together.token_ids
        assert alone.sparsity["ffn"] == pytest.approx(together.sparsity["ffn"])


@pytest.mark.parametrize("name", METHODS)
def test_shared_mask_realized_sparsity_falls_as_the_batch_grows(name, calibration, held_out):
    """The drift paper A reports. On these random models (all channels alike) an offline
    threshold on a batch aggregate keeps more entries as rows are added: the mean concentrates
    above the per-token median, the max only grows. The direction depends on the model: on
    SmolLM2, whose channel scales differ widely, TEAL's realized sparsity rises with the batch."""
    model, tok = tiny_model("tiny_llama")
    ids = held_out[:, :24]

    def realized(batch: int, **kw) -> float:
        method = calibrated(name, calibration, sparsity=0.5, **kw)
        prepared(method, model, tok)
        return float(teacher_forced(model, method, ids[:batch]).mean())

    alone = realized(1, shared_mask=False)
    assert realized(1, shared_mask=True) == pytest.approx(alone)  # a batch of one: per token
    assert realized(8, shared_mask=True, aggregate="mean") < alone - 0.05
    assert realized(8, shared_mask=True, aggregate="max") < alone - 0.05


def by_hand(threshold: float, layers: int = 2, width: int = 3):
    """TEAL with hand-set thresholds on a model of `layers` FFNs of `width` neurons, no host:
    its keep rule is called directly on flat magnitudes."""
    method = method_from_conf("teal", sparsity=0.5, calibration={"x": 1})
    method.setup(ModelShape((width,) * layers))
    sites = len(method.sites)
    method.thresholds = [[threshold] * sites for _ in range(layers)]
    method.costs = [[SiteCost(0.0, 1.0)] * sites for _ in range(layers)]
    return method


def context(phase: Phase, finished: list[bool]) -> StepContext:
    finished = torch.tensor(finished)
    rows = len(finished)
    entering = torch.arange(rows) if phase is Phase.PREFILL else None
    return StepContext(phase, 0, finished, torch.ones(rows, dtype=torch.bool),
                       torch.zeros(rows, dtype=torch.long), entering)  # fmt: skip


def test_shared_mask_ignores_finished_rows():
    method = by_hand(0.5)
    magnitude = torch.tensor([[1.0, 0.2, 0.6], [0.0, 9.0, 9.0]])  # (N=2 rows' tokens, D=3)

    def keep(active: list[bool]) -> list[bool]:
        method.rows(RowsStart(2))
        method.begin_step(context(Phase.DECODE, [not a for a in active]))
        tokens = Tokens(torch.arange(2), torch.tensor(active))
        return method.keep(0, 0, magnitude, tokens)[0].tolist()

    assert keep([True, True]) == [False, True, True]  # mean of both rows vs t = 0.5
    assert keep([True, False]) == [True, False, True]  # row 1 finished: row 0 alone


def test_teal_prefill_rule_thresholds_the_last_half_of_each_prompt():
    method = by_hand(0.5)
    assert method.prefill_fraction == 0.5
    method.rows(RowsStart(2))
    method.begin_step(context(Phase.PREFILL, [False, False]))
    # Row 0: a prompt of 3 tokens, row 1: of 5 (flat, as a host hands them in).
    tokens = Tokens(
        rows=torch.tensor([0, 0, 0, 1, 1, 1, 1, 1]),
        counts=torch.ones(8, dtype=torch.bool),
        position=torch.tensor([0, 1, 2, 0, 1, 2, 3, 4]),
        length=torch.tensor([3, 3, 3, 5, 5, 5, 5, 5]),
    )
    keep = method.keep(0, 0, torch.zeros(8, 3), tokens)  # every entry below the threshold
    thresholded = (~keep[:, 0]).tolist()
    expected = [False, False, True, False, False, False, True, True]
    assert thresholded == expected  # ⌊3/2⌋ = 1 and ⌊5/2⌋ = 2 last tokens


@pytest.mark.parametrize("name", METHODS)
def test_detach_restores_the_model(name, calibration):
    model, tok = tiny_model("tiny_llama")
    method = calibrated(name, calibration, sparsity=0.5)
    generate(model, tok, method, PROMPTS[:1])
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(sparsity=1.0), r"sparsity=1.0 is outside \[0, 1\)"),
        (dict(sparsity=0.5, aggregate="sum", calibration={"x": 1}), "aggregate='sum'"),
        (dict(sparsity=0.5, calibration=None), "needs a calibration config"),
        (dict(sparsity=0.5, prefill_fraction=2, calibration={"x": 1}), "prefill_fraction=2"),
        (dict(sparsity=0.5, num_bins=2, calibration={"x": 1}), "num_bins=2"),
    ],
)
def test_teal_bad_arguments(kw, message):
    with pytest.raises(UserError, match=message):
        method_from_conf("teal", **kw)


def test_cats_bad_arguments():
    with pytest.raises(UserError, match="aggregate='median'"):
        method_from_conf("cats", sparsity=0.5, aggregate="median", calibration={"x": 1})
    with pytest.raises(UserError, match="needs a calibration config"):
        method_from_conf("cats", sparsity=0.5, calibration=None)


def test_missing_calibration_text_is_a_user_error(calibration):
    model, tok = tiny_model("tiny_llama")
    method = calibrated("cats", {**calibration, "text_file": "/nope.txt"}, sparsity=0.5)
    with pytest.raises(UserError, match=r"/nope\.txt"):
        prepared(method, model, tok)
