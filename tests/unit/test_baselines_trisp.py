"""TriSP on tiny random Llama/Qwen2 models: scores, allocation, physical removal, bias compensation,
the GQA rule, save/reload, and the method object as the runner uses it."""

from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import torch

from baselines.trisp import TriSP, load_pruned, save_pruned
from baselines.trisp.calibrate import collect_statistics, next_token_loss
from baselines.trisp.prune import prune_layer, record_structure
from baselines.trisp.scores import channel_scores, plan_pruning, standardize, unit_costs
from bwprune.config import build_method
from bwprune.engine.ledger import SparsityLedger
from bwprune.errors import UserError
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.methods.calibration import calibration_windows
from bwprune.models.adapters import adapter_for
from bwprune.runs.identity import method_name
from tests.conftest import (
    PROMPTS,
    TINY_MODELS,
    chat,
    compose_cfg,
    method_from_conf,
    prepared,
    reported,
    tiny_model,
)

VALID = Path(__file__).resolve().parents[2] / "bwprune" / "data" / "wikitext2" / "valid.txt"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    """The first 3000 characters of valid.txt: byte-tokenizing all of it is the slow part."""
    path = tmp_path_factory.mktemp("calib") / "valid_head.txt"
    path.write_text(VALID.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    return path


def calib(text_file: Path, **kw) -> dict:
    return {"text_file": str(text_file), "num_sequences": 4, "seq_len": 32, "seed": 0,
            "cache_dir": None, **kw}  # fmt: skip


_CACHE: dict[str, tuple] = {}


@pytest.fixture(params=TINY_MODELS)
def setup(request, text_file):
    """(original model, tokenizer, calibration windows, statistics of the original)."""
    name = request.param
    if name not in _CACHE:
        model, tok = tiny_model(name)
        windows = calibration_windows(tok, text_file, 4, 32)
        _CACHE[name] = (model, tok, windows, collect_statistics(model, adapter_for(model), windows))
    return _CACHE[name]


def prune_copy(model, stats, sparsity, bias=False, score="trisp"):
    """A pruned deep copy of `model` and the plan it followed."""
    pruned = copy.deepcopy(model)
    adapter = adapter_for(pruned)
    plan = plan_pruning(adapter, stats, sparsity, score)
    for i in range(len(adapter.layers)):
        means = (stats["attn_mean"][i], stats["mlp_mean"][i]) if bias else (None, None)
        prune_layer(adapter, i, plan.kv_groups[i], plan.neurons[i], *means)
    record_structure(pruned, adapter)
    return pruned, plan


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def projection_params(model) -> int:
    """Attention + MLP parameters, counted from the modules themselves."""
    return sum(
        p.numel()
        for name, m in model.named_modules()
        if name.rsplit(".", 1)[-1] in PROJECTIONS
        for p in m.parameters()
    )


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


IDS = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))


def test_scores_follow_eq_4_to_6():
    w = torch.tensor([[1.0, -2.0], [3.0, 0.0]])
    sq, grad = torch.tensor([4.0, 9.0]), torch.tensor([0.5, 2.0])
    scale = (sq + 1e-6).sqrt()
    wifn = torch.tensor([2.0, 1.0]) * scale
    torch.testing.assert_close(channel_scores(w, sq, grad, "wifn"), wifn)
    torch.testing.assert_close(channel_scores(w, sq, grad, "gs"), grad * scale)
    torch.testing.assert_close(channel_scores(w, sq, grad, "trisp"), (wifn * grad * scale).sqrt())
    z = standardize(torch.randn(3, 10) * 5 + 2, "layer")
    torch.testing.assert_close(z.mean(1), torch.zeros(3), atol=1e-6, rtol=0)
    torch.testing.assert_close(z.std(1), torch.ones(3))


def test_gradient_statistic_is_a_mean_of_per_sample_absolute_gradients(setup):
    """Eq. 2 inside Eq. 5: (1/N) Σ_t mean_i |W_ij|·|∂L_t/∂W_ij|, one backward per window."""
    model, _, windows, stats = setup
    down = adapter_for(model).ffn(1).down
    down.weight.requires_grad_(True)
    expected = torch.zeros(down.in_features)
    for w in windows:
        loss = next_token_loss(model(input_ids=w[None], use_cache=False).logits, w[None])
        (g,) = torch.autograd.grad(loss, down.weight)
        expected += (down.weight.abs() * g.abs()).mean(0).detach() / len(windows)
    down.weight.requires_grad_(False)
    torch.testing.assert_close(stats["mlp_grad"][1], expected)
    assert not any(p.requires_grad or p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("sparsity", [0.1, 0.3, 0.5])
def test_removed_fraction_matches_target_within_one_unit(setup, sparsity):
    model, _, _, stats = setup
    pruned, plan = prune_copy(model, stats, sparsity)
    group, neuron, total = unit_costs(adapter_for(model))
    assert total == projection_params(model)
    removed = 1 - projection_params(pruned) / total
    assert removed == pytest.approx(plan.removed_fraction)
    assert sparsity - max(group, neuron) / total < removed <= sparsity + 1e-12


def test_sparsity_zero_reproduces_dense_logits(setup):
    model, _, _, stats = setup
    for bias in (False, True):
        pruned, _ = prune_copy(model, stats, 0.0, bias=bias)
        torch.testing.assert_close(logits(pruned, IDS), logits(model, IDS), atol=1e-6, rtol=0)


def zeroed_copy(model, plan):
    """The original with the o_proj columns of pruned heads and down columns of pruned neurons
    zeroed."""
    masked = copy.deepcopy(model)
    adapter = adapter_for(masked)
    for i in range(len(adapter.layers)):
        a, f = adapter.attn(i), adapter.ffn(i)
        width = a.num_heads // a.num_kv_heads * a.head_dim
        keep = torch.zeros(a.num_kv_heads, dtype=torch.bool)
        keep[plan.kv_groups[i]] = True
        a.o.weight.data[:, ~keep.repeat_interleave(width)] = 0
        keep = torch.zeros(f.d_ff, dtype=torch.bool)
        keep[plan.neurons[i]] = True
        f.down.weight.data[:, ~keep] = 0
    return masked


def test_pruned_forward_equals_original_with_pruned_units_zeroed(setup):
    model, _, _, stats = setup
    pruned, plan = prune_copy(model, stats, 0.5)
    assert any(len(g) < adapter_for(model).attn(0).num_kv_heads for g in plan.kv_groups)
    ref = logits(zeroed_copy(model, plan), IDS)
    torch.testing.assert_close(logits(pruned, IDS), ref, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(logits(model, IDS), ref, atol=1e-3)


def test_bias_compensation_equals_mean_contribution_it_replaces(setup):
    model, _, windows, stats = setup
    pruned, plan = prune_copy(model, stats, 0.5, bias=True)
    adapter, new = adapter_for(model), adapter_for(pruned)
    inputs: dict = {}
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, args, k=key: inputs.setdefault(k, []).append(args[0])
        )
        for key, m in [(("o", i), adapter.attn(i).o) for i in range(2)]
        + [(("down", i), adapter.ffn(i).down) for i in range(2)]
    ]
    with torch.no_grad():
        for w in windows:
            model(input_ids=w[None], use_cache=False)
    for h in hooks:
        h.remove()
    for i in range(2):
        a = adapter.attn(i)
        width = a.num_heads // a.num_kv_heads * a.head_dim
        kept_o = (plan.kv_groups[i][:, None] * width + torch.arange(width)).flatten()
        for key, old, kept, bias in [
            ("o", a.o, kept_o, new.attn(i).o.bias),
            ("down", adapter.ffn(i).down, plan.neurons[i], new.ffn(i).down.bias),
        ]:
            x = torch.cat(inputs[(key, i)]).flatten(0, 1)  # every calibration token
            gone = torch.ones(old.in_features, dtype=torch.bool)
            gone[kept] = False
            mean_contribution = (x[:, gone] @ old.weight[:, gone].T).mean(0)
            torch.testing.assert_close(bias, mean_contribution, atol=1e-5, rtol=1e-4)


def test_gqa_rule_removes_whole_kv_groups_and_generation_runs(setup):
    model, tok, _, stats = setup
    pruned, plan = prune_copy(model, stats, 0.5, bias=True)
    adapter = adapter_for(pruned)
    ref = adapter_for(model).attn(0)
    rep = ref.num_heads // ref.num_kv_heads
    for i in range(len(adapter.layers)):
        a, attn = adapter.attn(i), adapter.layers[i].self_attn
        kv = len(plan.kv_groups[i])
        assert a.k.out_features == a.v.out_features == kv * ref.head_dim
        assert a.q.out_features == a.o.in_features == kv * rep * ref.head_dim
        assert attn.num_key_value_groups == rep
        assert (
            adapter.ffn(i).d_ff == len(plan.neurons[i]) == adapter.layers[i].mlp.intermediate_size
        )
    # the runner's KV-cache decode on the pruned model matches the zeroed original token for token
    prompts = chat(tok, PROMPTS)
    pruned_none, plan_none = prune_copy(model, stats, 0.5)
    ours, _ = BatchedRunner(
        pruned_none, tok, method_from_conf("dense"), adapter_for(pruned_none), SamplingConfig(8)
    ).generate(prompts)
    masked = zeroed_copy(model, plan_none)
    theirs, _ = BatchedRunner(
        masked, tok, method_from_conf("dense"), adapter_for(masked), SamplingConfig(8)
    ).generate(prompts)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]


def test_save_and_reload(setup, tmp_path):
    model, tok, _, stats = setup
    pruned, _ = prune_copy(model, stats, 0.5, bias=True)
    save_pruned(pruned, tmp_path / "m", tok)
    loaded = load_pruned(tmp_path / "m")
    assert loaded.config.trisp_structure == pruned.config.trisp_structure
    torch.testing.assert_close(logits(loaded, IDS), logits(pruned, IDS), atol=0, rtol=0)
    model.save_pretrained(tmp_path / "dense")
    with pytest.raises(UserError, match="no TriSP-pruned model"):
        load_pruned(tmp_path / "dense")


def test_method_prepares_and_reports_realized_sparsity(setup, text_file, tmp_path):
    model, tok, _, _ = setup
    pruned = copy.deepcopy(model)
    adapter = adapter_for(pruned)
    d_ff = torch.tensor([f.d_ff for f in adapter.ffns()], dtype=torch.float64)
    before = adapter.num_params()
    ledger = SparsityLedger(adapter, torch.device("cpu"))  # the model as loaded
    cal = calib(text_file, cache_dir=str(tmp_path))
    method = method_from_conf("trisp", sparsity=0.4, calibration=cal, recovery="bias")
    assert reported(method, pruned, ledger)["sparse_steps"] == 0  # nothing removed yet
    prepared(method, pruned, tok)
    row = reported(method, pruned, ledger)
    kept = torch.tensor([f.d_ff for f in adapter.ffns()], dtype=torch.float64)
    assert row["per_layer"] == pytest.approx((1 - kept / d_ff).tolist(), abs=1e-6)
    assert row["params"] * before == pytest.approx(before - adapter.num_params())
    assert before > adapter.num_params()
    assert list((tmp_path / "calibration" / "trisp").rglob("artifact.pt"))  # cached statistics
    again = copy.deepcopy(model)
    prepared(method_from_conf("trisp", sparsity=0.4, calibration=cal), again, tok)
    torch.testing.assert_close(logits(again, IDS), logits(pruned, IDS), atol=0, rtol=0)


def test_score_ablations_change_the_plan(setup):
    model, _, _, stats = setup
    kept = {
        tuple(torch.cat(prune_copy(model, stats, 0.3, score=s)[1].neurons).tolist())
        for s in ("trisp", "wifn", "gs")
    }
    assert len(kept) == 3


def test_attn_square_changes_which_kv_group_a_layer_keeps(setup):
    """FLAP squares attention channel scores before the z-score; TriSP's Eq. 6 does not. Layer 0's
    scores are set by hand: KV group 0 has 1.0 on every channel, group 1 has 3.0 on an eighth of
    its channels and 0.1 on the rest. A per-layer z-score is affine, so the group mean keeps the
    order of the raw means (1 > 0.46: group 0 wins) or, squared, of the mean squares (1.13 > 1:
    group 1 wins). At ρ 0.6 the layer keeps only its best group."""
    model, _, _, stats = setup
    a = adapter_for(model).attn(0)
    assert a.num_kv_heads == 2
    width = a.num_heads // a.num_kv_heads * a.head_dim  # o_proj channels per KV group
    peak = torch.arange(width) < width // 8
    x = torch.cat([torch.ones(width), torch.where(peak, 3.0, 0.1)])
    m = a.o.weight.detach().abs().mean(0)  # Eq. 4's mean_i |W_ij|
    # With Ḡ-term = m and a = (x / m)²: WIFN = GS = S = x (up to Eq. 4's ε).
    stats = {**stats, "attn_sq": stats["attn_sq"].clone(), "attn_grad": stats["attn_grad"].clone()}
    stats["attn_sq"][0], stats["attn_grad"][0] = (x / m) ** 2, m
    kept = {
        square: plan_pruning(adapter_for(model), stats, 0.6, attn_square=square).kv_groups[0]
        for square in (False, True)
    }
    assert kept[False].tolist() == [0]
    assert kept[True].tolist() == [1]


def test_the_method_plans_with_its_attn_square(setup, text_file, monkeypatch):
    """The option reaches `plan_pruning` from the config, not only from direct calls."""
    import baselines.trisp.method as method_module

    model, tok, _, _ = setup
    seen = []

    def spy(*args, **kwargs):
        seen.append(inspect.signature(plan_pruning).bind(*args, **kwargs).arguments["attn_square"])
        return plan_pruning(*args, **kwargs)

    monkeypatch.setattr(method_module, "plan_pruning", spy)
    for square in (True, False):
        pruned = copy.deepcopy(model)
        method = method_from_conf(
            "trisp", sparsity=0.3, calibration=calib(text_file), attn_square=square
        )
        prepared(method, pruned, tok)
    assert seen == [True, False]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sparsity": 1.0}, "sparsity=1.0"),
        ({"score": "taylor"}, r"score='taylor'.*\['gs', 'trisp', 'wifn'\]"),
        ({"zscore": "none"}, r"zscore='none'.*\['layer', 'model'\]"),
        ({"attn_square": "no"}, r"attn_square='no' must be true or false"),
        ({"recovery": "sft"}, r"recovery='sft'.*\['bias', 'lora', 'none'\]"),
        ({"lora": {"rank": 0}}, r"lora.rank=0"),
        ({"calibration": {"text_file": "x"}}, "num_sequences"),
    ],
)
def test_bad_arguments_name_value_and_choices(kwargs, match):
    args = {"sparsity": 0.2, "calibration": calib("x"), **kwargs}
    with pytest.raises(UserError, match=match):
        method_from_conf("trisp", **args)


def test_config_composes_and_instantiates():
    cfg = compose_cfg(["method=trisp", "sparsity=0.2", "method.recovery=lora"])
    method = build_method(cfg.method)
    assert isinstance(method, TriSP) and method_name(cfg) == "trisp"
    assert method.sparsity == 0.2 and method.recovery == "lora" and method.lora.rank == 8
    assert method.attn_square is False  # paper B's text; FLAP's code squares
    assert method.calibration["text_file"].endswith("wikitext2/valid.txt")
