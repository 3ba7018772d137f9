"""Runtime of activation-threshold methods (TEAL, CATS): keep entries with |x| > t.

Per token (the original methods): every token keeps the entries whose magnitude exceeds the
offline threshold, independently of the other rows. Batch-shared (paper A's batched protocol,
paper-specs A.7): at each decode step the magnitudes of the unfinished rows are aggregated into one
vector (`mean`, what the ARR version says the baselines do, or `max`) and the offline threshold,
calibrated on *unaggregated* activations, is applied to it, so the whole batch shares one mask and
the realized sparsity drifts with the batch. Prefill is thresholded per token in both modes: left
padding leaves prompt positions unaligned across rows, and the originals mask prompts per token.
What each mask skips is counted for the ledger, inside the forward, into per-row tensors that
live as long as their batch size, so a decode step is all tensor work and runs compiled
(`bwprune.engine.step`). Calibration (histogram -> threshold) is each method's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from torch import nn

from bwprune.engine.ledger import StepSparsity
from bwprune.errors import UserError, choices_error
from bwprune.hooks import HookSet
from bwprune.methods.base import Phase, PruningMethod, StepContext
from bwprune.methods.neuron_scores import AGGREGATES, aggregate
from bwprune.models.adapters import ModelAdapter


class ThresholdMethod(PruningMethod):
    """Base of TEAL and CATS: argument checks, the keep rule, and per-step skip accounting.

    Subclasses calibrate in `prepare` and register hooks in `install` that call `keep`.
    `prefill_fraction` is the fraction of each prompt's last tokens thresholded during prefill.
    """

    prefill_fraction: float = 1.0
    sealed: ClassVar[dict[str, str]] = {"begin_step": "install", "end_step": "install"}

    def __init__(
        self,
        sparsity: float,
        shared_mask: bool,
        aggregate: str,
        calibration: Mapping | None,
        cache_dir: str | None,
    ) -> None:
        if not 0.0 <= sparsity < 1.0:
            raise UserError(f"sparsity={sparsity} is outside [0, 1)")
        if aggregate not in AGGREGATES:
            raise choices_error("aggregate", aggregate, AGGREGATES)
        if sparsity > 0 and not calibration:
            raise UserError(f"sparsity={sparsity} needs a calibration config (calibration: ...)")
        self.sparsity, self.shared_mask, self.aggregate = sparsity, shared_mask, aggregate
        self.batch_coupled = shared_mask  # a shared mask couples the rows of a batch
        self.calibration, self.cache_dir = calibration, cache_dir
        self._num_layers = 0
        self._skipped: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # see _step_accounting

    def install(self, hooks: HookSet, adapter: ModelAdapter) -> None:
        """Register the thresholding hooks (called only when sparsity > 0)."""
        raise NotImplementedError

    def attach(self, model: nn.Module, adapter: ModelAdapter) -> HookSet:
        hooks = HookSet()
        self._num_layers = len(adapter.layers)
        if self.sparsity > 0:  # ρ = 0: no hook at all, exactly dense
            self.install(hooks, adapter)
        return hooks

    def begin_step(self, ctx: StepContext) -> None:
        self._ctx = ctx
        if self.sparsity == 0:  # no hooks: nothing to threshold or account
            return
        if ctx.phase is Phase.PREFILL:
            n = ctx.valid.sum(dim=1, keepdim=True)  # (B, 1) prompt lengths
            from_right = ctx.valid.flip(-1).cumsum(-1).flip(-1)  # valid tokens at or after t
            limit = (n * self.prefill_fraction + 1e-9).floor()
            self._thresholded = ctx.valid & (from_right <= limit)  # (B, T): last ⌊f·n⌋ tokens
        else:
            self._ffn, self._params = self._step_accounting(ctx.batch_size, ctx.valid.device)

    def _step_accounting(
        self, batch: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed (B, L) FFN fractions and (B,) parameters that this decode step's hooks add into.

        One pair per (batch size, model depth, device) for the method's life (attach after
        attach), zeroed in place every step and marked as static addresses: a CUDA graph replays
        in-place writes only into tensors whose address never changes (torch skips capturing a
        graph that writes elsewhere, and re-records one whose static input moved), and the ledger
        reads them before the next step starts.
        """
        key = (batch, self._num_layers, device)
        buffers = self._skipped.get(key)
        if buffers is None:
            buffers = (
                torch.zeros(batch, self._num_layers, dtype=torch.float64, device=device),
                torch.zeros(batch, dtype=torch.float64, device=device),
            )
            for b in buffers:
                torch._dynamo.mark_static_address(b, guard=False)
            self._skipped[key] = buffers
        else:
            for b in buffers:
                b.zero_()
        return buffers

    def keep(
        self,
        layer: int,
        magnitude: torch.Tensor,
        threshold: float,
        ffn_per_entry: float,
        params_per_entry: float,
    ) -> torch.Tensor:
        """(B, T, D) magnitudes -> (B, T, D) bool mask of the entries this forward computes.

        On decode steps each dropped entry adds `ffn_per_entry` to layer `layer`'s FFN fraction
        and `params_per_entry` to the parameters skipped, per row.
        """
        ctx = self._ctx
        if ctx.phase is Phase.PREFILL:
            return (magnitude > threshold) | ~self._thresholded[..., None]
        if (
            self.shared_mask
        ):  # one mask for the batch: aggregate the unfinished rows, then threshold
            batch = aggregate(magnitude[:, -1], ctx.valid[:, -1], self.aggregate)  # (D,)
            keep = (batch > threshold).expand_as(magnitude)
        else:
            keep = magnitude > threshold
        dropped = (~keep[:, -1]).sum(dim=-1, dtype=torch.float64)  # (B,)
        self._ffn[:, layer] += dropped * ffn_per_entry
        self._params += dropped * params_per_entry
        return keep

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        if ctx.phase is Phase.PREFILL or self.sparsity == 0:
            return None
        return StepSparsity(self._ffn, self._params)
