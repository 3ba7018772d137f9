"""The interface every pruning method implements (ours and all baselines), and the step context.

The runner knows only this interface: it calls `prepare` once, enters `attach` around generation,
`begin_batch` per batch, and `begin_step` / `end_step` around every forward. A method keeps its own
state (scores, masks, schedule) with a row dimension where it has one, and touches the model only
through the `HookSet` it returns from `attach`, so detaching always restores the model.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.hooks import HookSet
from bwprune.methods.ledger import StepSparsity
from bwprune.models.adapters import ModelAdapter


class Phase(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True)
class StepContext:
    """What the runner tells a method about the forward that is about to run (or just ran).

    `valid` marks the tokens whose activations belong to the statistics: real prompt tokens during
    prefill, and the input token of every unfinished row during decode. Padding and rows that have
    already produced EOS are False (paper-specs A.3.2: they must not move a batch-shared mask).
    """

    phase: Phase
    step: int  # decode step index within the batch, 0-based; 0 during prefill
    valid: torch.Tensor  # (B, T) bool
    finished: torch.Tensor  # (B,) bool: rows that have stopped before this forward

    @property
    def batch_size(self) -> int:
        return self.finished.shape[0]


class PruningMethod:
    """A training-free pruning method. Defaults are those of a method that changes nothing.

    `batch_coupled` is True when one row's computation can depend on the other rows of its batch
    (a batch-shared mask); uncoupled methods must give each row the output it gets alone.
    """

    batch_coupled: bool = False

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        """One-off work before any generation: calibration, static weight pruning.

        The tokenizer is here for calibration text (`bwprune.calibration.calibration_windows`).
        """

    def attach(self, model: nn.Module, adapter: ModelAdapter) -> HookSet:
        """Install hooks / module swaps; everything is undone when the returned set exits."""
        return HookSet()

    def begin_batch(self, batch_size: int) -> None:
        """Reset per-batch state: a new batch is a new generation (scores, memory, schedule)."""

    def begin_step(self, ctx: StepContext) -> None:
        """Called before every forward (prefill and each decode step)."""

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        """Called after every forward; returns what that forward skipped (None: it was dense).

        Only decode steps are counted (see `bwprune.methods.ledger`).
        """
        return None
