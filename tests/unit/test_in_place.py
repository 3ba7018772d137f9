"""Kept sets in place (`generation.kept_weights=in_place`): one copy of the MLP, reordered so a kept
set is its first rows, computes what the kept buffers compute and shows the model its own order."""

import copy

import pytest
import torch
import torch.nn.functional as F

from bwprune.config import build_method, validate
from bwprune.errors import UserError
from bwprune.generation.evaluate import paired_timing
from bwprune.generation.prepared import prepare_model
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.methods import side_by_side
from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import adapter_for
from bwprune.models.in_place import InPlaceKept, NeuronColumns, NeuronRows, ReorderedFFN
from bwprune.models.sliced_mlp import SlicedMLP
from tests.conftest import PROMPTS, chat, method_from_conf, prepared
from tests.unit.test_sliced_mlp import masked_reference


def reordered(tiny, layer=0):
    """A copy of one layer's MLP (the shared tiny model stays as it is), in place, and the
    original beside it."""
    model, _ = tiny
    original = adapter_for(model).ffn(layer).mlp
    mlp = copy.deepcopy(original)
    return SlicedMLP(mlp, in_place=True), original


def test_one_copy_whose_first_rows_are_the_kept_set(tiny):
    sliced, original = reordered(tiny)
    x = torch.randn(3, 5, original.gate_proj.in_features)
    keep = torch.randperm(sliced.d_ff)[:37]
    assert sliced.set_index(keep).refill
    assert isinstance(sliced.weights, InPlaceKept) and sliced.kept == 37
    gate = sliced.mlp.gate_proj.weight
    assert isinstance(sliced.mlp.down_proj, NeuronColumns)
    torch.testing.assert_close(gate[:37], original.gate_proj.weight[keep])  # the prefix
    torch.testing.assert_close(sliced.mlp.down_proj.rows[:37], original.down_proj.weight[:, keep].T)
    torch.testing.assert_close(sliced(x), masked_reference(original, x, keep), atol=1e-5,
                               rtol=1e-5)  # fmt: skip
    # no buffer beside the weights: the MLP's parameters are all the memory it has
    assert {p.untyped_storage().data_ptr() for p in sliced.mlp.parameters()} == {
        p.data_ptr() for p in (gate, sliced.mlp.up_proj.weight, sliced.mlp.down_proj.rows)
    }


def test_a_refresh_swaps_only_the_rows_of_the_neurons_that_moved(tiny):
    sliced, original = reordered(tiny)
    x = torch.randn(2, 3, original.gate_proj.in_features)
    first = torch.randperm(sliced.d_ff)[:40]
    sliced.set_index(first)
    gate = sliced.mlp.gate_proj.weight
    before, address = gate.clone(), gate.data_ptr()
    out = torch.tensor(sorted(set(range(sliced.d_ff)) - set(first.tolist())))[:10]
    second = torch.cat([first[:30], out])
    writes = sliced.set_index(second)
    assert not writes.refill and writes.entered == 10
    changed = (gate != before).any(dim=1).nonzero().flatten()
    assert len(changed) == 20 and gate.data_ptr() == address  # 10 kept rows, 10 rows behind
    assert set(sliced.mlp.bwprune_reordered.order.at[:40].tolist()) == set(second.tolist())
    torch.testing.assert_close(sliced(x), masked_reference(original, x, second), atol=1e-5,
                               rtol=1e-5)  # fmt: skip
    sliced.set_index(torch.arange(12))  # another capacity: the rows reordered again
    torch.testing.assert_close(sliced(x), masked_reference(original, x, torch.arange(12)),
                               atol=1e-5, rtol=1e-5)  # fmt: skip


def test_dense_forwards_show_hooks_and_sinks_the_models_own_neuron_order(tiny):
    """Reordered, a dense forward gives the MLP's output, gate's output and Z where the original
    has them; a restart puts every row back, bit for bit."""
    sliced, original = reordered(tiny)
    x = torch.randn(2, 4, original.gate_proj.in_features)
    sliced.set_index(torch.arange(33))  # the checkpoint's order still, ...
    sliced.set_index(torch.cat([torch.arange(23), torch.arange(40, 50)]))  # ... swapped away
    sliced.set_index(None)
    assert not sliced.mlp.bwprune_reordered.order.identity
    seen = {}
    with HookSet() as hooks:
        hooks.forward_pre(sliced.mlp.down_proj, lambda m, args: seen.update(z=args[0]))
        hooks.forward(sliced.mlp.gate_proj, lambda m, args, out: seen.update(gate=out))
        out = sliced(x)
    z = original.act_fn(original.gate_proj(x)) * original.up_proj(x)
    torch.testing.assert_close(out, original(x), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen["z"], z, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(seen["gate"], original.gate_proj(x), atol=1e-5, rtol=1e-5)
    sliced.sink = torch.zeros(2, 4, sliced.d_ff)
    sliced(x)
    torch.testing.assert_close(sliced.sink, z, atol=1e-5, rtol=1e-5)
    sliced.restart()
    for mine, theirs in [(sliced.mlp.gate_proj.weight, original.gate_proj.weight),
                         (sliced.mlp.down_proj.weight, original.down_proj.weight)]:  # fmt: skip
        assert torch.equal(mine, theirs)


def test_a_second_host_on_the_same_mlp_reuses_its_one_copy(tiny):
    sliced, _ = reordered(tiny)
    again = SlicedMLP(sliced.mlp, in_place=True)
    assert again.mlp.gate_proj is sliced.mlp.gate_proj
    assert isinstance(again.mlp.up_proj, NeuronRows)


def test_an_empty_kept_set_is_refused(tiny):
    sliced, _ = reordered(tiny)
    with pytest.raises(ValueError, match="every slot"):
        sliced.set_index(torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("method", ["ours", "griffin"])
def test_a_generation_in_place_decides_as_the_buffers_do(tiny, method):
    """Ours and Griffin end to end: the same tokens with either home of the kept weights. Both
    sum a kept set in slot order, but a dense step's down product adds in another order, and a
    random model's flat logits meet near-ties in float32 (CI's CPU flipped one at token 10), as a
    real model can (docs/engine.md); in float64 the last bits cannot flip a decision."""
    model, tok = tiny
    tokens = {}
    for kept_weights in ("buffers", "in_place"):
        mine = copy.deepcopy(model).double()
        m = method_from_conf(method)
        prepared(m, mine, tok)
        runner = BatchedRunner(mine, tok, m, adapter_for(mine), SamplingConfig(24),
                               kept_weights=kept_weights)  # fmt: skip
        completions, _ = runner.generate(chat(tok, PROMPTS))
        tokens[kept_weights] = [c.token_ids for c in completions]
        assert all(c.sparsity["sparse_steps"] > 0 for c in completions)
    assert tokens["in_place"] == tokens["buffers"]


def test_hf_layers_reordered_side_by_side_keep_their_own_weights():
    """Threads reorder layers of one shape at once (`side_by_side`): each through a scratch of
    its own thread's (one shared matrix mixed two layers' weights); wide enough that two
    threads' reorders overlap."""
    d_ff, hidden = 4096, 256

    def mlp(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        module = torch.nn.Module()
        module.gate_proj, module.up_proj = (torch.nn.Linear(hidden, d_ff, bias=False)
                                            for _ in range(2))  # fmt: skip
        module.down_proj = torch.nn.Linear(d_ff, hidden, bias=False)
        module.act_fn = F.silu
        return module

    mlps = [mlp(seed) for seed in range(8)]
    want = [m.gate_proj.weight.detach().clone() for m in mlps]
    ffns = [ReorderedFFN.of(m) for m in mlps]
    order = torch.randperm(d_ff)
    side_by_side.each(lambda f: f.reorder(order), ffns, 2)
    for ffn, gate in zip(ffns, want):
        assert torch.equal(ffn.gate.weight, gate[order])


@pytest.mark.parametrize("kept_weights", ["buffers", "in_place"])
def test_a_first_fill_in_place_runs_layer_by_layer(tiny, monkeypatch, kept_weights):
    """Buffers fill side by side on threads; an in-place fill re-lays whole MLPs, one layer at a
    time on the caller's threads (each thread would hold a scratch MLP of its own)."""
    model, tok = tiny
    threads = []
    each = side_by_side.each
    monkeypatch.setattr(side_by_side, "each", lambda fn, items, n: threads.append(n) or
                        each(fn, items, n))  # fmt: skip
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    m, mine = method_from_conf("ours"), copy.deepcopy(model)
    prepared(m, mine, tok)
    runner = BatchedRunner(mine, tok, m, adapter_for(mine), SamplingConfig(16),
                           kept_weights=kept_weights)  # fmt: skip
    runner.generate(chat(tok, PROMPTS[:2]))
    assert (max(threads, default=1) > 1) == (kept_weights == "buffers")


def test_bad_kept_weights_and_in_place_on_several_vllm_workers_are_refused(cfg_factory):
    with pytest.raises(UserError, match=r"kept_weights='panels'.*'buffers', 'in_place'"):
        validate(cfg_factory("generation.kept_weights=panels"))
    with pytest.raises(UserError, match="one vLLM worker"):
        validate(cfg_factory("generation.kept_weights=in_place", "generation.backend=vllm",
                             "generation.vllm.tensor_parallel_size=2"))  # fmt: skip
    validate(cfg_factory("generation.kept_weights=in_place", "generation.backend=vllm"))


@pytest.mark.parametrize("kept_weights", ["buffers", "in_place"])
def test_an_in_place_runs_paired_timing_runs_dense_on_a_model_of_its_own(cfg_factory, kept_weights):
    """Dense timed on the run's model would run the in-place projections (down from its rows,
    slower): the ratio would flatter the method."""
    cfg = cfg_factory("model=tiny_llama", "method=ours", f"generation.kept_weights={kept_weights}")
    prepared = prepare_model(cfg, build_method(cfg.method))
    runner = prepared.runner(SamplingConfig(4), 0, cfg.generation)
    timing = paired_timing(cfg, runner, prepared)
    assert (timing.dense.model is prepared.model) == (kept_weights == "buffers")
