"""The HuggingFace host: a transformers model's side of the glue (`bwprune.methods.host`).

An HF forward computes left-padded `(B, T, D)` tensors. This module knows where an HF decoder
layer keeps its FFN and its thresholded hidden states, and how to flatten the tokens that count
(prefill: the valid ones; decode: one per slot, finished rows passed with `counts` False so a
compiled step keeps its shape). Kept sets run as `SlicedMLP`s.

The method reads Z through an observer on each down projection, as a forward runs; a compiled
decode step it observes leaves Z in sinks instead, views of one buffer for every layer, which the
host hands to the method after the forward (`SlicedMLP.sink`).
"""

from __future__ import annotations

import torch
from torch import nn

from bwprune.methods.base import Phase, PruningMethod, StepContext, Tokens
from bwprune.methods.host import FFNSlot, Host, Site
from bwprune.methods.neuron_set import NeuronSetMethod
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

    def __init__(self, method: PruningMethod) -> None:
        super().__init__(method)
        self._buffers: dict[int, torch.Tensor] = {}  # rows -> `_seen` buffer
        self._sunk: torch.Tensor | None = None  # the buffer whose views are the sinks now

    def ffns(self, model: nn.Module, adapter: ModelAdapter) -> list[FFNSlot]:
        views = adapter.ffns()
        if [s.mlp for s in self.sliced] != [v.mlp for v in views]:
            self.sliced = [SlicedMLP(v.mlp) for v in views]
        return [FFNSlot(v.layer, "mlp", v.down, s) for v, s in zip(views, self.sliced)]

    def site(self, model: nn.Module, adapter: ModelAdapter, layer: int, name: str) -> Site:
        module, where, act = site(adapter, layer, name)
        return Site(module, where, act)

    def num_layers(self, model: nn.Module, adapter: ModelAdapter) -> int:
        return len(adapter.layers)

    def tokens(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> Tokens:
        self._valid, self._phase = valid, ctx.phase
        return self.padded_tokens(ctx, valid, slots)

    def begin(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> None:
        """As every host, then: a decode step the method observes gives each dense layer that a
        compiled step may run as a graph of its own (`SlicedMLP.opaque`) a sink, a view of one
        `(L, B, 1, D_max)` buffer per batch size, so a compiled step writes the same addresses
        every time; any other forward, none."""
        super().begin(ctx, valid, slots)
        observed = (self._glued and ctx.phase is Phase.DECODE and self.sliced
                    and self.sliced[0].opaque and isinstance(self.method, NeuronSetMethod)
                    and self.method.phase is not None)  # fmt: skip
        if not observed and self._sunk is None:
            return
        seen = self._seen(valid.shape[0]) if observed else None
        for layer, (sliced, index) in enumerate(zip(self.sliced, self._applied)):
            dense = seen is not None and index is None
            sliced.sink = seen[layer, ..., : sliced.d_ff] if dense else None
        self._sunk = seen

    def end(self, ctx: StepContext) -> None:
        """What the sinks still hold (a compiled forward wrote them; an eager one took them
        back) goes to the method: each dense layer's Z of the tokens that count."""
        if self._sunk is None:
            return
        layers = [(layer, s.sink[:, -1]) for layer, s in enumerate(self.sliced)
                  if s.sink is not None]  # fmt: skip
        self.method.observe_now(layers, self._tokens)

    def _seen(self, rows: int) -> torch.Tensor:
        """The `(L, rows, 1, D_max)` buffer of decode steps over `rows` rows."""
        if rows not in self._buffers:
            weight = self.sliced[0].gate_proj.weight
            width = max(s.d_ff for s in self.sliced)
            self._buffers[rows] = weight.new_zeros(len(self.sliced), rows, 1, width)
        return self._buffers[rows]

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (N, D) in token order."""
        return x[:, -1] if self._phase is Phase.DECODE else x[self._valid]

    def unflat(self, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if self._phase is Phase.DECODE:
            return keep[:, None]
        full = torch.ones(like.shape, dtype=torch.bool, device=like.device)
        full[self._valid] = keep
        return full
