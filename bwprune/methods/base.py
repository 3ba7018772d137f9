"""The interface every pruning method implements (ours and all baselines), and the step context.

Only `bwprune.engine.protocol.MethodDriver` calls this interface; it calls `prepare` once, and for
every batch `begin_batch`, then `begin_step` / `end_step` around every forward, with `keep_rows`
when rows leave the batch early. `attach` is entered around generation by whoever owns the model.
A method keeps its own state (scores, masks, schedule); state with a row dimension must follow
`keep_rows`. It touches the model only through the `HookSet` it returns from `attach`, so
detaching always restores the model.

Under continuous batching (`generation.batching=continuous`) a batch is a set of slots that rows
pass through: `rows_left(slots)` when rows finish and free their slots, then `rows_entered(slots)`
when new rows take them, followed by one PREFILL forward over the entering rows alone
(`StepContext.rows` names their slots). Decode steps always cover every slot; the step index
counts decode steps since `begin_batch`, so it is the stream's clock, not a row's.

Call order inside a method family is fixed by the family's base class, not by convention: a base
class lists in `sealed` the hooks it implements as a template, and a subclass that overrides one
of them fails at class creation, naming the hook meant for it instead.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.engine.ledger import StepSparsity
from bwprune.hooks import HookSet
from bwprune.models.adapters import ModelAdapter


class Phase(enum.Enum):
    PREFILL = "prefill"  # a prompt, or a scoring forward over given text
    DECODE = "decode"


@dataclass(frozen=True)
class StepContext:
    """What the driver tells a method about the forward that is about to run (or just ran).

    `valid` marks the tokens whose activations belong to the statistics: real prompt tokens during
    prefill, and the input token of every unfinished row during decode. Padding and rows that have
    already stopped are False (paper-specs A.3.2: they must not move a batch-shared mask).
    """

    phase: Phase
    step: int  # decode step index within the batch, 0-based; 0 during prefill
    valid: torch.Tensor  # (B, T) bool
    finished: torch.Tensor  # (B,) bool: rows that have stopped before this forward
    rows: torch.Tensor | None = None  # (k,) slots of an entering prefill; None: every row

    @property
    def batch_size(self) -> int:
        return self.finished.shape[0]


class PruningMethod:
    """A training-free pruning method. Defaults are those of a method that changes nothing.

    `batch_coupled` is True when one row's computation can depend on the other rows of its batch
    (a batch-shared mask); uncoupled methods must give each row the output it gets alone (the
    contract suite, tests/contract/, holds every method to what it declares here).
    `edits_weights` is True when `prepare` changes the model's weights or shapes (static pruning):
    the model as loaded is then gone, and timing it against dense needs the model loaded again.
    """

    batch_coupled: bool = False
    edits_weights: bool = False
    sealed: ClassVar[dict[str, str]] = {}  # template hook -> the hook subclasses override instead

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__mro__[1:]:
            for hook, instead in base.__dict__.get("sealed", {}).items():
                if hook in cls.__dict__:
                    raise TypeError(
                        f"{cls.__name__} overrides {base.__name__}.{hook}, which fixes the call "
                        f"order of its family; override {instead} instead"
                    )

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
        """`batch_size` rows enter: a new generation (fresh scores, memory, schedule)."""

    def keep_rows(self, index: torch.Tensor) -> None:
        """Rows leave early: from the next forward on, the batch is the current rows `index`.

        A method whose state has a row dimension gathers it here; shared state stays as it is.
        """

    def rows_left(self, slots: torch.Tensor) -> None:
        """Continuous batching: the rows in `slots` (1-D) have finished; the slots stay in the
        batch, empty (finished in every StepContext), until `rows_entered` fills them."""

    def rows_entered(self, slots: torch.Tensor) -> None:
        """Continuous batching: new rows take `slots` (1-D) of the running batch. A method with
        per-row state starts those rows afresh; the PREFILL forward of their prompts follows,
        with `StepContext.rows = slots` and `valid` of shape (len(slots), T)."""

    def begin_step(self, ctx: StepContext) -> None:
        """Called before every forward (prefill and each decode step)."""

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        """Called after every forward; returns what that forward skipped (None: it was dense)."""
        return None

    def capturable(self) -> bool:
        """Asked after `begin_step` of a decode step: True when that forward, hooks included,
        only computes tensors (writes no Python-side state), so the engine may run it compiled
        and graph-captured (`bwprune.engine.step`). A method without hooks always is."""
        return True
