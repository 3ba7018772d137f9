"""Griffin: exactly k neurons per layer, chosen from the prompt, fixed through generation."""

import pytest
import torch

from baselines.griffin import Griffin
from bwprune.errors import UserError
from bwprune.models.sliced_mlp import SlicedMLP
from tests.conftest import PROMPTS, chat, method_from_conf, prepared, tiny_model
from tests.unit.test_baselines_thresholds import generate


class Recorder(Griffin):
    """Griffin that keeps, for each decode step, the index every layer computes."""

    def start(self, batch_size):
        super().start(batch_size)
        self.log = []

    def before_forward(self, ctx):
        super().before_forward(ctx)
        self.log.append([k.clone() for k in self.kept])


def recorder(**args) -> Recorder:
    return method_from_conf("griffin", cls=Recorder, sparsity=0.5, **args)


def test_keeps_exactly_k_and_never_changes_after_the_prompt(tiny):
    model, tok = tiny
    method = recorder()
    completions = generate(model, tok, method, PROMPTS, n=16)
    first = method.log[0]
    assert [k.numel() for k in first] == method.k == [64, 64]  # ⌊0.5 · 128⌋
    assert all(torch.equal(a, b) for kept in method.log for a, b in zip(kept, first))
    assert all(c.sparsity["ffn"] == pytest.approx(0.5) for c in completions)
    assert not any(isinstance(layer.mlp, SlicedMLP) for layer in model.model.layers)  # detached


def test_sparsity_zero_is_dense(tiny):
    model, tok = tiny
    dense = generate(model, tok, method_from_conf("dense"), PROMPTS)
    griffin = generate(model, tok, method_from_conf("griffin", sparsity=0.0), PROMPTS)
    assert [c.token_ids for c in griffin] == [c.token_ids for c in dense]
    assert all(c.sparsity["sparse_steps"] == 0 for c in griffin)


def test_batch_of_one_is_griffins_prompt_top_k(tiny):
    """s_j = ‖(z_t / ‖z_t‖)_j‖ over the prompt tokens, top-k: GRIFFIN at batch 1, by hand."""
    model, tok = tiny
    ids = tok(chat(tok, PROMPTS[:1]), return_tensors="pt", add_special_tokens=False).input_ids
    z = []
    handle = model.model.layers[1].mlp.down_proj.register_forward_pre_hook(
        lambda m, a: z.append(a[0][0])
    )
    with torch.no_grad():
        model(input_ids=ids)
    handle.remove()
    scores = (z[0] / z[0].norm(dim=-1, keepdim=True)).norm(dim=0)
    method = recorder()
    generate(model, tok, method, PROMPTS[:1], n=3)
    assert torch.equal(method.log[0][1].sort().values, scores.topk(64).indices.sort().values)


@pytest.mark.parametrize("how", ["mean", "max"])
def test_identical_rows_keep_the_set_of_the_row_alone(tiny, how):
    model, tok = tiny
    alone, twice = recorder(aggregate=how), recorder(aggregate=how)
    generate(model, tok, alone, PROMPTS[:1], n=3)
    generate(model, tok, twice, PROMPTS[:1] * 2, n=3)
    assert all(torch.equal(a, b) for a, b in zip(alone.log[0], twice.log[0]))


def test_bad_arguments():
    with pytest.raises(UserError, match=r"sparsity=-0.1 is outside \[0, 1\)"):
        method_from_conf("griffin", sparsity=-0.1)
    with pytest.raises(UserError, match="aggregate='median' is not valid; choose one of"):
        method_from_conf("griffin", sparsity=0.5, aggregate="median")


def test_prefill_reports_the_dense_forward_it_ran():
    """The mask Griffin picks at the end of prefill applies from the first decode step on."""
    model, tok = tiny_model("tiny_llama")
    method = method_from_conf("griffin", sparsity=0.5)
    driver = prepared(method, model, tok)
    ids = torch.tensor([[5, 6, 7, 8]])
    with driver.attached():
        driver.start(1)
        driver.score(torch.ones(1, 4, dtype=torch.bool), lambda: model(input_ids=ids))
        assert driver.rows()[0]["sparse_steps"] == 0  # the prompt pass ran dense
        driver.decode(0, torch.zeros(1, dtype=torch.bool), lambda _: model(input_ids=ids[:, :1]))
        assert driver.rows()[0]["sparse_steps"] == 1  # its mask applies from the first step
