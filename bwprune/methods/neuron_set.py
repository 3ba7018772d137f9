"""The family of methods that keep a batch-shared set of FFN neurons per layer (ours, Griffin).

Host-free: a method of this family reads the FF activation Z (the input of down_proj) of the
tokens that count, flat, through `observe`, and answers with `kept`: per layer the neuron index
the next forward computes (None: dense). A host turns a kept set into real smaller matmuls
(`bwprune.models.sliced_mlp.SlicedMLP` in the HF host). The base class owns the plumbing —
which scoring phase is open, per-slot statistics that follow compaction and refills, the prompts
of entering rows (run dense, scored apart, the kept sets in force coming back after them), and
the ledger's view of what each forward ran with — so a subclass writes only its policy:
`start`, `before_forward` (schedule, `set_kept`, open a phase), `prompts_entered`.
A generation's first prefill is the prompts of all its rows entering at once.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from bwprune.methods.base import (
    PruningMethod,
    RowEvent,
    RowsEntered,
    RowsGathered,
    RowsStart,
    StepContext,
    StepSparsity,
    Tokens,
)
from bwprune.methods.neuron_scores import phase_score, unit_sq


class PhaseScores:
    """Running Eq. 2 statistics of one scoring phase: per layer, per slot, per neuron.

    Rows that leave the batch mid-phase (live-row compaction, a stream's refill) keep the
    statistics they gathered while they ran, so the phase's batch score is the same whether they
    leave or stay finished.
    """

    def __init__(self, num_layers: int, batch_size: int) -> None:
        self.batch_size = batch_size
        self.sum_sq: list[torch.Tensor | None] = [None] * num_layers  # (B, D) each
        self.count: list[torch.Tensor | None] = [None] * num_layers  # (B,) tokens seen
        self._left: list[torch.Tensor] = [torch.empty(0)] * num_layers  # (R, D): rows that left
        self._left_count: list[torch.Tensor] = [torch.empty(0)] * num_layers  # (R,)

    def add(self, layer: int, z: torch.Tensor, tokens: Tokens) -> None:
        """Accumulate layer `layer`'s (N, D) activations of the tokens that count."""
        weight = tokens.counts.to(torch.float32)
        if self.sum_sq[layer] is None:
            self.sum_sq[layer] = z.new_zeros(self.batch_size, z.shape[-1], dtype=torch.float32)
            self.count[layer] = weight.new_zeros(self.batch_size)
        self.sum_sq[layer].index_add_(0, tokens.rows, unit_sq(z) * weight[:, None])
        self.count[layer].index_add_(0, tokens.rows, weight)

    @property
    def observed(self) -> bool:
        return self.count[0] is not None

    def scores(self, layer: int) -> torch.Tensor:
        """(rows, D) Eq. 2 scores of this phase for `layer`, rows that left first."""
        sum_sq, count = self.sum_sq[layer], self.count[layer]
        if len(self._left_count[layer]):
            sum_sq = torch.cat([self._left[layer], sum_sq])
            count = torch.cat([self._left_count[layer], count])
        return phase_score(sum_sq, count)

    @property
    def rows(self) -> torch.Tensor:
        """(rows,) rows that contributed at least one token (in `scores` order)."""
        count = self.count[0]
        if len(self._left_count[0]):
            count = torch.cat([self._left_count[0], count])
        return count > 0

    def slot_scores(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, D) Eq. 2 scores per slot now, and (B,) which slots observed a token in this
        phase. Rows set aside (compacted away, or whose slot a new row took) are not there; an
        emptied slot still holds what its last row gave until a row enters it."""
        count = self.count[layer]
        return phase_score(self.sum_sq[layer], count), count > 0

    def follow(self, event: RowEvent) -> None:
        """Compaction gathers the slots that go on; a refill empties the slots it takes. Either
        way the rows that left are set aside: they count in `scores`, never change."""
        if isinstance(event, RowsGathered):
            self.batch_size = len(event.index)
        if not self.observed or not isinstance(event, (RowsGathered, RowsEntered)):
            return
        device = self.count[0].device
        if isinstance(event, RowsGathered):
            index = event.index.to(device)
            gone = torch.ones_like(self.count[0], dtype=torch.bool)
            gone[index] = False
            self._set_aside(gone)
            self.sum_sq = [s[index] for s in self.sum_sq]
            self.count = [c[index] for c in self.count]
        else:
            slots = event.slots.to(device)
            taken = torch.zeros_like(self.count[0], dtype=torch.bool)
            taken[slots] = True
            self._set_aside(taken)
            self.sum_sq = [s.index_fill(0, slots, 0.0) for s in self.sum_sq]
            self.count = [c.index_fill(0, slots, 0.0) for c in self.count]

    def _set_aside(self, rows: torch.Tensor) -> None:
        """Keep the statistics of `rows` (B,) bool apart."""
        if not bool(rows.any()):
            return
        for layer, (s, c) in enumerate(zip(self.sum_sq, self.count)):
            left, left_count = self._left[layer], self._left_count[layer]
            self._left[layer] = torch.cat([left, s[rows]]) if len(left) else s[rows]
            self._left_count[layer] = (
                torch.cat([left_count, c[rows]]) if len(left_count) else c[rows]
            )


class NeuronSetMethod(PruningMethod):
    """Base for methods whose effect is "layer l computes only the neurons in kept[l]"."""

    batch_coupled = True
    sealed: ClassVar[dict[str, str]] = {
        "begin_step": "before_forward",
        "end_step": "before_forward",
        "follow_rows": "start",
        "observe": "prompts_entered",
        "capturable": "before_forward",
    }

    # -- what a method author overrides (besides `prepare` and `start`) -------------------------
    def before_forward(self, ctx: StepContext) -> None:
        """Before every decode step: schedule, `set_kept`, `open_phase` / `close_phase`."""

    def prompts_entered(self, slots: torch.Tensor, scores: PhaseScores) -> None:
        """Rows entered `slots` (all of them when a generation starts) and their prompts ran,
        dense; `scores` holds those prompts' statistics (rows: every slot, only `slots` count).
        The kept sets are back as they were before the prompts ran."""

    # -- tools for the policy -------------------------------------------------------------------
    @property
    def kept(self) -> list[torch.Tensor | None]:
        """Per layer, the neuron index the next forward computes; None: that layer runs dense."""
        if "_kept" not in self.__dict__:
            self._kept: list[torch.Tensor | None] = [None] * len(self.shape.d_ff)
        return self._kept

    @property
    def phase(self) -> PhaseScores | None:
        """The scoring phase open now (None: the forwards are not observed)."""
        return self.__dict__.get("_phase")

    def open_phase(self) -> None:
        """From the next forward on, observe the tokens that count into a fresh phase."""
        self._phase = PhaseScores(len(self.shape.d_ff), len(self.slots.occupied))

    def close_phase(self) -> PhaseScores | None:
        """End the open phase (if any) and hand back its statistics."""
        phase, self._phase = self.phase, None
        return phase

    def set_kept(self, indices: list[torch.Tensor] | None) -> None:
        """Keep `indices[l]` in layer l from the next forward on; None: every layer dense."""
        kept = self.kept
        if indices is None:
            kept[:] = [None] * len(kept)
            self._ffn_sparsity = None
            return
        kept[:] = [None if i.numel() == d else i for i, d in zip(indices, self.shape.d_ff)]
        if all(i is None for i in kept):  # all kept: the exact dense path
            self._ffn_sparsity = None
            return
        device = indices[0].device
        size = torch.tensor([d if i is None else i.numel() for i, d in zip(kept, self.shape.d_ff)],
                            dtype=torch.float64, device=device)  # fmt: skip
        d_ff = torch.tensor(self.shape.d_ff, dtype=torch.float64, device=device)
        self._ffn_sparsity = 1.0 - size / d_ff

    @property
    def pruning(self) -> bool:
        """True while a kept set is in force (the next forward is sparse)."""
        return self.__dict__.get("_ffn_sparsity") is not None

    # -- plumbing ---------------------------------------------------------------------------------
    def follow_rows(self, event: RowEvent) -> None:
        """A generation starts dense, with no phase open; an open phase follows the rows."""
        if isinstance(event, RowsStart):
            self.set_kept(None)
            self.close_phase()
        elif self.phase is not None:
            self.phase.follow(event)

    def observe(self, layer: int, z: torch.Tensor, tokens: Tokens) -> None:
        """A host hands in layer `layer`'s (N, D) FF activations of a forward's tokens."""
        if self.phase is not None:
            self.phase.add(layer, z, tokens)

    def begin_step(self, ctx: StepContext) -> None:
        """Template: the policy picks this forward's kept set, then it is snapshotted. The
        prompts of entering rows run dense, observed apart from the open phase."""
        if ctx.entering is None:
            self.before_forward(ctx)
        else:
            self._outside = (list(self.kept), self.__dict__.get("_ffn_sparsity"), self.phase)
            self.set_kept(None)
            self.open_phase()
        self._ran_at = self.__dict__.get("_ffn_sparsity")  # what this forward computes

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        """Template: the kept sets this forward ran with. After entering prompts the kept sets
        and phase in force before them come back, then `prompts_entered`."""
        ran = None if self._ran_at is None else StepSparsity(self._ran_at)
        if ctx.entering is not None:
            entered = self.close_phase()
            (kept, sparsity, phase), self._outside = self._outside, None
            self.kept[:] = kept
            self._ffn_sparsity, self._phase = sparsity, phase
            self.prompts_entered(ctx.entering, entered)
        return ran

    def capturable(self) -> bool:
        """A forward that observes Z accumulates scores; the others only compute."""
        return self.phase is None
