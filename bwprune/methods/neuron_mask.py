"""Shared mechanics of methods that keep a batch-shared set of FFN neurons per layer.

`NeuronMaskMethod` swaps a `SlicedMLP` into every layer, so a kept set turns into real smaller
matmuls, and reads the FF activation Z (the input of down_proj) with a pre-hook when the subclass
asks for it. Subclasses decide *when* to observe and *which* neurons to keep (paper A's periodic
top-k, Griffin's prompt-phase top-k, ...) in `before_forward` / `after_forward`; the base class
owns `begin_step` / `end_step`, so what a forward is reported to run with is always the kept set
it really ran with. Under continuous batching the prompts of entering rows run dense and are
scored apart (`prompts_entered`), the kept sets in force coming back unchanged after them.
This module holds no selection policy.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bwprune.engine.ledger import StepSparsity
from bwprune.hooks import HookSet
from bwprune.methods.base import PruningMethod, StepContext
from bwprune.methods.neuron_scores import normalized_sq, phase_score
from bwprune.models.adapters import ModelAdapter
from bwprune.models.sliced_mlp import SlicedMLP


class PhaseScores:
    """Running Eq. 2 statistics of one scoring phase: per layer, per row, per neuron.

    Rows that leave the batch mid-phase (live-row compaction) keep the statistics they gathered
    while they ran, so the phase's batch score is the same whether they leave or stay finished.
    """

    def __init__(self, num_layers: int) -> None:
        self.sum_sq: list[torch.Tensor | None] = [None] * num_layers  # (B, D) each
        self.count: torch.Tensor | None = None  # (B,) valid tokens seen in this phase
        self._left: list[torch.Tensor] = [torch.empty(0)] * num_layers  # (R, D): rows that left
        self._left_count = torch.empty(0)  # (R,)

    def add(self, layer: int, z: torch.Tensor, valid: torch.Tensor) -> None:
        """Accumulate layer `layer`'s (B, T, D) activations over the (B, T) valid tokens."""
        sq = normalized_sq(z, valid)
        prev = self.sum_sq[layer]
        self.sum_sq[layer] = sq if prev is None else prev + sq

    def count_tokens(self, valid: torch.Tensor) -> None:
        """Once per forward (not per layer): every layer sees the same tokens."""
        n = valid.sum(dim=1).float()
        self.count = n if self.count is None else self.count + n

    def scores(self, layer: int) -> torch.Tensor:
        """(rows, D) Eq. 2 scores of this phase for `layer`, rows that left first."""
        if not len(self._left_count):
            return phase_score(self.sum_sq[layer], self.count)
        sum_sq = torch.cat([self._left[layer], self.sum_sq[layer]])
        return phase_score(sum_sq, torch.cat([self._left_count, self.count]))

    @property
    def rows(self) -> torch.Tensor:
        """(rows,) rows that contributed at least one valid token (in `scores` order)."""
        count = torch.cat([self._left_count, self.count]) if len(self._left_count) else self.count
        return count > 0

    def gather(self, index: torch.Tensor) -> None:
        """Only the current rows `index` go on; the others' statistics are set aside."""
        if self.count is None:  # nothing observed yet in this phase
            return
        gone = torch.ones_like(self.count, dtype=torch.bool)
        gone[index] = False
        self._set_aside(gone)
        self.sum_sq = [None if s is None else s[index] for s in self.sum_sq]
        self.count = self.count[index]

    def replace(self, slots: torch.Tensor) -> None:
        """New rows take `slots`: the old occupants' statistics are set aside as if they had
        left, and the slots start again from zero."""
        if self.count is None:  # nothing observed yet in this phase
            return
        slots = slots.to(self.count.device)
        taken = torch.zeros_like(self.count, dtype=torch.bool)
        taken[slots] = True
        self._set_aside(taken)
        self.sum_sq = [None if s is None else s.index_fill(0, slots, 0.0) for s in self.sum_sq]
        self.count = self.count.index_fill(0, slots, 0.0)

    def _set_aside(self, rows: torch.Tensor) -> None:
        """Keep the statistics of `rows` (B,) bool apart: they count in `scores`, never change."""
        if not bool(rows.any()):
            return
        self._left = [
            torch.cat([left, s[rows]]) if len(left) else s[rows]
            for left, s in zip(self._left, self.sum_sq)
        ]
        left = self._left_count
        self._left_count = torch.cat([left, self.count[rows]]) if len(left) else self.count[rows]


class NeuronMaskMethod(PruningMethod):
    """Base for methods whose effect is "layer l computes only the neurons in index_l"."""

    batch_coupled = True
    sealed: ClassVar[dict[str, str]] = {"begin_step": "before_forward", "end_step": "after_forward"}

    def __init__(self) -> None:
        self.sliced: list[SlicedMLP] = []
        self.phase: PhaseScores | None = None  # set by the subclass while it is observing
        self._ffn_sparsity: torch.Tensor | None = None  # (L,) of the current kept sets; None: dense
        self._ran_at: torch.Tensor | None = None  # _ffn_sparsity when the current forward began
        self._outside: tuple | None = None  # (indices, _ffn_sparsity, phase) during entering

    def attach(self, model: nn.Module, adapter: ModelAdapter) -> HookSet:
        hooks = HookSet()
        views = adapter.ffns()
        if [s.mlp for s in self.sliced] != [v.mlp for v in views]:  # reuse gather buffers
            self.sliced = [SlicedMLP(v.mlp) for v in views]
        for view, sliced in zip(views, self.sliced):
            hooks.swap(view.layer, "mlp", sliced)
            hooks.forward_pre(view.down, self._observer(view.index))
        return hooks

    def _observer(self, layer: int):
        def read_z(module: nn.Module, args: tuple) -> None:
            if self.phase is not None:
                self.phase.add(layer, args[0], self._valid)

        return read_z

    def begin_step(self, ctx: StepContext) -> None:
        """Template: the subclass picks this forward's kept set, then it is snapshotted. The
        prompts of entering rows (`ctx.rows`) run dense, observed apart from the open phase."""
        if ctx.rows is None:
            self.before_forward(ctx)
        else:
            self._open_entering()
        self._valid = ctx.valid
        self._ran_at = self._ffn_sparsity  # what this forward computes, whatever happens after
        if self.phase is not None:
            self.phase.count_tokens(ctx.valid)

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        """Template: reports the kept sets this forward ran with, then lets the subclass react
        (a mask chosen in `after_forward` applies from the next forward). After entering
        prompts the kept sets in force before them come back, then `prompts_entered`."""
        ran = None if self._ran_at is None else StepSparsity(self._ran_at)
        if ctx.rows is None:
            self.after_forward(ctx)
        else:
            self.prompts_entered(ctx.rows, self._close_entering())
        return ran

    def before_forward(self, ctx: StepContext) -> None:
        """Subclass hook: schedule, `set_kept`, start or stop observing, before the forward."""

    def after_forward(self, ctx: StepContext) -> None:
        """Subclass hook: react to what the forward observed (e.g. choose the next kept set)."""

    def prompts_entered(self, slots: torch.Tensor, scores: PhaseScores) -> None:
        """Subclass hook (continuous batching): rows entered `slots`; `scores` holds their
        prompts' statistics, one row per slot in `slots` order. The kept sets are back as
        they were before the prompts ran."""

    def keep_rows(self, index: torch.Tensor) -> None:
        if self.phase is not None:
            self.phase.gather(index)

    def rows_entered(self, slots: torch.Tensor) -> None:
        if self.phase is not None:
            self.phase.replace(slots)

    def _open_entering(self) -> None:
        """Entering prompts run dense (the papers never prune a prefill) and are observed into
        a phase of their own: the open phase, if any, waits outside."""
        self._outside = ([s.index for s in self.sliced], self._ffn_sparsity, self.phase)
        self.set_kept(None)
        self.phase = PhaseScores(len(self.sliced))

    def _close_entering(self) -> PhaseScores:
        """Puts back the kept sets and phase that were in force; the entering prompts' scores."""
        (indices, sparsity, phase), self._outside = self._outside, None
        for s, index in zip(self.sliced, indices):
            s.set_index(index)  # the same tensors: the same neurons, gathered again
        entered, self.phase, self._ffn_sparsity = self.phase, phase, sparsity
        return entered

    def capturable(self) -> bool:
        """A forward that observes Z accumulates scores in Python state; the others (every
        sparse step, unobserved dense steps) only compute with the kept set."""
        return self.phase is None

    def set_kept(self, indices: list[torch.Tensor] | None) -> None:
        """Keep `indices[l]` in layer l from the next forward on; None: every layer dense."""
        if indices is None:
            for s in self.sliced:
                s.set_index(None)
            self._ffn_sparsity = None
            return
        for s, idx in zip(self.sliced, indices):
            s.set_index(None if idx.numel() == s.d_ff else idx)  # all kept: the exact dense path
        if all(s.index is None for s in self.sliced):
            self._ffn_sparsity = None
            return
        device = indices[0].device
        kept = torch.tensor([s.kept for s in self.sliced], dtype=torch.float64, device=device)
        d_ff = torch.tensor([s.d_ff for s in self.sliced], dtype=torch.float64, device=device)
        self._ffn_sparsity = 1.0 - kept / d_ff
