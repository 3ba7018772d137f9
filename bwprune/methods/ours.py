"""`ours`: Batch-wise Adaptive Pruning (paper A, arXiv 2608.14003, COLM 2026).

Periodic top-k over batch-aggregated neuron importance with an activation memory, applied as a
structured, batch-shared FFN mask (real smaller matmuls via `SlicedMLP`). Schedule per batch
(docs/paper-notes.md#schedule): dense prefill scores the prompt (s̄₀); `t_init` dense decode steps
give s̄₁ and the first mask; then `t_prune` sparse steps alternate with `t_explore` dense
exploration steps, and memory and mask are refreshed at the end of each exploration window.
Attention and prefill are never pruned; ρ = 0 or `t_prune = 0` is exactly dense. The score math (Eq.
2–4) is in `neuron_scores.py`, the family's plumbing (phases, per-slot statistics, entering prompts)
in `neuron_set.py`; this file is the policy alone.

`select: threshold` is the paper's key ablation: keep the neurons whose memory exceeds a per-layer
threshold calibrated offline on *unaggregated* per-sample scores, so the kept count drifts with the
batch (a max over more rows keeps more neurons) while top-k stays at ρ. The kept count also moves
without any batch, as the threshold meets the running-max memory (which only grows) and phases of
other lengths than its `t_explore`-token calibration windows (prompt, `t_init`): the batch effect
is threshold at batch B against threshold at batch 1.

Streams (continuous batching) are one generation, so the paper's memory never resets in them:
`memory_policy` (max | reset | decay | window | request) says how each phase's scores enter the
memory (in static batches too), and `on_enter` (prompt | explore) what the prompts of entering rows
do. `request` moves Eq. 3 after the memory: each row keeps its own, and the batch memory is their
aggregate over the rows now in the batch, so a row that leaves takes its neurons with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError, check_sparsity, choices_error
from bwprune.methods.base import StepContext
from bwprune.methods.calibrated import LayerStream, calibration_artifact
from bwprune.methods.hooks import HookSet
from bwprune.methods.neuron_scores import (
    AGGREGATES,
    K_RULES,
    aggregate,
    kept_count,
    phase_score,
    topk_index,
    unit_sq,
)
from bwprune.methods.neuron_set import NeuronSetMethod, PhaseScores
from bwprune.models.adapters import ModelAdapter

SELECTS = ("topk", "threshold")
MEMORY_POLICIES = ("max", "reset", "decay", "window", "request")
ON_ENTER = ("prompt", "defer", "explore")


class Ours(NeuronSetMethod):
    """Batch-wise adaptive pruning; every ablation switch is a constructor argument.

    How a phase's batch score s̄ enters the memory m (`memory: false` overrides: m ← s̄):
    `max` (paper) m ← max(m, s̄); `decay` m ← max(γ·m, s̄), γ = `memory_decay`; `window` m is the
    max of the last `memory_window` phases' s̄; `reset` is `max`, but m is cleared (the next s̄
    becomes m) once every row that was in the batch at the last clearing has left (never within
    a static batch). `request`: each row i keeps its own m_i ← max(m_i, s_i) (m_i ← s_i under
    `memory: false`) from its own Eq. 2 score, for the rows that observed the phase; the mask
    selects from m = Eq. 3 over the rows in the batch at the refresh (occupied, not finished), so
    in a static batch with no row finished, with `aggregate: max`, it is `max` (max over rows and
    phases commute). What entering rows' prompts do (`on_enter`): `prompt` absorbs their score
    into m at once, refreshing the mask if one is in force; `explore` restarts the paper's
    batch-start schedule: prompt phase, `t_init` dense observing steps, first mask, periods.
    `defer` absorbs them as `prompt` does but leaves the mask in force until the next scheduled
    refresh: under a server's arrivals a refresh per request is a refresh per few steps.
    """

    def __init__(
        self,
        sparsity: float,
        t_init: int,
        t_explore: int,
        t_prune: int,
        aggregate: str,
        memory: bool,
        k_rule: str,
        select: str,
        calibration: Mapping | None,
        cache_dir: str | None,
        memory_policy: str,
        memory_decay: float,
        memory_window: int,
        on_enter: str,
    ) -> None:
        check_sparsity(sparsity)
        for name, value in (("t_init", t_init), ("t_explore", t_explore), ("t_prune", t_prune)):
            if value < 0:
                raise UserError(f"{name}={value} must be >= 0")
        if aggregate not in AGGREGATES:
            raise choices_error("aggregate", aggregate, AGGREGATES)
        if k_rule not in K_RULES:
            raise choices_error("k_rule", k_rule, K_RULES)
        if select not in SELECTS:
            raise choices_error("select", select, SELECTS)
        if select == "threshold" and not calibration:
            raise UserError("select='threshold' needs a calibration config (calibration: ...)")
        if memory_policy not in MEMORY_POLICIES:
            raise choices_error("memory_policy", memory_policy, MEMORY_POLICIES)
        if not 0.0 < memory_decay <= 1.0:
            raise UserError(f"memory_decay={memory_decay} is outside (0, 1]")
        if memory_window < 1:
            raise UserError(f"memory_window={memory_window} must be >= 1")
        if on_enter not in ON_ENTER:
            raise choices_error("on_enter", on_enter, ON_ENTER)
        self.sparsity = sparsity
        self.t_init, self.t_explore, self.t_prune = t_init, t_explore, t_prune
        self.aggregate, self.memory_on, self.k_rule, self.select = aggregate, memory, k_rule, select
        self.calibration, self.cache_dir = calibration, cache_dir
        self.memory_policy, self.memory_decay = memory_policy, memory_decay
        self.memory_window, self.on_enter = memory_window, on_enter
        self.k: list[int] = []  # kept neurons per layer (top-k)
        self.thresholds: torch.Tensor | None = None  # (L,) for select=threshold
        self.memory: list[torch.Tensor | None] = []  # (D,) per layer (request: of the last mask)
        self._recent: list[deque] = []  # memory_policy=window: the last s̄ per layer
        self._cleared_after = 0  # memory_policy=reset: rows that arrived up to the last clearing
        self._origin: int | None = 0  # decode step where the schedule began; None: the next

    @property
    def active(self) -> bool:
        return self.sparsity > 0 and self.t_prune > 0

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.k = [kept_count(d, self.sparsity, self.k_rule) for d in self.shape.d_ff]
        if self.select == "threshold" and self.active:
            self.thresholds = self._calibrate_thresholds(model, adapter, tokenizer)

    def start(self, batch_size: int) -> None:
        """A batch is one generation: fresh memory (the paper never decays or resets it:
        docs/paper-notes.md#memory)."""
        self.memory = [None] * len(self.shape.d_ff)
        self._recent = [deque(maxlen=self.memory_window) for _ in self.shape.d_ff]
        self._cleared_after = 0
        self._origin = 0
        if self.memory_policy == "request":  # per slot: follow compaction, zeroed on entry
            device = self.slots.occupied.device
            self.slot_state["memory"] = [torch.zeros(batch_size, d, device=device)
                                         for d in self.shape.d_ff]  # fmt: skip
            self.slot_state["finished"] = torch.zeros(batch_size, dtype=torch.bool, device=device)

    def before_forward(self, ctx: StepContext) -> None:
        if not self.active:
            return
        if self.memory_policy == "request":  # the rows that stopped no longer count (Eq. 3)
            self.slot_state["finished"] = ctx.finished.to(self.slots.occupied.device)
        if self._origin is None:  # rows entered under on_enter=explore: the schedule restarts
            self._origin = ctx.step
        self._schedule(ctx.step - self._origin)

    def prompts_entered(self, slots: torch.Tensor, scores: PhaseScores) -> None:
        """The prompts of a generation's first rows (phase 0, s̄₀) or of rows entering a stream."""
        if not self.active:
            return
        if self.on_enter == "explore":
            self._absorb_phase()  # the open phase ends here
            self._origin = None  # the next decode step is step 0 of a fresh schedule
        self._absorb(scores)
        if self.on_enter == "prompt" and self.pruning:  # a mask is in force
            self._refresh_mask()

    # -- schedule (docs/paper-notes.md#schedule), decided before each decode step --------------
    def _schedule(self, step: int) -> None:
        """`step` counts decode steps since the schedule began (`start`, or an entry
        under on_enter=explore, whose prompts were absorbed then)."""
        if step == 0:  # the prompts were absorbed when they ran (`prompts_entered`)
            self._absorb_phase()
            if self.t_init > 0:
                self.set_kept(None)  # after an entry a mask may be in force
                self.open_phase()  # initial dense exploration
            else:
                self._refresh_mask()
            return
        if step < self.t_init:
            return
        if step == self.t_init:  # first mask: memory merges the prompt and initial phases
            self._absorb_phase()
            self._refresh_mask()
            return
        into_period = (step - self.t_init) % (self.t_prune + self.t_explore)
        if into_period == self.t_prune:  # exploration window opens: dense, observing
            self.set_kept(None)
            self.open_phase()
        elif into_period == 0 and self.phase is not None:  # exploration window closed
            self._absorb_phase()
            self._refresh_mask()

    def _absorb_phase(self) -> None:
        """The open phase, if any, ends and enters the memory."""
        phase = self.close_phase()
        if phase is not None:
            self._absorb(phase)

    def _absorb(self, phase: PhaseScores) -> None:
        """Eq. 3 + memory: the phase's batch score s̄ enters m per layer under `memory_policy`."""
        if not phase.observed:
            return
        if self.memory_policy == "request":
            self._absorb_rows(phase)
            return
        elders = self.slots.occupied & (self.slots.arrival <= self._cleared_after)
        if self.memory_policy == "reset" and not bool(elders.any()):
            self.memory = [None] * len(self.memory)  # every row of the last clearing has left
            self._cleared_after = self.slots.arrivals
        batch_scores = aggregate(phase.all_scores(), phase.rows, self.aggregate)  # (L, D_max)
        for layer, (prev, d) in enumerate(zip(self.memory, self.shape.d_ff)):
            self.memory[layer] = self._merge(layer, prev, batch_scores[layer, :d])

    def _absorb_rows(self, phase: PhaseScores) -> None:
        """memory_policy=request: each row's own score s_i enters its own m_i (Eq. 3 waits for
        the mask). A row that left mid-phase gives nothing: the phase set it aside, or its slot
        is empty (only occupied slots are written)."""
        memories = self.slot_state["memory"]
        for layer, held in enumerate(memories):
            score, observed = phase.slot_scores(layer)  # (B, D), (B,)
            new = torch.maximum(held, score) if self.memory_on else score
            rows = (observed & self.slots.occupied)[:, None]
            memories[layer] = torch.where(rows, new, held)

    def _merge(self, layer: int, prev: torch.Tensor | None, score: torch.Tensor) -> torch.Tensor:
        """m ← the memory policy of (m, s̄); `memory=false`: m ← s̄ of this phase."""
        if not self.memory_on:
            return score
        if self.memory_policy == "window":
            self._recent[layer].append(score)
            return torch.stack(tuple(self._recent[layer])).amax(dim=0)
        if prev is None:
            return score
        if self.memory_policy == "decay":
            prev = self.memory_decay * prev  # old rows' neurons fade
        return torch.maximum(prev, score)

    def _refresh_mask(self) -> None:
        if self.memory_policy == "request":  # Eq. 3 over the rows in the batch now
            live = self.slots.occupied & ~self.slot_state["finished"]
            self.memory = [aggregate(m, live, self.aggregate) for m in self.slot_state["memory"]]
        self.set_kept([self._select(layer, m) for layer, m in enumerate(self.memory)])

    def _select(self, layer: int, memory: torch.Tensor) -> torch.Tensor:
        if self.select == "topk":
            return self.top(memory, self.k[layer])  # Eq. 4: exactly k per layer
        kept = (memory > self.thresholds[layer]).nonzero().flatten()
        return kept if kept.numel() else topk_index(memory, 1)

    # -- select=threshold calibration ----------------------------------------------------------
    def _calibrate_thresholds(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> torch.Tensor:
        """Per-layer ρ-quantile of unaggregated per-sample Eq. 2 scores on calibration text.

        Each calibration sequence is cut into windows of `t_explore` tokens (the phase length that
        drives every mask refresh; `t_init` when t_explore = 0) and each window scored as one
        sample's phase, so one sample alone keeps ≈ (1 − ρ)·D neurons at runtime.
        """
        window = self.t_explore or self.t_init or 1

        def window_scores(z: torch.Tensor) -> torch.Tensor:
            """(N, T, D) -> every window's (D,) Eq. 2 scores, flattened."""
            t = z.shape[1] // window * window
            z = z[:, :t].reshape(-1, window, z.shape[-1])  # (N·T/w, w, D)
            count = torch.full((z.shape[0],), window, device=z.device)
            return phase_score(unit_sq(z).sum(dim=1), count).flatten()

        def compute(stream: LayerStream) -> dict[str, torch.Tensor]:
            thresholds = []
            for view in adapter.ffns():
                scores: list[torch.Tensor] = []
                with HookSet() as hooks:
                    hooks.forward_pre(view.down, lambda m, args, out=scores: out.append(
                        window_scores(args[0])
                    ))  # fmt: skip
                    stream.advance(view.index)
                thresholds.append(torch.quantile(torch.cat(scores).float().cpu(), self.sparsity))
            return {"thresholds": torch.stack(thresholds)}

        key = {"sparsity": self.sparsity, "window": window}
        return calibration_artifact(
            "ours", model, adapter, tokenizer, self.calibration, self.cache_dir, key, compute
        )["thresholds"]
