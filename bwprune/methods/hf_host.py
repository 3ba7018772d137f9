"""The HuggingFace host: glue between a transformers model and a method's host-free decisions.

A method decides from flat tokens (`bwprune.methods.base.Tokens`); an HF forward computes
left-padded `(B, T, D)` tensors. This module is the only place that knows both: it flattens the
tokens that count (prefill: the valid ones; decode: one per slot, finished rows passed with
`counts` False so a compiled step keeps its shape), hands them to the method, and applies what
the method returns — kept neuron sets as real smaller matmuls (`SlicedMLP`), keep masks as zeros
in the hidden states the method names. Every change goes through a `HookSet`, so detaching
restores the model. A family's glue is chosen by its base class; no method is named here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bwprune.methods.base import Phase, PruningMethod, StepContext, Tokens
from bwprune.methods.hooks import HookSet
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.thresholds import ThresholdMethod
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


def flat_tokens(
    ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None, every: torch.Tensor
) -> Tokens:
    """The tokens of a forward over (B, T) `valid`; row b of the forward is slot `slots[b]`;
    `every` is arange(B) (a decode step's rows, allocated once per batch size)."""
    if ctx.phase is Phase.DECODE:
        return Tokens(every if slots is None else slots, valid[:, -1])
    b, _ = valid.nonzero(as_tuple=True)
    position = valid.cumsum(dim=1)[valid] - 1
    length = valid.sum(dim=1)[b]
    rows = b if slots is None else slots.to(b.device)[b]
    return Tokens(rows, torch.ones_like(b, dtype=torch.bool), position, length)


class HFHost:
    """One method's glue on one model; lives as long as the driver that owns it."""

    def __init__(self, method: PruningMethod) -> None:
        self.method = method
        self.sliced: list[SlicedMLP] = []  # kept across attaches: their gather buffers too
        self._applied: list[torch.Tensor | None] = []
        self._glued = False  # is glue on the model (else a forward needs no tokens)
        self._every: dict[tuple, torch.Tensor] = {}  # (B, device) -> arange(B)

    def attach(self, model: nn.Module, adapter: ModelAdapter) -> HookSet:
        """Install the family's glue; everything is undone when the returned set exits."""
        hooks = HookSet()
        if isinstance(self.method, NeuronSetMethod):
            self._attach_neuron_set(hooks, adapter)
        elif isinstance(self.method, ThresholdMethod) and self.method.active:
            self._attach_thresholds(hooks, adapter)
        else:
            return hooks  # nothing to glue: forwards need no tokens
        self._glued = True
        hooks.on_close(lambda: setattr(self, "_glued", False))
        return hooks

    def begin(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> None:
        """Before a forward (after the method's `begin_step`): its tokens, and the kept sets the
        method chose put into the MLPs. `slots`: the slot of each row the forward runs."""
        if not self._glued:
            return
        self._valid, self._phase = valid, ctx.phase
        key = (valid.shape[0], valid.device)
        if key not in self._every:
            self._every[key] = torch.arange(valid.shape[0], device=valid.device)
        self._tokens = flat_tokens(ctx, valid, slots, self._every[key])
        if self.sliced:
            for i, (s, index) in enumerate(zip(self.sliced, self.method.kept)):
                if index is not self._applied[i]:
                    s.set_index(index)
                    self._applied[i] = index

    # -- neuron sets --------------------------------------------------------------------------
    def _attach_neuron_set(self, hooks: HookSet, adapter: ModelAdapter) -> None:
        views = adapter.ffns()
        if [s.mlp for s in self.sliced] != [v.mlp for v in views]:
            self.sliced = [SlicedMLP(v.mlp) for v in views]
        self._applied = [None] * len(self.sliced)
        for s in self.sliced:
            s.set_index(None)
        for view, sliced in zip(views, self.sliced):
            hooks.swap(view.layer, "mlp", sliced)
            hooks.forward_pre(view.down, self._observer(view.index))

    def _observer(self, layer: int) -> Callable[[nn.Module, tuple], None]:
        """Pre-hook on down_proj: Z of the forward's tokens, while the method observes."""
        method = self.method

        def read_z(module: nn.Module, args: tuple) -> None:
            if method.phase is not None:
                method.observe(layer, self._flat(args[0]), self._tokens)

        return read_z

    # -- thresholds ---------------------------------------------------------------------------
    def _attach_thresholds(self, hooks: HookSet, adapter: ModelAdapter) -> None:
        """Each site the method names, found in every layer: a pre-hook where the hidden state
        is a projection's input, a forward hook where it is a module's output."""
        for i in range(len(adapter.layers)):
            for s, name in enumerate(self.method.sites):
                module, where, act = site(adapter, i, name)
                mask = self._masker(i, s, act)
                if where == "input":
                    hooks.forward_pre(module, lambda m, args, mask=mask: (mask(args[0]),))
                else:
                    hooks.forward(module, lambda m, args, out, mask=mask: mask(out))

    def _masker(self, layer: int, site: int, act: nn.Module | None):
        """x -> x with the entries the method drops zeroed (read through `act` when given:
        act(0) = 0, so a zeroed pre-activation drops its neuron)."""
        method = self.method

        def mask(x: torch.Tensor) -> torch.Tensor:
            magnitude = (x if act is None else act(x)).abs()
            keep = method.keep(layer, site, self._flat(magnitude), self._tokens)
            return x.masked_fill(~self._unflat(keep, x), 0)

        return mask

    # -- (B, T, D) <-> (N, D) -----------------------------------------------------------------
    def _flat(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (N, D) in `self._tokens` order."""
        return x[:, -1] if self._phase is Phase.DECODE else x[self._valid]

    def _unflat(self, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """(N, D) keep -> (B, T, D); tokens the method did not see are kept."""
        if self._phase is Phase.DECODE:
            return keep[:, None]
        full = torch.ones(like.shape, dtype=torch.bool, device=like.device)
        full[self._valid] = keep
        return full
