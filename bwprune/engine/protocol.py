"""The one driver of the pruning-method protocol: every forward under a method goes through here.

Generation (the runner), perplexity, lm-eval scoring, fidelity, speed and traces all run their
forwards through a `MethodDriver`, so a method sees one protocol everywhere and realized sparsity
has one definition (`bwprune.engine.ledger`): the driver alone builds `StepContext`s (phase, valid
tokens, finished rows), calls the method's hooks in order and records measured forwards.

Rows have a lifecycle: `start(B)` makes B rows enter; `keep_rows(index)` makes the others leave
(live-row compaction: the method gathers its per-row state, the ledger keeps the leavers' totals).
Under continuous batching rows also pass through slots: `leave(slots)` hands back the finished
rows' sparsity and frees their slots, `enter(slots, ...)` fills them and runs the newcomers'
prompt forward.
The driver knows no method and runs no model: callers pass the forward as a function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from bwprune.engine.ledger import SparsityLedger
from bwprune.methods.base import Phase, PruningMethod, StepContext

T = TypeVar("T")


class MethodDriver:
    """Drives one method over batches: phases, valid masks, finished rows and the ledger."""

    def __init__(self, method: PruningMethod, ledger: SparsityLedger) -> None:
        """`ledger`: built on the model as loaded, before the method's `prepare`."""
        self.method, self.ledger = method, ledger

    def start(self, batch_size: int) -> None:
        """`batch_size` rows enter together: a new generation for the method and the ledger."""
        self.method.begin_batch(batch_size)
        self.ledger.reset(batch_size)

    def keep_rows(self, index: torch.Tensor) -> None:
        """Only the current rows `index` (1-D, ascending) go on; the others have left for good."""
        self.method.keep_rows(index)
        self.ledger.keep_rows(index)

    def leave(self, slots: torch.Tensor) -> list[dict]:
        """The rows in `slots` have finished: their ledger summaries (in `slots` order); the
        slots are empty until `enter`."""
        self.method.rows_left(slots)
        return self.ledger.take(slots)

    def enter(self, slots: torch.Tensor, valid: torch.Tensor, forward: Callable[[], T]) -> T:
        """New rows take the empty `slots`; `forward` is their prompts' prefill, (len(slots), T)
        `valid` tokens, the other rows untouched; not measured, as every prefill."""
        self.method.rows_entered(slots)
        finished = torch.zeros(len(slots), dtype=torch.bool, device=valid.device)
        ctx = StepContext(Phase.PREFILL, 0, valid, finished, rows=slots)
        return self._run(ctx, forward, counted=None)

    def prefill(self, valid: torch.Tensor, forward: Callable[[], T]) -> T:
        """A prompt forward over (B, T) `valid` tokens; not measured (ledger definition)."""
        return self._whole(valid, forward, measured=False)

    def decode(self, step: int, finished: torch.Tensor, forward: Callable[[bool], T]) -> T:
        """Decode step `step`: one token per row; rows in `finished` neither count nor steer.

        `forward(capturable)` is told whether the method allows this step to run compiled.
        """
        active = ~finished
        ctx = StepContext(Phase.DECODE, step, active[:, None], finished)
        return self._run(ctx, lambda: forward(self.method.capturable()), counted=active)

    def score(self, valid: torch.Tensor, forward: Callable[[], T]) -> T:
        """A forward whose every token is evaluated (perplexity, loglikelihood): the method sees a
        prefill; the forward is measured once per row that has a valid token."""
        return self._whole(valid, forward, measured=True)

    def _whole(self, valid: torch.Tensor, forward: Callable[[], T], measured: bool) -> T:
        """A forward over whole given texts (a prompt, a scored window): a PREFILL step."""
        finished = torch.zeros(valid.shape[0], dtype=torch.bool, device=valid.device)
        ctx = StepContext(Phase.PREFILL, 0, valid, finished)
        return self._run(ctx, forward, counted=valid.any(dim=1) if measured else None)

    def _run(self, ctx: StepContext, forward: Callable[[], T], counted: torch.Tensor | None) -> T:
        """The hooks around `forward`; `counted` (B,) rows are recorded (None: not measured)."""
        self.method.begin_step(ctx)
        out = forward()
        sparsity = self.method.end_step(ctx)
        if counted is not None:
            self.ledger.record(sparsity, counted)
        return out

    def rows(self) -> list[dict]:
        """Per-row ledger summaries of the current batch, in the order its rows entered."""
        return self.ledger.rows()
