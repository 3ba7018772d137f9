"""Wanda: exact per-row and N:M patterns, sequential calibration, honest ledger. Wanda edits
weights in `prepare`, so every test builds a fresh tiny model."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from baselines.wanda import Wanda, parse_pattern, wanda_mask
from bwprune.config import package_data_dir
from bwprune.engine.ledger import SparsityLedger
from bwprune.errors import UserError
from bwprune.methods.calibrated import LayerStream
from bwprune.methods.calibration import calibration_windows
from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model
from tests.conftest import CONF_DIR, method_from_conf, prepared, reported

LINEARS = ("q", "k", "v", "o", "gate", "up", "down")


def fresh_model():
    cfg = OmegaConf.load(Path(CONF_DIR) / "model" / "tiny_llama.yaml")
    cfg.device = "cpu"
    return load_model(cfg, cache_dir="unused")


@pytest.fixture
def cal(tmp_path):
    source = Path(package_data_dir()) / "wikitext2" / "valid.txt"
    (tmp_path / "head.txt").write_text(source.read_text(encoding="utf-8")[:12_000])
    return dict(text_file=str(tmp_path / "head.txt"), num_sequences=4, seq_len=64, seed=0,
                cache_dir=str(tmp_path))  # fmt: skip


def wanda(cal, **args) -> Wanda:
    return method_from_conf("wanda", calibration=cal, cache_dir=cal["cache_dir"], **args)


def pruned(pattern, cal, sparsity=0.5):
    """(pruned model, method, dense weights, a ledger of the model as loaded)."""
    model, tok = fresh_model()
    dense = {n: p.clone() for n, p in model.named_parameters()}
    ledger = SparsityLedger(adapter_for(model), torch.device("cpu"))
    method = wanda(cal, sparsity=sparsity, pattern=pattern)
    prepared(method, model, tok)
    return model, method, dense, ledger


def linears(model):
    adapter = adapter_for(model)
    for i in range(len(adapter.layers)):
        yield from Wanda._linears(adapter, i).values()


def test_unstructured_zeroes_exactly_the_fraction_in_every_row(cal):
    model, *_ = pruned("unstructured", cal)
    for lin in linears(model):
        zeros = (lin.weight == 0).sum(dim=1)
        assert torch.all(zeros == lin.in_features // 2)


def test_two_four_holds_in_every_group(cal):
    model, method, dense, ledger = pruned("2:4", cal)
    for lin in linears(model):
        groups = (lin.weight == 0).reshape(lin.out_features, -1, 4).sum(dim=-1)
        assert torch.all(groups == 2)
    row = reported(method, model, ledger)
    assert row["per_layer"] == [0.5, 0.5]  # half of every gate/up/down weight
    zeroed = sum(lin.weight.numel() // 2 for lin in linears(model))
    assert row["params"] == pytest.approx(zeroed / ledger.total_params)
    untouched = [n for n in dense if "proj" not in n]  # embeddings, norms, lm_head
    assert all(torch.equal(dense[n], dict(model.named_parameters())[n]) for n in untouched)


def test_sparsity_zero_changes_nothing(cal):
    model, method, dense, ledger = pruned("2:4", cal, sparsity=0.0)
    assert all(torch.equal(dense[n], p) for n, p in model.named_parameters())
    assert reported(method, model, ledger)["sparse_steps"] == 0
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


def test_later_layers_are_calibrated_on_pruned_outputs(cal):
    """Layer 0 sees the embeddings either way; layer 1's inputs change once layer 0 is pruned,
    so its statistics differ from those of one dense pass."""
    model, tok = fresh_model()
    method = wanda(cal, sparsity=0.5, pattern="unstructured")
    norms = {}
    sequential = method._sequential_norms
    method._sequential_norms = lambda stream, adapter: (
        norms.update(sequential(stream, adapter)) or norms
    )
    prepared(method, model, tok)

    dense_model, _ = fresh_model()
    adapter = adapter_for(dense_model)
    dense = {0: 0.0, 1: 0.0}

    def add(layer):
        def hook(module, args):
            dense[layer] = dense[layer] + args[0].square().sum(dim=(0, 1))

        return hook

    # Dense statistics through the calibration path methods use, with nothing pruned in between.
    stream = LayerStream(dense_model, adapter, calibration_windows(tok, cal["text_file"], 4, 64, 0))
    with HookSet() as hooks:
        for i in (0, 1):
            hooks.forward_pre(adapter.attn(i).q, add(i))
            stream.advance(i)
    torch.testing.assert_close(norms["0.q"], dense[0])
    assert not torch.allclose(norms["1.q"], dense[1], rtol=1e-3)


def test_wanda_mask_on_hand_made_scores():
    weight = torch.tensor([[1.0, -4.0, 2.0, 3.0], [5.0, 1.0, -1.0, 2.0]])
    sq_norm = torch.tensor([16.0, 1.0, 1.0, 0.25])  # ‖X_j‖ = 4, 1, 1, 0.5
    # scores: row 0 = 4, 4, 2, 1.5; row 1 = 20, 1, 1, 1
    assert wanda_mask(weight, sq_norm, 0.5, None).tolist() == [
        [False, False, True, True],
        [False, True, True, False],  # ties broken by a stable sort: the first two of the 1s
    ]
    assert wanda_mask(weight, sq_norm, 0.25, None).sum(dim=1).tolist() == [1, 1]
    assert wanda_mask(weight, sq_norm, 0.5, (2, 4)).sum(dim=1).tolist() == [2, 2]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(sparsity=0.5, pattern="3:2"), "pattern='3:2' is not valid"),
        (dict(sparsity=0.5, pattern="dense"), "pattern='dense' is not valid"),
        (dict(sparsity=0.3, pattern="2:4", calibration={"x": 1}), "sparsity=0.3 must be 0.5"),
        (dict(sparsity=0.5, pattern="unstructured", calibration=None), "needs a calibration"),
        (dict(sparsity=1.0), r"outside \[0, 1\)"),
    ],
)
def test_bad_arguments(kw, message):
    with pytest.raises(UserError, match=message):
        method_from_conf("wanda", **kw)


def test_parse_pattern():
    assert parse_pattern("unstructured") is None
    assert parse_pattern("4:8") == (4, 8)
