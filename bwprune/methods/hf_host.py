"""The HuggingFace host: a transformers model's side of the glue (`bwprune.methods.host`).

An HF forward computes left-padded `(B, T, D)` tensors. This module knows where an HF decoder
layer keeps its FFN and its thresholded hidden states, and how to flatten the tokens that count
(prefill: the valid ones; decode: one per slot, finished rows passed with `counts` False so a
compiled step keeps its shape). Kept sets run as `SlicedMLP`s.

The method reads Z through an observer on each down projection, as a forward runs; a decode step
it observes leaves Z in sinks instead (`bwprune.methods.host.Host.end`).
"""

from __future__ import annotations

import torch
from torch import nn

from bwprune.config import KEPT_WEIGHTS
from bwprune.errors import choices_error
from bwprune.methods.base import Phase, PruningMethod, StepContext, Tokens
from bwprune.methods.host import FFNSlot, Host, Site
from bwprune.models.adapters import ModelAdapter
from bwprune.models.sliced_mlp import SlicedMLP


def site(adapter: ModelAdapter, layer: int, name: str) -> tuple[nn.Module, str, nn.Module | None]:
    """Where hidden state `name` (`bwprune.methods.thresholds.SITES`) of `layer` is in an HF
    model: (module, "input" | "output", the activation it is read through, if any)."""
    attn, ffn = adapter.attn(layer), adapter.ffn(layer)
    return {
        "attn_in": (attn.norm, "output", None),
        "attn_out": (attn.o, "input", None),
        "mlp_in": (ffn.norm, "output", None),
        "mlp_mid": (ffn.down, "input", None),
        "gate_act": (ffn.gate, "output", ffn.act),
    }[name]


class HFHost(Host):
    """The glue on a transformers model (through its `ModelAdapter`)."""

    def __init__(self, method: PruningMethod, kept_weights: str = "buffers") -> None:
        """`kept_weights`: where a kept set's weights live (`KEPT_WEIGHTS`)."""
        if kept_weights not in KEPT_WEIGHTS:
            raise choices_error("generation.kept_weights", kept_weights, KEPT_WEIGHTS)
        super().__init__(method)
        self.in_place = kept_weights == "in_place"

    def ffns(self, model: nn.Module, adapter: ModelAdapter) -> list[FFNSlot]:
        views = adapter.ffns()
        if [s.mlp for s in self.sliced] != [v.mlp for v in views]:
            self.sliced = [SlicedMLP(v.mlp, self.in_place) for v in views]
        # the MLP's own down projection: kept in place, it is one of ours (`ReorderedFFN`)
        return [FFNSlot(v.layer, "mlp", s.down_proj, s) for v, s in zip(views, self.sliced)]

    def site(self, model: nn.Module, adapter: ModelAdapter, layer: int, name: str) -> Site:
        module, where, act = site(adapter, layer, name)
        return Site(module, where, act)

    def num_layers(self, model: nn.Module, adapter: ModelAdapter) -> int:
        return len(adapter.layers)

    def tokens(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> Tokens:
        self._valid, self._phase = valid, ctx.phase
        return self.padded_tokens(ctx, valid, slots)

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """(..., B, T, D) -> (..., N, D) in token order (a prefill's: (B, T, D) alone)."""
        return x[..., -1, :] if self._phase is Phase.DECODE else x[self._valid]

    def unflat(self, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if self._phase is Phase.DECODE:
            return keep[:, None]
        full = torch.ones(like.shape, dtype=torch.bool, device=like.device)
        full[self._valid] = keep
        return full

    def sink_shape(self, valid: torch.Tensor) -> tuple[int, ...]:
        return (valid.shape[0], 1)
