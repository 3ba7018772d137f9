"""What every host does for every method: the family glue, written once for all engines.

A method decides from flat tokens (`bwprune.methods.base.Tokens`); an engine computes hidden
states in its own layout (the HF loop: left-padded `(B, T, D)`; vLLM: the flat tokens of its
scheduled requests, in its batch order). `Host` is the glue that does not depend on the engine:
hand the tokens that count to the method, turn kept neuron sets into real smaller matmuls, zero
what a keep mask drops. A subclass names the engine's side only — where the FFNs and the
thresholded hidden states are (`ffns`, `site`), how a forward's tensors map onto the method's
flat tokens (`tokens`, `flat`, `unflat`). Hosts: `bwprune.methods.hf_host` and
`bwprune.vllm.host`. Every change goes through a `HookSet`, so detaching restores the model.
A family's glue is chosen by its base class; no method is named here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bwprune.methods.base import Phase, PruningMethod, StepContext, Tokens
from bwprune.methods.hooks import HookSet
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.thresholds import ThresholdMethod


def _same(value: Any) -> Any:
    return value


def _replace(value: Any, x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass(frozen=True)
class Site:
    """Where a thresholded hidden state (`bwprune.methods.thresholds.SITES`) is in an engine's
    layer: a module's first input or its output, read through `act` when given (act(0) = 0, so
    a zeroed pre-activation drops its neuron). `part` picks the hidden state out of the input or
    output (an engine's module may return a tuple, or fuse two projections into one tensor) and
    `with_part` puts the masked one back."""

    module: nn.Module
    where: str  # "input" | "output"
    act: Callable[[torch.Tensor], torch.Tensor] | None = None
    part: Callable[[Any], torch.Tensor] = _same
    with_part: Callable[[Any, torch.Tensor], Any] = _replace


@dataclass(frozen=True)
class FFNSlot:
    """One layer's FFN as a host swaps it: `parent.<name>` is the MLP; `down` is the module whose
    input is the FF activation Z; `sliced` computes a kept set (`set_index`, None: dense, through
    the original modules, so the observer on `down` still fires)."""

    parent: nn.Module
    name: str
    down: nn.Module
    sliced: nn.Module


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


def decides_per_forward(method: PruningMethod) -> bool:
    """Whether a method acts inside forwards, deciding at run time (a threshold method at ρ = 0
    thresholds nothing: exactly dense, nothing installed); the others are a fixed model."""
    return isinstance(method, NeuronSetMethod) or (
        isinstance(method, ThresholdMethod) and method.active
    )


class Host:
    """One method's glue on one engine's model; lives as long as the driver that owns it."""

    def __init__(self, method: PruningMethod) -> None:
        self.method = method
        self.sliced: list[nn.Module] = []  # kept across attaches: their gathered weights too
        self._applied: list[torch.Tensor | None] = []
        self._glued = False  # is glue on the model (else a forward needs no tokens)
        self._every: dict[tuple, torch.Tensor] = {}  # (B, device) -> arange(B)

    # -- the engine's side (a subclass) ---------------------------------------------------------
    def ffns(self, model: nn.Module, adapter: Any) -> list[FFNSlot]:
        """Every layer's FFN, with its sliced module (reuse `self.sliced` when it still fits)."""
        raise NotImplementedError

    def site(self, model: nn.Module, adapter: Any, layer: int, name: str) -> Site:
        raise NotImplementedError

    def num_layers(self, model: nn.Module, adapter: Any) -> int:
        raise NotImplementedError

    def tokens(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> Tokens:
        """The method's view of the forward about to run (see `bwprune.engine.protocol`)."""
        raise NotImplementedError

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """A hidden state of this forward -> (N, D) in `tokens` order."""
        raise NotImplementedError

    def unflat(self, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """(N, D) keep in `tokens` order -> a mask shaped like `like` (unseen tokens: kept)."""
        raise NotImplementedError

    def padded_tokens(
        self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None
    ) -> Tokens:
        """`flat_tokens` of a (B, T) `valid`, its decode rows allocated once per batch size."""
        key = (valid.shape[0], valid.device)
        if key not in self._every:
            self._every[key] = torch.arange(valid.shape[0], device=valid.device)
        return flat_tokens(ctx, valid, slots, self._every[key])

    # -- the glue -------------------------------------------------------------------------------
    def attach(self, model: nn.Module, adapter: Any) -> HookSet:
        """Install the family's glue; everything is undone when the returned set exits."""
        hooks = HookSet()
        if not self.glued:
            return hooks  # nothing to glue: forwards need no tokens
        if isinstance(self.method, NeuronSetMethod):
            self._attach_neuron_set(hooks, model, adapter)
        else:
            self._attach_thresholds(hooks, model, adapter)
        self._glued = True
        hooks.on_close(lambda: setattr(self, "_glued", False))
        return hooks

    @property
    def glued(self) -> bool:
        return decides_per_forward(self.method)

    def begin(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> None:
        """Before a forward (after the method's `begin_step`): its tokens, and the kept sets the
        method chose put into the MLPs. `slots`: the slot of each row the forward runs."""
        if not self._glued:
            return
        self._tokens = self.tokens(ctx, valid, slots)
        if self.sliced:
            for i, (s, index) in enumerate(zip(self.sliced, self.method.kept)):
                if index is not self._applied[i]:
                    s.set_index(index)
                    self._applied[i] = index

    def _attach_neuron_set(self, hooks: HookSet, model: nn.Module, adapter: Any) -> None:
        ffns = self.ffns(model, adapter)
        self.sliced = [f.sliced for f in ffns]
        self._applied = [None] * len(self.sliced)
        for layer, f in enumerate(ffns):
            f.sliced.set_index(None)
            hooks.swap(f.parent, f.name, f.sliced)
            hooks.forward_pre(f.down, self._observer(layer))

    def _observer(self, layer: int) -> Callable[[nn.Module, tuple], None]:
        """Pre-hook on the down projection: Z of the forward's tokens, while the method observes."""
        method = self.method

        def read_z(module: nn.Module, args: tuple) -> None:
            if method.phase is not None:
                method.observe(layer, self.flat(args[0]), self._tokens)

        return read_z

    def _attach_thresholds(self, hooks: HookSet, model: nn.Module, adapter: Any) -> None:
        """Each site the method names, found in every layer: a pre-hook where the hidden state
        is a module's input, a forward hook where it is a module's output."""
        for i in range(self.num_layers(model, adapter)):
            for s, name in enumerate(self.method.sites):
                where = self.site(model, adapter, i, name)
                mask = self._masker(i, s, where)
                if where.where == "input":
                    hooks.forward_pre(where.module, lambda m, a, mask=mask: (mask(a[0]), *a[1:]))
                else:
                    hooks.forward(where.module, lambda m, args, out, mask=mask: mask(out))

    def _masker(self, layer: int, site: int, where: Site) -> Callable[[Any], Any]:
        """value -> value with the entries the method drops zeroed in its hidden state."""
        method = self.method

        def mask(value: Any) -> Any:
            x = where.part(value)
            magnitude = (x if where.act is None else where.act(x)).abs()
            keep = method.keep(layer, site, self.flat(magnitude), self._tokens)
            return where.with_part(value, x.masked_fill(~self.unflat(keep, x), 0))

        return mask
