"""The one driver of the pruning-method protocol: every forward under a method goes through here.

Generation (the runner, the stream), perplexity, lm-eval scoring, fidelity, speed and traces all
run their forwards through a `MethodDriver`, so a method sees one protocol everywhere and realized
sparsity has one definition (`bwprune.engine.ledger`). The driver owns the method's whole life:
it calls `prepare` (with the model's shape), attaches its host's glue (the HF host,
`bwprune.methods.hf_host`, by default; vLLM's, `bwprune.vllm.binding.host`) for as long as forwards
run, turns the loop's row changes into the method's lifecycle events, builds every
`StepContext`, calls the hooks in order around each forward and records measured forwards.

Rows: `start(B)` makes B rows enter; `keep_rows(index)` makes the others leave (live-row
compaction: the method's per-slot state is gathered, the ledger keeps the leavers' totals).
Under continuous batching rows also pass through slots: `leave(slots)` hands back the finished
rows' sparsity and frees their slots, `enter(slots, ...)` fills them and runs the newcomers'
prompt forward. The driver knows no method and runs no model: callers pass the forward as a
function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.engine.ledger import SparsityLedger
from bwprune.methods.base import (
    ModelShape,
    Phase,
    PruningMethod,
    RowsEntered,
    RowsGathered,
    RowsLeft,
    RowsStart,
    StepContext,
)
from bwprune.methods.hf_host import HFHost
from bwprune.methods.host import Host
from bwprune.models.adapters import ModelAdapter

T = TypeVar("T")


class MethodDriver:
    """Drives one method on one model: its preparation, its glue, its rows and its forwards."""

    def __init__(
        self, method: PruningMethod, model: nn.Module, adapter: ModelAdapter,
        ledger: SparsityLedger | None = None, host: Host | None = None,
    ) -> None:  # fmt: skip
        """`ledger`: built on the model as loaded, before the method's `prepare` (default: on
        the model as it is now). `host`: the engine's glue (default: HF's, on `model`)."""
        self.method, self.model, self.adapter = method, model, adapter
        self.ledger = ledger or SparsityLedger(adapter, next(model.parameters()).device)
        self.host = host or HFHost(method)
        self._attached = 0  # nesting depth of `attached`

    def prepare(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """The method's one-off work (calibration, static pruning), on the model as it is now."""
        self.method.setup(ModelShape.of(self.adapter))
        self.method.prepare(self.model, self.adapter, tokenizer)

    @contextmanager
    def attached(self) -> Iterator[None]:
        """The method's glue is on the model inside (re-entrant); detaching restores it."""
        if self._attached:
            yield
            return
        self._attached += 1
        try:
            with self.host.attach(self.model, self.adapter):
                yield
        finally:
            self._attached -= 1

    # -- rows -------------------------------------------------------------------------------------
    def start(self, batch_size: int) -> None:
        """`batch_size` rows enter together: a new generation for the method and the ledger."""
        self.method.rows(RowsStart(batch_size, self.ledger.device))
        self.ledger.reset(batch_size)
        self.host.start()

    def keep_rows(self, index: torch.Tensor) -> None:
        """Only the current rows `index` (1-D, ascending) go on; the others have left for good."""
        self.method.rows(RowsGathered(index))
        self.ledger.keep_rows(index)

    def leave(self, slots: torch.Tensor) -> list[dict]:
        """The rows in `slots` have finished: their ledger summaries (in `slots` order); the
        slots are empty until `enter`."""
        self.method.rows(RowsLeft(slots))
        return self.ledger.take(slots)

    def enter(self, slots: torch.Tensor, valid: torch.Tensor, forward: Callable[[], T]) -> T:
        """New rows take the empty `slots`; `forward` is their prompts' prefill, (len(slots), T)
        `valid` tokens, the other rows untouched; not measured, as every prefill."""
        self.method.rows(RowsEntered(slots))
        ctx = self._context(Phase.PREFILL, 0, self.method.slots.occupied.logical_not(), slots)
        return self._run(ctx, valid, slots, forward, counted=None)

    # -- forwards ---------------------------------------------------------------------------------
    def prefill(self, valid: torch.Tensor, forward: Callable[[], T]) -> T:
        """A generation's prompt forward over (B, T) `valid` tokens: every row's prompt enters;
        not measured (ledger definition)."""
        return self._whole(valid, forward, measured=False)

    def decode(self, step: int, finished: torch.Tensor, forward: Callable[[bool], T],
               rows: torch.Tensor | None = None) -> T:  # fmt: skip
        """Decode step `step`: one token per row; rows in `finished` neither count nor steer.

        `forward(capturable)` is told whether the method allows this step to run compiled.
        `rows`: the slots the forward computes, one token each, ascending (None: every slot).
        An engine that drops empty slots from its forwards (vLLM) passes them, where one that
        keeps a fixed shape (the HF loop) runs finished rows as filler; either way only the
        unfinished rows count.
        """
        active = ~finished
        ctx = self._context(Phase.DECODE, step, finished, None)
        valid = active[:, None] if rows is None else active[rows][:, None]
        return self._run(ctx, valid, rows,
                         lambda: forward(self.method.capturable()), counted=active)  # fmt: skip

    def score(self, valid: torch.Tensor, forward: Callable[[], T]) -> T:
        """A forward whose every token is evaluated (perplexity, loglikelihood): the method sees a
        prefill; the forward is measured once per row that has a valid token."""
        return self._whole(valid, forward, measured=True)

    def _whole(self, valid: torch.Tensor, forward: Callable[[], T], measured: bool) -> T:
        """A forward over whole given texts (prompts, scored windows) of every row."""
        finished = torch.zeros(valid.shape[0], dtype=torch.bool, device=valid.device)
        every = torch.arange(valid.shape[0], device=valid.device)
        ctx = self._context(Phase.PREFILL, 0, finished, every)
        return self._run(ctx, valid, None, forward, counted=valid.any(dim=1) if measured else None)

    def _context(self, phase: Phase, step: int, finished: torch.Tensor,
                 entering: torch.Tensor | None) -> StepContext:  # fmt: skip
        slots = self.method.slots
        return StepContext(phase, step, finished, slots.occupied, slots.arrival, entering)

    def _run(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None,
             forward: Callable[[], T], counted: torch.Tensor | None) -> T:  # fmt: skip
        """The hooks around `forward`; `counted` (B,) rows are recorded (None: not measured)."""
        self.method.begin_step(ctx)
        self.host.begin(ctx, valid, slots)
        out = forward()
        self.host.end(ctx)
        sparsity = self.method.end_step(ctx)
        if counted is not None:
            self.ledger.record(sparsity, counted)
        return out

    def rows(self) -> list[dict]:
        """Per-row ledger summaries of the current batch, in the order its rows entered."""
        return self.ledger.rows()
