"""What every host does for every method: the family glue, written once for all engines.

A method decides from flat tokens (`bwprune.methods.base.Tokens`); an engine computes hidden
states in its own layout (the HF loop: left-padded `(B, T, D)`; vLLM: the flat tokens of its
scheduled requests, in its batch order). `Host` is the glue that does not depend on the engine:
hand the tokens that count to the method, turn kept neuron sets into real smaller matmuls, zero
what a keep mask drops. A subclass names the engine's side only — where the FFNs and the
thresholded hidden states are (`ffns`, `site`), how a forward's tensors map onto the method's
flat tokens (`tokens`, `flat`, `unflat`). Hosts: `bwprune.methods.hf_host` and
`bwprune.vllm.binding.host`. Every change goes through a `HookSet`, so detaching restores the model.
A family's glue is chosen by its base class; no method is named here.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from bwprune.methods import side_by_side
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
    """One layer's FFN as a host swaps it: `parent.<name>` is what the layer runs as its FFN (the
    MLP module, or what an engine's FFN calls); `down` is the module whose input is the FF
    activation Z; `sliced` computes a kept set (`set_index`, None: dense, through the original
    modules, so the observer on `down` still fires)."""

    parent: object
    name: str
    down: nn.Module
    sliced: nn.Module


@dataclass
class PhaseLog:
    """Where a generation's decode time goes, as a host sees it: the kind of every decode
    forward (`dense`: no kept set, observing or not; `sparse`: kept sets in force; `refresh`: a
    sparse forward whose kept sets changed just before it), per refresh its host time and, per
    layer, the fraction of kept neurons that stayed in place (1 − entered / kept), per forward
    whose activations a sharded host gathered, the gathers' time over its layers, and per kept
    set chosen shard by shard (`tp_select: per_rank`), the fraction of the global one it missed.

    Bounded to the last `STEPS` forwards and `REFRESHES` refreshes: a stream is one generation,
    and a server's never ends (nor does anyone read its log)."""

    STEPS: ClassVar[int] = 1 << 17  # longer than any static generation's decode
    REFRESHES: ClassVar[int] = 1 << 13

    kinds: deque[str] = field(default_factory=lambda: deque(maxlen=PhaseLog.STEPS))
    refresh_s: deque[float] = field(default_factory=lambda: deque(maxlen=PhaseLog.REFRESHES))
    overlap: deque[list[float]] = field(  # per refresh, per layer
        default_factory=lambda: deque(maxlen=PhaseLog.REFRESHES)
    )
    gather_s: deque[float] = field(default_factory=lambda: deque(maxlen=PhaseLog.STEPS))
    per_rank_missed: deque[float] = field(  # per layer choice under tp_select=per_rank
        default_factory=lambda: deque(maxlen=PhaseLog.REFRESHES)
    )

    def clear(self) -> None:
        self.kinds.clear()
        self.refresh_s.clear()
        self.overlap.clear()
        self.gather_s.clear()
        self.per_rank_missed.clear()

    def gathered(self, layer: int, seconds: float) -> None:
        """A layer's activations were gathered across shards (layer 0: a new forward)."""
        if layer == 0 or not self.gather_s:
            self.gather_s.append(seconds)
        else:
            self.gather_s[-1] += seconds

    def summary(self, step_s: list[float]) -> dict:
        """Median ms of each kind of step (`step_s`: the same forwards' wall times, in order),
        refreshes and their median host ms (and that of fills, which no layer's kept set came
        before), and the mean overlap of kept sets over refreshes and layers; with shards, the
        median ms of a forward's gathers, and under per-rank selection the mean fraction of the
        global top-k a choice left out."""
        times: dict[str, list[float]] = {}
        for kind, seconds in zip(list(self.kinds)[-len(step_s) :] if step_s else [], step_s):
            times.setdefault(kind, []).append(seconds)
        out = {f"{kind}_step_ms": 1e3 * statistics.median(t) for kind, t in times.items()}
        out["refreshes"] = len(self.refresh_s)
        if self.refresh_s:
            out["refresh_ms"] = 1e3 * statistics.median(self.refresh_s)
            fills = [s for s, stayed in zip(self.refresh_s, self.overlap) if not stayed]
            if fills:  # no layer had a kept set before: every slot filled afresh
                out["fill_ms"] = 1e3 * statistics.median(fills)
            stayed = [o for layers in self.overlap for o in layers]
            if stayed:
                out["overlap"] = statistics.fmean(stayed)
        if self.gather_s:
            out["gather_ms"] = 1e3 * statistics.median(self.gather_s)
        if self.per_rank_missed:
            out["per_rank_missed"] = statistics.fmean(self.per_rank_missed)
        return out


@contextmanager
def one_thread(index: torch.Tensor | None) -> Iterator[int]:
    """One CPU thread inside (when `index` is a CPU tensor); yields the caller's thread count
    there (1 elsewhere): what threads side by side may use. A refresh is small scattered copies,
    which a second thread barely speeds up; and while other processes hold the cores (a server's
    engine and API processes, a second job), OpenMP's barriers make each small parallel op wait
    for a descheduled thread: 30 layers' refresh at 13 % churn took 32 ms on one thread against
    520 ms on two on this 2-core machine under such load (medians of 8, alternated)."""
    if index is None or index.device.type != "cpu" or torch.get_num_threads() == 1:
        yield 1
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield threads
    finally:
        torch.set_num_threads(threads)


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
        self._downs: list[nn.Module] = []  # each layer's down projection, our observer on it
        self._sinks: torch.Tensor | None = None  # (L, rows, ..., D_max), grown, never shrunk
        self._sunk: torch.Tensor | None = None  # the views of `_sinks` this forward writes
        self._runs: list[tuple[int, int, int]] = []  # (first, end, width): layers of one width
        self.log = PhaseLog()

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

    def whole(self, layer: int, z: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s FF activation Z as the method sees it: every neuron of the layer (a
        host whose engine shards the FFN gathers the shards, `PhaseLog.gathered`)."""
        return z

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """A hidden state of this forward -> (N, D) in `tokens` order."""
        raise NotImplementedError

    def unflat(self, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """(N, D) keep in `tokens` order -> a mask shaped like `like` (unseen tokens: kept)."""
        raise NotImplementedError

    def sink_shape(self, valid: torch.Tensor) -> tuple[int, ...]:
        """The shape of a layer's Z in the decode forward over (B, 1) `valid`, less its width."""
        raise NotImplementedError

    def padded_tokens(
        self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None
    ) -> Tokens:
        """`flat_tokens` of a (B, T) `valid`, its decode rows allocated once per batch size."""
        key = (valid.shape[0], valid.device)
        if key not in self._every:
            self._every[key] = torch.arange(valid.shape[0], device=valid.device)
        return flat_tokens(ctx, valid, slots, self._every[key])

    def start(self) -> None:
        """A generation starts: a fresh phase log, and every sliced FFN restarts (its slots fill
        afresh from the generation's first kept set), so the order in which a down projection
        sums its neurons, and so every logit, depends on this generation alone."""
        self.log.clear()
        for s in self.sliced:
            s.restart()
        self._applied = [None] * len(self.sliced)

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
        refreshed = self.sliced and self._refresh()
        if ctx.phase is Phase.DECODE:
            sparse = any(index is not None for index in self._applied)
            self.log.kinds.append("refresh" if refreshed else "sparse" if sparse else "dense")
        if self.sliced:
            self._give_sinks(ctx, valid)

    def end(self, ctx: StepContext) -> None:
        """After a forward (before the method's `end_step`): the Z its sinks hold goes to the
        method, each run of consecutive layers of one width as one tensor."""
        if self._sunk is None:
            return
        runs = [(first, self.flat(self.whole(first, self._sunk[first:end, ..., :width])))
                for first, end, width in self._runs]  # fmt: skip
        self.method.observe_now(runs, self._tokens)

    def _give_sinks(self, ctx: StepContext, valid: torch.Tensor) -> None:
        """A decode step whose Z the method observes, every layer dense (a method observes
        between kept sets), gives each layer a sink (`bwprune.models.sliced_mlp.KeptFFN.forward`):
        a view of one `(L, rows, ..., D_max)` buffer, the same addresses for every step of a shape
        (a compiled step's graph writes them); any other forward, none. Only where our observer
        is the only hook on every down projection: a sink skips the projection's hooks, and
        another's must still fire. Where sinks are not given, the hooks observe."""
        method = self.method
        observed = (ctx.phase is Phase.DECODE and isinstance(method, NeuronSetMethod)
                    and method.phase is not None and not any(i is not None for i in self._applied)
                    and self._hooked_by_us_alone())  # fmt: skip
        if not observed and self._sunk is None:
            return
        self._sunk = self._sink_views(self.sink_shape(valid)) if observed else None
        for layer, sliced in enumerate(self.sliced):
            sliced.sink = None if self._sunk is None else self._sunk[layer, ..., : sliced.d_ff]

    def _widths(self) -> list[tuple[int, int, int]]:
        """(first, end, width) of each run of consecutive layers of one width: what `end` hands
        the method as one tensor each."""
        runs: list[tuple[int, int, int]] = []
        for layer, sliced in enumerate(self.sliced):
            if runs and runs[-1][2] == sliced.d_ff:
                runs[-1] = (runs[-1][0], layer + 1, sliced.d_ff)
            else:
                runs.append((layer, layer + 1, sliced.d_ff))
        return runs

    def _hooked_by_us_alone(self) -> bool:
        """Whether our observer is the only hook a down projection's call would fire."""
        if nn.modules.module._global_forward_pre_hooks or nn.modules.module._global_forward_hooks:
            return False
        return all(len(d._forward_pre_hooks) == 1 and not d._forward_hooks for d in self._downs)

    def _sink_views(self, shape: tuple[int, ...]) -> torch.Tensor:
        """`(L, *shape, D_max)`: the first `shape[0]` rows of the sinks' buffer, which grows to
        the most rows a forward has had (a stream's decode steps have from 1 to every seat)."""
        held, weight = self._sinks, self.sliced[0].weight
        layout = (len(self.sliced), *shape[1:], max(s.d_ff for s in self.sliced))
        fits = (held is not None and (held.shape[0], *held.shape[2:]) == layout
                and held.shape[1] >= shape[0] and held.dtype == weight.dtype
                and held.device == weight.device)  # fmt: skip
        if not fits:
            rows = max(shape[0], held.shape[1] if held is not None else 0)
            self._sinks = weight.new_zeros(layout[0], rows, *layout[1:])
        return self._sinks[:, : shape[0]]

    def _refresh(self) -> bool:
        """Put the kept sets the method chose into the MLPs; whether a kept set changed."""
        start, overlap = time.perf_counter(), []
        changed = [(i, index) for i, index in enumerate(self.method.kept)
                   if index is not self._applied[i]]  # fmt: skip
        if not changed:
            return False
        first = next((index for _, index in changed if index is not None), None)
        # a generation's first kept sets fill every layer afresh: the layers side by side,
        # unless each fill re-lays a whole MLP in place (large copies, as fast on the caller's
        # threads, and each thread would hold a scratch MLP of its own)
        fill = all(self.sliced[i].slots.capacity == 0 for i, _ in changed)
        if fill and any(self.sliced[i].relays for i, _ in changed):
            done = [self.sliced[i].set_index(index) for i, index in changed]
        else:
            with one_thread(first) as threads:
                done = side_by_side.each(lambda c: self.sliced[c[0]].set_index(c[1]), changed,
                                         threads if fill else 1)  # fmt: skip
        for (i, index), writes in zip(changed, done):
            self._applied[i] = index
            if writes is not None and not writes.refill:  # a refill has no predecessor
                overlap.append(1.0 - writes.entered / max(1, self.sliced[i].kept))
        if all(writes is None for writes in done):
            return False
        self.log.refresh_s.append(time.perf_counter() - start)
        self.log.overlap.append(overlap)
        return True

    def _attach_neuron_set(self, hooks: HookSet, model: nn.Module, adapter: Any) -> None:
        ffns = self.ffns(model, adapter)
        self.sliced = [f.sliced for f in ffns]
        self._downs = [f.down for f in ffns]
        self._applied = [None] * len(self.sliced)
        self._sunk, self._runs = None, self._widths()
        for layer, f in enumerate(ffns):
            f.sliced.set_index(None)
            f.sliced.sink = None
            hooks.swap(f.parent, f.name, f.sliced)
            hooks.forward_pre(f.down, self._observer(layer))

    def _observer(self, layer: int) -> Callable[[nn.Module, tuple], None]:
        """Pre-hook on the down projection: Z of the forward's tokens, while the method observes."""
        method = self.method

        def read_z(module: nn.Module, args: tuple) -> None:
            if method.phase is not None:
                method.observe(layer, self.flat(self.whole(layer, args[0])), self._tokens)

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
