"""The realized-sparsity definition on hand-made steps."""

import pytest
import torch

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.realized import combine
from bwprune.methods.base import StepSparsity
from bwprune.models.adapters import adapter_for


def test_ledger_definitions(tiny):
    model, _ = tiny
    adapter = adapter_for(model)
    ledger = SparsityLedger(adapter, torch.device("cpu"))
    ledger.reset(2)
    both, first_only = torch.tensor([True, True]), torch.tensor([True, False])
    ledger.record(None, both)  # dense step
    ledger.record(StepSparsity(torch.tensor([0.5, 0.5])), both)  # shared mask
    ledger.record(
        StepSparsity(torch.tensor([[0.25, 0.75], [1.0, 1.0]])), first_only
    )  # row 1 finished
    r0, r1 = ledger.rows()
    assert (r0["decode_steps"], r0["sparse_steps"], r1["decode_steps"]) == (3, 2, 2)
    assert r0["ffn"] == pytest.approx((0 + 0.5 + 0.5) / 3)
    assert r0["ffn_sparse_steps"] == pytest.approx(0.5)
    assert r1["ffn"] == pytest.approx(0.25) and r1["ffn_sparse_steps"] == pytest.approx(0.5)
    assert r0["per_layer"] == pytest.approx([0.75 / 3, 1.25 / 3], abs=1e-6)
    ffn_params = sum(f.num_params for f in adapter.ffns())
    assert r0["params"] == pytest.approx(r0["ffn"] * ffn_params / adapter.num_params())
    run = combine([r0, r1])
    assert run["ffn"] == pytest.approx((1.0 + 0.5) / 5)
    assert run["ffn_sparse_steps"] == pytest.approx(0.5)
    assert run["sparse_step_fraction"] == pytest.approx(3 / 5)


def test_dense_rows_are_zero(tiny):
    model, _ = tiny
    ledger = SparsityLedger(adapter_for(model), torch.device("cpu"))
    ledger.reset(3)
    for _ in range(4):
        ledger.record(None, torch.ones(3, dtype=torch.bool))
    assert all(r["ffn"] == r["params"] == 0 and r["decode_steps"] == 4 for r in ledger.rows())


def test_explicit_parameter_count(tiny):
    model, _ = tiny
    adapter = adapter_for(model)
    ledger = SparsityLedger(adapter, torch.device("cpu"))
    ledger.reset(1)
    skipped = torch.tensor(adapter.num_params() / 4)
    ledger.record(StepSparsity(torch.zeros(2), params=skipped), torch.tensor([True]))
    assert ledger.rows()[0]["params"] == pytest.approx(0.25)
