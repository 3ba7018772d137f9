"""`ours`: Batch-wise Adaptive Pruning (paper A, arXiv 2608.14003, COLM 2026).

Periodic top-k over batch-aggregated neuron importance with an activation memory, applied as a
structured, batch-shared FFN mask (real smaller matmuls via `SlicedMLP`). Schedule per batch
(paper-specs A.4): dense prefill scores the prompt (s̄₀); `t_init` dense decode steps give s̄₁ and
the first mask; then `t_prune` sparse steps alternate with `t_explore` dense exploration steps, and
memory and mask are refreshed at the end of each exploration window. Attention and prefill are
never pruned; ρ = 0 or `t_prune = 0` is exactly dense. The score math (Eq. 2–4) is in
`neuron_scores.py`, the slicing and activation reading in `neuron_mask.py`.

`select: threshold` is the paper's key ablation: keep the neurons whose memory exceeds a per-layer
threshold calibrated offline on *unaggregated* per-sample scores, so the kept count drifts with the
batch (a max over more rows keeps more neurons) while top-k stays at ρ. The kept count also moves
without any batch, as the threshold meets the running-max memory (which only grows) and phases of
other lengths than its `t_explore`-token calibration windows (prompt, `t_init`): the batch effect
is threshold at batch B against threshold at batch 1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.errors import UserError, choices_error
from bwprune.hooks import HookSet
from bwprune.methods.base import Phase, StepContext
from bwprune.methods.calibrated import LayerStream, calibration_artifact
from bwprune.methods.neuron_mask import NeuronMaskMethod, PhaseScores
from bwprune.methods.neuron_scores import (
    AGGREGATES,
    K_RULES,
    aggregate,
    kept_count,
    normalized_sq,
    phase_score,
    topk_index,
)
from bwprune.models.adapters import ModelAdapter

SELECTS = ("topk", "threshold")


class BWAP(NeuronMaskMethod):
    """Batch-wise adaptive pruning; every ablation switch is a constructor argument."""

    def __init__(
        self,
        sparsity: float,
        t_init: int = 8,
        t_explore: int = 4,
        t_prune: int = 16,
        aggregate: str = "max",
        memory: bool = True,
        k_rule: str = "floor",
        select: str = "topk",
        calibration: Mapping | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= sparsity < 1.0:
            raise UserError(f"sparsity={sparsity} is outside [0, 1)")
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
        self.sparsity = sparsity
        self.t_init, self.t_explore, self.t_prune = t_init, t_explore, t_prune
        self.aggregate, self.memory_on, self.k_rule, self.select = aggregate, memory, k_rule, select
        self.calibration, self.cache_dir = calibration, cache_dir
        self.k: list[int] = []  # kept neurons per layer (top-k)
        self.thresholds: torch.Tensor | None = None  # (L,) for select=threshold
        self.memory: list[torch.Tensor | None] = []  # (D,) per layer

    @property
    def active(self) -> bool:
        return self.sparsity > 0 and self.t_prune > 0

    def prepare(
        self, model: nn.Module, adapter: ModelAdapter, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.k = [kept_count(f.d_ff, self.sparsity, self.k_rule) for f in adapter.ffns()]
        if self.select == "threshold" and self.active:
            self.thresholds = self._calibrate_thresholds(model, adapter, tokenizer)

    def begin_batch(self, batch_size: int) -> None:
        """A batch is one generation: fresh memory (no decay or reset within it, A.4.2)."""
        self.set_kept(None)
        self.memory = [None] * len(self.sliced)
        self.phase = PhaseScores(len(self.sliced)) if self.active else None  # phase 0: prompt

    def before_forward(self, ctx: StepContext) -> None:
        if ctx.phase is Phase.DECODE and self.active:
            self._schedule(ctx.step)

    # -- schedule (paper-specs A.4.1), decided before each decode step -------------------------
    def _schedule(self, step: int) -> None:
        if step == 0:  # prefill was the prompt phase
            self._absorb_phase()
            if self.t_init > 0:
                self.phase = PhaseScores(len(self.sliced))  # initial dense exploration
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
            self.phase = PhaseScores(len(self.sliced))
        elif into_period == 0 and self.phase is not None:  # exploration window closed
            self._absorb_phase()
            self._refresh_mask()

    def _absorb_phase(self) -> None:
        """Eq. 3 + memory: m ← max(m, s̄) per layer (`memory=false`: m ← s̄ of this phase)."""
        phase, self.phase = self.phase, None
        rows = phase.rows
        for layer, prev in enumerate(self.memory):
            batch_score = aggregate(phase.scores(layer), rows, self.aggregate)  # (D,)
            keep = prev is not None and self.memory_on
            self.memory[layer] = torch.maximum(prev, batch_score) if keep else batch_score

    def _refresh_mask(self) -> None:
        self.set_kept([self._select(layer, m) for layer, m in enumerate(self.memory)])

    def _select(self, layer: int, memory: torch.Tensor) -> torch.Tensor:
        if self.select == "topk":
            return topk_index(memory, self.k[layer])  # Eq. 4: exactly k per layer
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
            ones = torch.ones(z.shape[:2], dtype=torch.bool, device=z.device)
            count = torch.full((z.shape[0],), window, device=z.device)
            return phase_score(normalized_sq(z, ones), count).flatten()

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
