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

from collections.abc import Sequence
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
from bwprune.methods.neuron_scores import phase_score, topk_index, unit_sq


class PhaseScores:
    """Running Eq. 2 statistics of one scoring phase: per layer, per slot, per neuron.

    Rows that leave the batch mid-phase (live-row compaction, a stream's refill) keep the
    statistics they gathered while they ran, so the phase's batch score is the same whether they
    leave or stay finished.

    A forward hands in its layers one by one (`add`), but a decode step's activations are tiny:
    updating 30 layers one after another is a few hundred small ops, which on a CPU cost more
    than the arithmetic and made an observing step several ms slower than a dense one. So the
    activations of consecutive layers are held (by reference: a host never writes an activation
    again once it has handed it in) and folded in with one op per statistic, when the forward's
    tokens change, when `HELD` elements are waiting (a prefill's are large), or when the
    statistics are read. Statistics live padded to the widest layer, `(L, B, D_max)`.
    """

    HELD = 1 << 22  # activations held at most before they are folded in (16 MiB in fp32)

    def __init__(self, d_ff: Sequence[int], batch_size: int) -> None:
        self.d_ff = tuple(d_ff)
        self.batch_size = batch_size
        self._sum_sq: torch.Tensor | None = None  # (L, B, D_max) float32
        self._count: torch.Tensor | None = None  # (L, B) tokens seen
        self._left: torch.Tensor | None = None  # (L, R, D_max): rows that left
        self._left_count: torch.Tensor | None = None  # (L, R)
        self._held: list[tuple[int, torch.Tensor]] = []  # (layer, (N, D)) not folded in yet
        self._held_elements = 0
        self._held_tokens: Tokens | None = None
        self._scratch: torch.Tensor | None = None  # where held activations are stacked

    def add(self, layer: int, z: torch.Tensor, tokens: Tokens) -> None:
        """Accumulate layer `layer`'s (N, D) activations of the tokens that count."""
        if tokens is not self._held_tokens:
            self._fold()
            self._held_tokens = tokens
        self._held.append((layer, z))
        self._held_elements += z.numel()
        if self._held_elements >= self.HELD:
            self._fold()

    @torch.inference_mode()
    def add_now(self, runs: Sequence[tuple[int, torch.Tensor]], tokens: Tokens) -> None:
        """Runs of consecutive layers' activations of one forward, `(first layer, (layers, N,
        D))` each, folded in at once, in place: they lie in buffers the next forward writes
        again (`bwprune.methods.host.Host.end`)."""
        self._fold()
        for first, z in runs:
            self._accumulate(first, unit_sq(z, in_place=True), tokens)

    @torch.inference_mode()
    def _fold(self) -> None:
        """The held activations into the statistics: one op per statistic for each run of
        consecutive layers of one width (every layer, in a uniform model's decode step). In
        inference mode wherever it runs: a fold may come after the forward that held them (when
        the statistics are read), and an engine's forwards (vLLM's) make inference tensors, which
        only inference mode may update in place."""
        held, self._held, self._held_elements = self._held, [], 0
        if not held:
            return
        start = 0
        for end in range(1, len(held) + 1):
            last, z = held[end - 1]
            if end < len(held) and held[end][0] == last + 1 and held[end][1].shape == z.shape:
                continue
            if end - start > 1:  # a tensor of our own: the math overwrites it
                run = unit_sq(self._stacked([h for _, h in held[start:end]]), in_place=True)
            else:
                run = unit_sq(z)[None]
            self._accumulate(held[start][0], run, self._held_tokens)
            start = end

    def _accumulate(self, first: int, run: torch.Tensor, tokens: Tokens) -> None:
        """`unit_sq` of layers `first`... (layers, N, D), ours to overwrite, into the
        statistics of the rows the tokens belong to (a token that does not count adds 0)."""
        if self._sum_sq is None:
            self._sum_sq = torch.zeros(len(self.d_ff), self.batch_size, max(self.d_ff),
                                       dtype=torch.float32, device=run.device)  # fmt: skip
            self._count = self._sum_sq.new_zeros(len(self.d_ff), self.batch_size)
        layers, width = run.shape[0], run.shape[-1]
        weight = tokens.counts.to(torch.float32)
        run.mul_(weight[:, None])
        self._sum_sq[first : first + layers, :, :width].index_add_(1, tokens.rows, run)
        self._count[first : first + layers].index_add_(1, tokens.rows,
                                                       weight.expand(layers, -1))  # fmt: skip

    def _stacked(self, held: list[torch.Tensor]) -> torch.Tensor:
        """`held` stacked in float32, in a buffer kept while its shape recurs (a fresh one per
        decode step would cost more than the math on it)."""
        shape = (len(held), *held[0].shape)
        if self._scratch is None or self._scratch.shape != shape:
            self._scratch = held[0].new_empty(shape, dtype=torch.float32)
        return torch.stack([h.float() for h in held], out=self._scratch)

    @property
    def observed(self) -> bool:
        self._fold()
        return self._count is not None

    @property
    def sum_sq(self) -> list[torch.Tensor]:
        """Per layer, (B, D) sums of `unit_sq` over each slot's tokens."""
        self._fold()
        return [s[:, :d] for s, d in zip(self._sum_sq, self.d_ff)]

    @property
    def count(self) -> torch.Tensor:
        """(L, B) tokens each slot gave each layer."""
        self._fold()
        return self._count

    def scores(self, layer: int) -> torch.Tensor:
        """(rows, D) Eq. 2 scores of this phase for `layer`, rows that left first."""
        return self.all_scores()[layer, :, : self.d_ff[layer]]

    def all_scores(self) -> torch.Tensor:
        """(L, rows, D_max) Eq. 2 scores of this phase, every layer at once (`scores(l)` is
        `[l, :, :D_l]`, beyond it zeros): a handful of ops where layer by layer took 30 times as
        many (SmolLM2 on this CPU: 0.5 against 2.2 ms per phase at batch 4, 1.3 against 3.2 at
        batch 16)."""
        self._fold()
        sum_sq, count = self._sum_sq, self._count
        if self._left is not None:
            sum_sq = torch.cat([self._left, sum_sq], dim=1)
            count = torch.cat([self._left_count, count], dim=1)
        return phase_score(sum_sq, count)

    @property
    def rows(self) -> torch.Tensor:
        """(rows,) rows that contributed at least one token (in `scores` order)."""
        self._fold()
        count = self._count[0]
        if self._left is not None:
            count = torch.cat([self._left_count[0], count])
        return count > 0

    def slot_scores(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, D) Eq. 2 scores per slot now, and (B,) which slots observed a token in this
        phase. Rows set aside (compacted away, or whose slot a new row took) are not there; an
        emptied slot still holds what its last row gave until a row enters it."""
        self._fold()
        count = self._count[layer]
        return phase_score(self._sum_sq[layer, :, : self.d_ff[layer]], count), count > 0

    def follow(self, event: RowEvent) -> None:
        """Compaction gathers the slots that go on; a refill empties the slots it takes. Either
        way the rows that left are set aside: they count in `scores`, never change."""
        observed = self.observed  # held activations are folded into the rows they came from
        if isinstance(event, RowsGathered):
            self.batch_size = len(event.index)
        if not observed or not isinstance(event, (RowsGathered, RowsEntered)):
            return
        device = self._count.device
        if isinstance(event, RowsGathered):
            index = event.index.to(device)
            gone = torch.ones(self._count.shape[1], dtype=torch.bool, device=device)
            gone[index] = False
            self._set_aside(gone)
            self._sum_sq, self._count = self._sum_sq[:, index], self._count[:, index]
        else:
            slots = event.slots.to(device)
            taken = torch.zeros(self._count.shape[1], dtype=torch.bool, device=device)
            taken[slots] = True
            self._set_aside(taken)
            self._sum_sq = self._sum_sq.index_fill(1, slots, 0.0)
            self._count = self._count.index_fill(1, slots, 0.0)

    def _set_aside(self, rows: torch.Tensor) -> None:
        """Keep the statistics of `rows` (B,) bool apart."""
        if not bool(rows.any()):
            return
        sum_sq, count = self._sum_sq[:, rows], self._count[:, rows]
        if self._left is not None:
            sum_sq = torch.cat([self._left, sum_sq], dim=1)
            count = torch.cat([self._left_count, count], dim=1)
        self._left, self._left_count = sum_sq, count


class NeuronSetMethod(PruningMethod):
    """Base for methods whose effect is "layer l computes only the neurons in kept[l]"."""

    batch_coupled = True
    sealed: ClassVar[dict[str, str]] = {
        "begin_step": "before_forward",
        "end_step": "before_forward",
        "follow_rows": "start",
        "observe": "prompts_entered",
        "observe_now": "prompts_entered",
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
    def top(self, scores: torch.Tensor, k: int) -> torch.Tensor:
        """A layer's kept set from its (D,) scores: the k best (Eq. 4), or what a host that
        shards the FFN put in its place as `selection` (`bwprune.methods.sharded.PerRank`)."""
        return self.__dict__.get("selection", topk_index)(scores, k)

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
        self._phase = PhaseScores(self.shape.d_ff, len(self.slots.occupied))

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

    def observe_now(self, runs: Sequence[tuple[int, torch.Tensor]], tokens: Tokens) -> None:
        """A host hands in the FF activations of the forward that just ran, `(first layer,
        (layers, N, D))` per run of consecutive layers, from buffers it writes again
        (`PhaseScores.add_now`)."""
        if self.phase is not None:
            self.phase.add_now(runs, tokens)

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
