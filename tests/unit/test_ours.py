"""`ours`: schedule, memory, exact k, dense equivalence, threshold drift."""

import itertools

import pytest
import torch

from baselines.dense import Dense
from bwprune.errors import UserError
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.methods.ours import Ours
from bwprune.models.adapters import adapter_for
from tests.conftest import PROMPTS, chat, compose_cfg, method_from_conf, prepared, tiny_model

N = 40  # new tokens: t_init 4 + two periods of 3 sparse + 2 dense + ...


def generate(model, tok, method, prompts, n=N):
    prepared(method, model, tok)
    runner = BatchedRunner(model, tok, method, adapter_for(model), SamplingConfig(n))
    return runner.generate(chat(tok, prompts))


class Recorder(Ours):
    """`ours` logging, before each decode step, whether it prunes and the kept sets."""

    def start(self, batch_size):
        super().start(batch_size)
        self.log = []

    def before_forward(self, ctx):
        super().before_forward(ctx)
        kept = [None if k is None else k.clone() for k in self.kept]
        memory = [None if m is None else m.clone() for m in self.memory]
        self.log.append((ctx.step, kept, memory))


def recorder(**args) -> Recorder:
    return method_from_conf("ours", cls=Recorder, **args)


@pytest.mark.parametrize("kw", [dict(sparsity=0.0), dict(sparsity=0.5, t_prune=0)])
def test_rho_zero_or_no_pruning_steps_is_dense(tiny, kw):
    model, tok = tiny
    dense, _ = generate(model, tok, Dense(), PROMPTS)
    ours, _ = generate(model, tok, method_from_conf("ours", **kw), PROMPTS)
    assert [c.token_ids for c in ours] == [c.token_ids for c in dense]
    assert all(c.sparsity["sparse_steps"] == 0 for c in ours)


def test_schedule_exact_k_and_mask_changes_only_at_period_boundaries(tiny):
    model, tok = tiny
    method = recorder(sparsity=0.5, t_init=4, t_explore=2, t_prune=3)
    completions, _ = generate(model, tok, method, PROMPTS)
    period = 5
    prev = None
    for step, kept, _ in method.log:
        sparse = step >= 4 and (step - 4) % period < 3
        assert (kept[0] is not None) == sparse, step
        if sparse:
            assert [k.numel() for k in kept] == method.k == [64, 64]  # exact k per layer
            if prev is not None and (step - 4) % period != 0:
                assert all(torch.equal(a, b) for a, b in zip(kept, prev)), step  # within a period
            prev = kept
    for c in completions:  # sparse-step FFN sparsity is exactly ρ
        assert c.sparsity["ffn_sparse_steps"] == pytest.approx(0.5)


def test_memory_only_grows(tiny):
    model, tok = tiny
    method = recorder(sparsity=0.5, t_init=2, t_explore=2, t_prune=2)
    generate(model, tok, method, PROMPTS)
    memories = [m for _, _, m in method.log if m[0] is not None]
    for before, after in itertools.pairwise(memories):
        assert all(torch.all(b <= a).item() for b, a in zip(before, after))


def test_batch_of_one_equals_per_sample_scores(tiny):
    """Max over a batch of one is that sample's own score: same masks as the row alone."""
    model, tok = tiny
    alone = recorder(sparsity=0.5, t_init=3, t_explore=2, t_prune=3, aggregate="mean")
    generate(model, tok, alone, PROMPTS[:1])
    again = recorder(sparsity=0.5, t_init=3, t_explore=2, t_prune=3, aggregate="max")
    generate(model, tok, again, PROMPTS[:1])
    for (_, k1, _), (_, k2, _) in zip(alone.log, again.log):
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(k1, k2))


def test_finished_and_padded_rows_do_not_move_the_mask(tiny):
    """A row that stops at once contributes only its prompt; padding never contributes."""
    model, tok = tiny
    short = recorder(sparsity=0.5, t_init=2, t_explore=2, t_prune=2)
    both = recorder(sparsity=0.5, t_init=2, t_explore=2, t_prune=2, aggregate="max")
    generate(model, tok, short, PROMPTS[:1])
    generate(model, tok, both, PROMPTS[:1] * 2)  # the same row twice: max == the row itself
    for (_, k1, _), (_, k2, _) in zip(short.log, both.log):
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(k1, k2))


def test_threshold_drifts_with_batch_while_topk_stays_at_rho(tmp_path):
    model, tok = tiny_model("tiny_llama")
    cal = compose_cfg(["calibration.num_sequences=4", "calibration.seq_len=64"]).calibration
    realized = {}
    for select in ("topk", "threshold"):
        for batch in (1, 3):
            method = method_from_conf(
                "ours",
                sparsity=0.5,
                t_init=2,
                t_explore=2,
                t_prune=4,
                select=select,
                calibration=cal,
                cache_dir=str(tmp_path),
            )
            completions, _ = generate(model, tok, method, (PROMPTS * 2)[:batch], n=30)
            realized[select, batch] = completions[0].sparsity["ffn_sparse_steps"]
    assert realized["topk", 1] == realized["topk", 3] == pytest.approx(0.5)
    assert realized["threshold", 3] < realized["threshold", 1]  # max over more rows keeps more
    assert list((tmp_path / "calibration" / "ours").rglob("artifact.pt"))  # cached for reuse


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(sparsity=1.0), r"sparsity=1.0 is outside \[0, 1\)"),
        (dict(sparsity=0.5, t_init=-1), "t_init=-1 must be >= 0"),
        (dict(sparsity=0.5, aggregate="sum"), r"aggregate='sum' is not valid; choose one of"),
        (dict(sparsity=0.5, k_rule="ceil"), "k_rule='ceil'"),
        (dict(sparsity=0.5, select="random"), "select='random'"),
        (dict(sparsity=0.5, select="threshold", calibration=None), "needs a calibration config"),
    ],
)
def test_bad_arguments(kw, message):
    with pytest.raises(UserError, match=message):
        method_from_conf("ours", **kw)


def test_finished_rows_do_not_change_the_batch_score(tiny):
    """A row whose tokens are not valid (a finished row fed padding, padding itself) runs
    through the model, but its activations must not enter the batch score."""
    model, tok = tiny
    method = method_from_conf("ours", sparsity=0.5)
    driver = prepared(method, model, tok)
    ids = torch.tensor([[5, 6, 7], [9, 200, 31]])

    def batch_score(rows, valid):
        with driver.attached():
            driver.start(len(rows))
            driver.prefill(valid, lambda: model(input_ids=ids[rows]))
            return method.memory[0]  # the prompts' batch score, absorbed

    alone = batch_score([0], torch.ones(1, 3, dtype=torch.bool))
    with_finished = batch_score([0, 1], torch.tensor([[True] * 3, [False] * 3]))
    torch.testing.assert_close(with_finished, alone)
