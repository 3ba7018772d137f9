"""The one driver of the method protocol: who may call it, what it records, rows that leave."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.methods.base import Phase, PruningMethod, StepSparsity
from bwprune.models.adapters import adapter_for
from tests.conftest import tiny_model

ROOT = Path(__file__).resolve().parents[2]
HOOKS = r"setup|begin_step|end_step|rows(?=\(Rows)"
PROTOCOL = re.compile(rf"(?<!super\(\))(?<!self)\.({HOOKS})\(")
# The driver, and the host-free harnesses that feed a method tokens with no model (on purpose).
DRIVERS = {
    ROOT / "bwprune" / "engine" / "protocol.py",
    ROOT / "tests" / "contract" / "harness.py",
    ROOT / "tests" / "unit" / "test_baselines_thresholds.py",
}


def test_only_the_driver_calls_the_protocol():
    """Anything else that calls a method's hooks is a second driver (and a second definition of
    what is measured). A family's template may call its own hooks through `self`/`super()`."""
    callers = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("bwprune", "baselines", "scripts", "tests", "notebooks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in DRIVERS
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if PROTOCOL.search(line)
    ]
    assert callers == []


class Scripted(PruningMethod):
    """Reports 0.5 of every layer on decode steps and on scoring forwards; logs the phases."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []

    def end_step(self, ctx):
        self.phases.append(ctx.phase)
        return StepSparsity(torch.full((2,), 0.5))


def driver() -> tuple[MethodDriver, Scripted]:
    method = Scripted()
    model = tiny_model("tiny_llama")[0]
    ledger = SparsityLedger(adapter_for(model), torch.device("cpu"))
    return MethodDriver(method, model, adapter_for(model), ledger), method


def test_measured_forwards_are_decode_steps_and_scoring_forwards_only():
    d, method = driver()
    d.start(2)
    d.prefill(torch.ones(2, 5, dtype=torch.bool), lambda: None)  # a prompt: not measured
    d.decode(0, torch.tensor([False, False]), lambda _: None)
    d.decode(1, torch.tensor([False, True]), lambda _: None)  # row 1 has stopped
    assert [r["decode_steps"] for r in d.rows()] == [2, 1]
    d.start(2)
    d.score(torch.tensor([[True, True], [False, False]]), lambda: None)  # row 1: no token
    assert [r["decode_steps"] for r in d.rows()] == [1, 0]
    assert method.phases == [Phase.PREFILL, Phase.DECODE, Phase.DECODE, Phase.PREFILL]


def test_rows_that_leave_keep_their_totals_in_their_original_place():
    d, _ = driver()
    d.start(3)
    d.decode(0, torch.zeros(3, dtype=torch.bool), lambda _: None)
    d.keep_rows(torch.tensor([0, 2]))  # row 1 leaves after one step
    d.decode(1, torch.zeros(2, dtype=torch.bool), lambda _: None)
    d.keep_rows(torch.tensor([1]))  # then row 0 (current index 0) leaves too
    d.decode(2, torch.zeros(1, dtype=torch.bool), lambda _: None)
    assert [r["decode_steps"] for r in d.rows()] == [2, 1, 3]
    assert all(r["ffn"] == pytest.approx(0.5) for r in d.rows())
