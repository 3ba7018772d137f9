"""Runtime of activation-threshold methods (TEAL, CATS): keep entries with |x| > t.

Per token (the original methods): every token keeps the entries whose magnitude exceeds the offline
threshold, independently of the other rows. Batch-shared (paper A's batched protocol,
docs/paper-notes.md#baselines-in-batches): at each decode step the magnitudes of the unfinished rows
are aggregated into one vector (`mean`, what the ARR version says the baselines do, or `max`) and
the offline threshold, calibrated on *unaggregated* activations, is applied to it, so the whole
batch shares one mask and the realized sparsity drifts with the batch. Prefill is thresholded per
token in both modes: left padding leaves prompt positions unaligned across rows, and the originals
mask prompts per token. What each mask skips is counted for the ledger, inside the forward, into
per-row tensors that live as long as their batch size, so a decode step is all tensor work and runs
compiled (`bwprune.engine.step`). Host-free: a method names the hidden states it thresholds (`SITES`
below); a host reads each one's magnitudes for the forward's tokens, flat, and applies the mask
`keep` returns. Calibration (histogram -> threshold) is each method's own `prepare`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from bwprune.errors import UserError, check_sparsity, choices_error
from bwprune.methods.base import Phase, PruningMethod, StepContext, StepSparsity, Tokens
from bwprune.methods.neuron_scores import AGGREGATES, aggregate

# The hidden states a threshold method may name, as every host finds them in a decoder layer:
# the input of q/k/v, of o, of gate/up, of down, and act(W_gate x) (whose zeros skip up and down).
SITES = ("attn_in", "attn_out", "mlp_in", "mlp_mid", "gate_act")


@dataclass(frozen=True)
class SiteCost:
    """What one dropped entry of a site skips: a fraction of its layer's FFN weights, and
    parameters (every weight that reads the entry)."""

    ffn: float
    params: float


class ThresholdMethod(PruningMethod):
    """Base of TEAL and CATS: argument checks, the keep rule, and per-step skip accounting.

    A subclass names its `sites` and, in `prepare`, sets `thresholds[layer][site]` and
    `costs[layer][site]` (what a dropped entry skips) — its whole surface.
    `prefill_fraction` is the fraction of each prompt's last tokens thresholded during prefill.
    """

    sites: ClassVar[tuple[str, ...]] = ()
    prefill_fraction: float = 1.0
    sealed: ClassVar[dict[str, str]] = {
        "begin_step": "prepare", "end_step": "prepare", "keep": "prepare",
    }  # fmt: skip

    def __init__(
        self,
        sparsity: float,
        shared_mask: bool,
        aggregate: str,
        calibration: Mapping | None,
        cache_dir: str | None,
    ) -> None:
        check_sparsity(sparsity)
        if aggregate not in AGGREGATES:
            raise choices_error("aggregate", aggregate, AGGREGATES)
        if sparsity > 0 and not calibration:
            raise UserError(f"sparsity={sparsity} needs a calibration config (calibration: ...)")
        self.sparsity, self.shared_mask, self.aggregate = sparsity, shared_mask, aggregate
        self.batch_coupled = shared_mask  # a shared mask couples the rows of a batch
        self.calibration, self.cache_dir = calibration, cache_dir
        self.thresholds: list[list[float]] = []  # [layer][site]
        self.costs: list[list[SiteCost]] = []  # [layer][site]
        self._skipped: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # see _step_accounting

    @property
    def active(self) -> bool:
        """ρ = 0 thresholds nothing: a host installs nothing, exactly dense."""
        return self.sparsity > 0

    def begin_step(self, ctx: StepContext) -> None:
        self._ctx = ctx
        if self.active and ctx.phase is Phase.DECODE:
            self._ffn, self._params = self._step_accounting(ctx.batch_size, ctx.finished.device)

    def _step_accounting(
        self, batch: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed (B, L) FFN fractions and (B,) parameters that this decode step's masks add into.

        One pair per (batch size, model depth, device) for the method's life (attach after
        attach), zeroed in place every step and marked as static addresses: a CUDA graph replays
        in-place writes only into tensors whose address never changes (torch skips capturing a
        graph that writes elsewhere, and re-records one whose static input moved), and the ledger
        reads them before the next step starts.
        """
        layers = len(self.shape.d_ff)
        key = (batch, layers, device)
        buffers = self._skipped.get(key)
        if buffers is None:
            buffers = (
                torch.zeros(batch, layers, dtype=torch.float64, device=device),
                torch.zeros(batch, dtype=torch.float64, device=device),
            )
            for b in buffers:
                torch._dynamo.mark_static_address(b, guard=False)
            self._skipped[key] = buffers
        else:
            for b in buffers:
                b.zero_()
        return buffers

    def keep(self, layer: int, site: int, magnitude: torch.Tensor, tokens: Tokens) -> torch.Tensor:
        """(N, D) magnitudes of site `sites[site]` -> (N, D) bool mask of the entries computed.

        Prefill: each token alone, and only each prompt's last ⌊f·n⌋ tokens. Decode: per token,
        or one mask for the batch from the counting tokens' aggregate; each dropped entry adds
        its site's cost to the token's row.
        """
        threshold = self.thresholds[layer][site]
        keep = (self.scores(magnitude, tokens) > threshold).expand_as(magnitude)
        if self._ctx.phase is Phase.PREFILL:
            limit = (tokens.length * self.prefill_fraction + 1e-9).floor()
            thresholded = tokens.length - tokens.position <= limit  # (N,): last ⌊f·n⌋ tokens
            return keep | ~thresholded[:, None]
        dropped = (~keep).sum(dim=-1, dtype=torch.float64)  # (N,)
        cost = self.costs[layer][site]
        self._ffn[:, layer].index_add_(0, tokens.rows, dropped * cost.ffn)
        self._params.index_add_(0, tokens.rows, dropped * cost.params)
        return keep

    def scores(self, magnitude: torch.Tensor, tokens: Tokens) -> torch.Tensor:
        """What `keep` compares with the threshold: the (N, D) magnitudes, or during a decode
        step with a shared mask the (1, D) aggregate of the counting rows (one mask for the
        batch). Public so a comparison of two engines can see each decision's margin."""
        if self.shared_mask and self._ctx.phase is Phase.DECODE:
            return aggregate(magnitude, tokens.counts, self.aggregate)[None]
        return magnitude

    def end_step(self, ctx: StepContext) -> StepSparsity | None:
        if ctx.phase is Phase.PREFILL or not self.active:
            return None
        return StepSparsity(self._ffn, self._params)
