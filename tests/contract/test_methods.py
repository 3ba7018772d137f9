"""The method contract: every `conf/method/*.yaml` (and the per-token variant of a method with a
`shared_mask` switch) is held to the invariants the paper depends on. A new method gets the suite
by adding its config file. Each forward runs through the one driver (`BatchedRunner` ->
`MethodDriver`), teacher-forced on a fixed continuation, so outputs are compared step by step.

- its neutral setting (ρ = 0) is exactly dense;
- leaving `attach` restores the model bit for bit;
- junk in left padding and in finished rows changes no batch-shared decision;
- a method that is not `batch_coupled` gives each row the output it gets alone, in static
  batches and in a continuous stream (every method accounts each streamed row once);
- `prepare` changes the weights exactly when the method declares `edits_weights`;
- the ledger equals the parameters the forward really left out (counted from the tensors);
- the HF host and a host-free harness that feeds the method tokens directly make it decide
  alike, forward for forward (tests/contract/harness.py);
- the call order of a family's hooks is enforced by its base class.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from bwprune.config import build_method
from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.prompts import left_pad
from bwprune.generation.runner import BatchedRunner, EngineConfig, Forcing, SamplingConfig
from bwprune.generation.stream import StreamRunner
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.thresholds import ThresholdMethod
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model
from tests.conftest import CONF_DIR, compose_cfg, prepared, small_calibration
from tests.contract.harness import Recording, replay
from tests.contract.oracle import SkipOracle

METHODS = sorted(p.stem for p in (Path(CONF_DIR) / "method").glob("*.yaml"))
PER_TOKEN = [m for m in METHODS if "shared_mask" in (Path(CONF_DIR) / "method" / f"{m}.yaml")
             .read_text()]  # fmt: skip
VARIANTS = [(m, ()) for m in METHODS] + [(m, ("method.shared_mask=false",)) for m in PER_TOKEN] \
    + [("ours", ("method.memory_policy=request",))]  # fmt: skip
IDS = [m + ("-" + extra[0].split(".")[-1] if extra else "") for m, extra in VARIANTS]
STEPS = 32  # forced decode steps: past ours' t_init = 8 and into its first sparse period
JUNK = 7  # a token id fed where the method must not look


@pytest.fixture(scope="module")
def calibration_overrides(tmp_path_factory) -> list[str]:
    """A small calibration set, cached per module."""
    return small_calibration(tmp_path_factory.mktemp("contract"))


def continuation(prompt: list[int]) -> torch.Tensor:
    """The (STEPS,) tokens forced after `prompt`: the same for a row alone and in a batch."""
    return torch.randint(3, 300, (STEPS,), generator=torch.Generator().manual_seed(sum(prompt)))


class Setup:
    """A fresh tiny model (methods may edit weights), its ledger as loaded, the built method."""

    def __init__(self, name: str, overrides: list[str], family: str = "tiny_llama") -> None:
        cfg = compose_cfg([f"model={family}", f"method={name}", *overrides])
        cfg.model.device = "cpu"
        self.model, self.tok = load_model(cfg.model, cache_dir="unused")
        self.adapter = adapter_for(self.model)
        self.ledger = SparsityLedger(self.adapter, torch.device("cpu"))
        self.method = build_method(cfg.method)
        MethodDriver(self.method, self.model, self.adapter, self.ledger).prepare(self.tok)
        self.runner: BatchedRunner | None = None  # the last `run`'s

    def run(self, rows: list[list[int]], lengths: list[int], pad: int | None = None,
            filler: int | None = None, inside=None,
            engine: EngineConfig | None = None) -> tuple[torch.Tensor, list[dict]]:  # fmt: skip
        """Teacher-force STEPS tokens after left-padded prompts `rows`; row b stops after
        `lengths[b]` tokens. `pad` fills prompt padding, `filler` what finished rows are fed
        (defaults: the tokenizer's pad); `inside` is entered with the method attached;
        `engine` runs it.
        Returns (steps, B, V) logits and the ledger rows."""
        pad_id = self.tok.pad_token_id
        ids, attn = left_pad(rows, pad_id if pad is None else pad)
        forced = Forcing(torch.stack([continuation(r) for r in rows]), torch.tensor(lengths))
        runner = self.runner = BatchedRunner(
            self.model, self.tok, self.method, self.adapter, SamplingConfig(STEPS),
            ledger=self.ledger, engine=engine or EngineConfig(),
        )  # fmt: skip
        if filler is not None:
            runner.pad_id = filler
        logits: list[torch.Tensor] = []
        if callable(inside):  # it wants the driver
            inside = inside(runner.driver)
        with runner.driver.attached(), inside or contextlib.nullcontext():
            completions, _ = runner.generate_tokens(
                ids, attn, forced=forced, observe=lambda i, x: logits.append(x.clone())
            )
        return torch.stack(logits), [c.sparsity for c in completions]


PROMPTS = [list(range(40, 52)), list(range(90, 97))]  # 12 and 7 tokens: the second is padded


@pytest.mark.parametrize("name", METHODS)
def test_neutral_setting_is_exactly_dense(name, calibration_overrides):
    dense, _ = Setup("dense", calibration_overrides).run(PROMPTS, [STEPS, STEPS])
    logits, rows = Setup(name, [*calibration_overrides, "sparsity=0"]).run(PROMPTS, [STEPS, STEPS])
    assert torch.equal(logits, dense)
    assert all(r["sparse_steps"] == 0 and r["params"] == 0 for r in rows)


@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=IDS)
def test_leaving_attach_restores_the_model(name, extra, calibration_overrides):
    s = Setup(name, [*calibration_overrides, *extra])
    probe = torch.tensor([PROMPTS[0]])
    before = s.model(input_ids=probe).logits
    modules = [(n, type(m)) for n, m in s.model.named_modules()]
    params = {n: p.clone() for n, p in s.model.named_parameters()}
    s.run(PROMPTS, [STEPS, 5])
    assert [(n, type(m)) for n, m in s.model.named_modules()] == modules
    assert all(torch.equal(params[n], p) for n, p in s.model.named_parameters())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in s.model.modules())
    assert torch.equal(s.model(input_ids=probe).logits, before)


@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=IDS)
def test_junk_in_padding_and_finished_rows_steers_nothing(name, extra, calibration_overrides):
    """Row 1 is left-padded and stops after 3 tokens; what its padding holds and what it is fed
    once finished must not move row 0's outputs (they depend on every batch-shared decision)."""
    s = Setup(name, [*calibration_overrides, *extra])
    engine = EngineConfig(compaction=False)  # finished rows stay in the batch, fed the filler
    clean, clean_rows = s.run(PROMPTS, [STEPS, 3], engine=engine)
    junk, junk_rows = s.run(PROMPTS, [STEPS, 3], pad=JUNK, filler=JUNK + 100, engine=engine)
    assert torch.equal(junk[:, 0], clean[:, 0])
    assert junk_rows[0] == clean_rows[0]


@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=IDS)
def test_uncoupled_rows_get_the_output_they_get_alone(name, extra, calibration_overrides):
    s = Setup(name, [*calibration_overrides, *extra])
    if s.method.batch_coupled:
        pytest.skip(f"{name} shares decisions across its batch (batch_coupled)")
    together, rows = s.run(PROMPTS, [STEPS, STEPS])
    for b, prompt in enumerate(PROMPTS):
        alone, alone_rows = s.run([prompt], [STEPS])
        # Batched float32 matmuls differ from batch-1 ones in the last bits.
        torch.testing.assert_close(together[:, b], alone[:, 0], atol=1e-4, rtol=1e-4)
        assert rows[b]["params"] == pytest.approx(alone_rows[0]["params"], abs=1e-3)


STREAM = [list(range(40 + 3 * i, 47 + 5 * i)) for i in range(5)]  # 7 ... 27 prompt tokens


@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=IDS)
def test_a_stream_returns_every_row_once_as_it_computes_alone(name, extra, calibration_overrides):
    """Continuous batching: 5 rows of uneven lengths through 2 slots, so rows enter a running
    batch. Every method accounts each row's own decode steps; one that is not batch-coupled
    gives each row the output it gets alone (float noise of other batch shapes aside)."""
    s = Setup(name, [*calibration_overrides, *extra])
    runner = BatchedRunner(s.model, s.tok, s.method, s.adapter, SamplingConfig(STEPS),
                           ledger=s.ledger)  # fmt: skip
    lengths = [STEPS, 5, 11, 3, 17]
    forced = [continuation(p)[:n] for p, n in zip(STREAM, lengths)]
    done, seen = {}, {}

    def observe(items, index, logits):
        seen.update({(i, n): x for i, n, x in zip(items.tolist(), index.tolist(), logits)})

    StreamRunner(runner, 2).run([torch.tensor(p) for p in STREAM],
                                lambda items, out, _: done.update(zip(items, out)),
                                forced=forced, observe=observe)  # fmt: skip
    assert sorted(done) == list(range(len(STREAM)))
    assert [done[i].sparsity["decode_steps"] for i in range(5)] == [n - 1 for n in lengths]
    if s.method.batch_coupled:
        return
    for i, prompt in enumerate(STREAM):
        alone, _ = s.run([prompt], [lengths[i]])
        for n in range(lengths[i]):
            torch.testing.assert_close(seen[(i, n)], alone[n, 0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=IDS)
def test_prepare_edits_the_weights_as_declared(name, extra, calibration_overrides):
    """Paired timing keeps a dense copy only for a method that declares `edits_weights`; one that
    edits without saying so would be timed against its own pruned weights."""
    cfg = compose_cfg(["model=tiny_llama", f"method={name}", *calibration_overrides, *extra])
    cfg.model.device = "cpu"
    model, tok = load_model(cfg.model, cache_dir="unused")
    before = {n: p.clone() for n, p in model.named_parameters()}
    method = build_method(cfg.method)
    prepared(method, model, tok)
    after = dict(model.named_parameters())
    edited = before.keys() != after.keys() or any(
        before[n].shape != p.shape or not torch.equal(before[n], p) for n, p in after.items()
    )
    assert edited == method.edits_weights


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen2"])
@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=IDS)
def test_ledger_counts_what_the_forward_left_out(name, extra, family, calibration_overrides):
    """Per row, the ledger's parameters skipped per decode token (c) equals a count made from the
    tensors themselves: weights that are absent, zero, meet a zero input, or feed a product
    whose other factor is zero (`SkipOracle`)."""
    s = Setup(name, [*calibration_overrides, *extra], family)
    oracle = SkipOracle(s.model, s.adapter, s.ledger.total_params)
    # Without compaction the batch keeps its shape, so the oracle's rows stay the ledger's rows
    # (compaction's own equivalence, ledger included, is tests/unit/test_engine.py's).
    _, rows = s.run(PROMPTS, [STEPS, 20], inside=oracle, engine=EngineConfig(compaction=False))
    counted = oracle.per_row([STEPS - 1, 19])  # decode steps: the first token comes from prefill
    for row, expected in zip(rows, counted):
        assert row["params"] == pytest.approx(expected, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(("name", "extra"), VARIANTS, ids=IDS)
def test_the_hf_host_and_a_host_free_harness_decide_alike(name, extra, calibration_overrides):
    """The HF host flattens padded (B, T, D) batches for the method; the harness hands a fresh,
    identically prepared method the same run's tokens itself, row by row and without the
    finished rows (as vLLM would). Kept sets, keep masks and what each forward skipped must be
    the same at every forward: prompts, padding, a row that stops early, every phase of ours'
    schedule, and a stream's rows leaving and entering their slots."""
    overrides = [*calibration_overrides, *extra]
    s = Setup(name, overrides)
    decides = isinstance(s.method, NeuronSetMethod) or (
        isinstance(s.method, ThresholdMethod) and s.method.active
    )
    static: list[Recording] = []

    def record(driver: MethodDriver) -> Recording:
        static.append(Recording(driver, s.adapter))
        return static[0]

    s.run(PROMPTS, [STEPS, 5], engine=EngineConfig(compaction=False), inside=record)
    compared = replay(Setup(name, overrides).method, static[0])
    assert compared >= STEPS if decides else compared == 0

    runner = BatchedRunner(s.model, s.tok, s.method, s.adapter, SamplingConfig(STEPS),
                           ledger=s.ledger)  # fmt: skip
    lengths = [STEPS, 5, 11, 3, 17]
    forced = [continuation(p)[:n] for p, n in zip(STREAM, lengths)]
    with Recording(runner.driver, s.adapter) as stream:
        StreamRunner(runner, 2).run([torch.tensor(p) for p in STREAM], lambda *_: None,
                                    forced=forced)  # fmt: skip
    assert any(f.entering is not None and len(f.entering) < 2 for f in stream.forwards)
    compared = replay(Setup(name, overrides).method, stream)
    assert compared >= STEPS if decides else compared == 0


@pytest.mark.parametrize(("family", "template"), [(NeuronSetMethod, "before_forward"),
                                                  (ThresholdMethod, "prepare")])  # fmt: skip
def test_a_family_fixes_its_call_order(family, template):
    with pytest.raises(TypeError, match=template):

        class Reordered(family):
            def begin_step(self, ctx):
                pass
