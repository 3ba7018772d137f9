"""A host-free harness: drives a method with tokens it builds itself, no hook, no padded batch.

`Recording` listens to one run through the HF host (`bwprune.methods.hf_host`): the lifecycle
events and forwards the driver sends, the raw `(B, T, D)` hidden states the method's family reads
(captured by hooks of its own, before the host touches them), and what the method decided at each
forward (kept sets, keep masks, what it reported skipped). `replay` then drives a second,
identically prepared instance of the method from that record alone: it flattens the tokens that
count row by row, as a serving engine hands them over (one request after another, each request's
tokens in order), and asserts the decisions are the same, forward for forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from bwprune.engine.protocol import MethodDriver
from bwprune.methods.base import Phase, PruningMethod, StepContext, Tokens
from bwprune.methods.hf_host import site
from bwprune.methods.hooks import HookSet
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.methods.thresholds import ThresholdMethod
from bwprune.models.adapters import ModelAdapter


@dataclass
class Forward:
    phase: Phase
    step: int
    finished: torch.Tensor  # (B,)
    entering: torch.Tensor | None
    valid: torch.Tensor  # (B, T) of the rows the forward ran
    slots: torch.Tensor | None  # slot of each row it ran (entering prompts); None: row b = slot b
    events: list = field(default_factory=list)  # lifecycle events sent before it
    hidden: dict = field(default_factory=dict)  # (layer, site) -> (B, T, D) as the method reads it
    kept: list | None = None  # neuron sets: the kept sets it ran with
    keeps: dict = field(default_factory=dict)  # thresholds: (layer, site) -> (N, D) keep mask
    skipped: tuple | None = None  # what `end_step` reported (cloned)


def _clone(sparsity) -> tuple | None:
    if sparsity is None:
        return None
    params = None if sparsity.params is None else sparsity.params.clone()
    return sparsity.ffn.clone(), params


class Recording:
    """Context manager around one HF-hosted run of `driver`'s method: enter it before the run."""

    def __init__(self, driver: MethodDriver, adapter: ModelAdapter) -> None:
        self.driver, self.adapter, self.method = driver, adapter, driver.method
        self.forwards: list[Forward] = []
        self._events: list = []
        self._hooks = HookSet()

    def __enter__(self) -> Recording:
        method, driver = self.method, self.driver
        rows, run, end = method.rows, driver._run, method.end_step

        def on_rows(event):
            self._events.append(event)
            rows(event)

        def on_run(ctx, valid, slots, forward, counted):
            f = Forward(ctx.phase, ctx.step, ctx.finished.clone(), ctx.entering, valid.clone(),
                        slots, self._events)  # fmt: skip
            self._events = []
            self.forwards.append(f)
            return run(ctx, valid, slots, forward, counted)

        def on_end(ctx):
            sparsity = end(ctx)
            self.forwards[-1].skipped = _clone(sparsity)
            return sparsity

        method.rows, driver._run, method.end_step = on_rows, on_run, on_end
        self._undo = lambda: (
            [method.__dict__.pop(n) for n in ("rows", "end_step")] + [driver.__dict__.pop("_run")]
        )
        self._capture()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.close()
        self._undo()

    def _capture(self) -> None:
        """Hooks registered before the host's, so they see each hidden state as computed."""
        method = self.method
        if isinstance(method, NeuronSetMethod):
            sites = ["mlp_mid"]
        elif isinstance(method, ThresholdMethod) and method.active:
            sites = list(method.sites)
        else:
            sites = []
        for layer in range(len(self.adapter.layers)):
            for s, name in enumerate(sites):
                module, where, act = site(self.adapter, layer, name)
                key = (layer, s)
                if where == "input":
                    self._hooks.forward_pre(module, lambda m, a, key=key: self._keep(key, a[0]))
                else:
                    self._hooks.forward(
                        module, lambda m, a, out, key=key, act=act: self._keep(key, out, act)
                    )
        if isinstance(method, NeuronSetMethod):
            begin = self.driver.host.begin

            def on_begin(ctx, valid, slots):
                self.forwards[-1].kept = list(method.kept)
                return begin(ctx, valid, slots)

            self.driver.host.begin = on_begin
            self._hooks._undo.append(lambda: self.driver.host.__dict__.pop("begin"))
        elif sites:
            keep = method.keep

            def on_keep(layer, s, magnitude, tokens):
                out = keep(layer, s, magnitude, tokens)
                self.forwards[-1].keeps[layer, s] = out.clone()
                return out

            method.keep = on_keep
            self._hooks._undo.append(lambda: method.__dict__.pop("keep"))

    def _keep(self, key: tuple, x: torch.Tensor, act=None) -> None:
        """Neuron sets read Z itself; thresholds its magnitude (through `act` where it is read)."""
        if isinstance(self.method, ThresholdMethod):
            x = (x if act is None else act(x)).abs()
        self.forwards[-1].hidden[key] = x.detach().clone()


def row_by_row(f: Forward) -> tuple[list[tuple[int, int]], Tokens]:
    """The tokens of forward `f` as a serving engine lists them: request after request, each
    request's tokens in order; a decode step's finished rows are left out. Returns the (b, t)
    place of each token in the HF batch and the method's `Tokens`."""
    places, rows, position, length = [], [], [], []
    for b in range(f.valid.shape[0]):
        slot = b if f.slots is None else int(f.slots[b])
        if f.phase is Phase.DECODE:
            if not bool(f.finished[b]):
                places.append((b, f.valid.shape[1] - 1))
                rows.append(slot)
            continue
        ts = [t for t in range(f.valid.shape[1]) if bool(f.valid[b, t])]
        for i, t in enumerate(ts):
            places.append((b, t))
            rows.append(slot)
            position.append(i)
            length.append(len(ts))
    rows_t = torch.tensor(rows, dtype=torch.long)
    counts = torch.ones(len(rows), dtype=torch.bool)
    if f.phase is Phase.DECODE:
        return places, Tokens(rows_t, counts)
    return places, Tokens(rows_t, counts, torch.tensor(position), torch.tensor(length))


def replay(method: PruningMethod, recording: Recording) -> int:
    """Drive `method` (prepared as the recorded one was) through `recording` host-free; asserts
    equal decisions at every forward. Returns the number of decisions compared."""
    compared = 0
    for n, f in enumerate(recording.forwards):
        for event in f.events:
            method.rows(event)
        slots = method.slots
        ctx = StepContext(f.phase, f.step, f.finished, slots.occupied, slots.arrival, f.entering)
        method.begin_step(ctx)
        places, tokens = row_by_row(f)
        index = tuple(torch.tensor(p) for p in zip(*places)) if places else None
        if isinstance(method, NeuronSetMethod):
            assert _same_sets(method.kept, f.kept), f"forward {n}: kept sets differ"
            compared += 1
            if method.phase is not None:
                for (layer, _), z in sorted(f.hidden.items()):
                    method.observe(layer, z[index], tokens)
        for (layer, s), mask in sorted(f.keeps.items()):
            keep = method.keep(layer, s, f.hidden[layer, s][index], tokens)
            # The HF host passes a decode step's finished rows (counts False); the harness not.
            host_rows = mask if f.phase is Phase.PREFILL else mask[~f.finished]
            assert torch.equal(keep, host_rows), f"forward {n}: keep mask of {layer, s} differs"
            compared += 1
        skipped = _clone(method.end_step(ctx))
        _same_skipped(skipped, f.skipped, f, n)
    return compared


def _same_sets(a: list, b: list) -> bool:
    return all(x is y or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a, b))  # fmt: skip


def _same_skipped(mine: tuple | None, host: tuple | None, f: Forward, n: int) -> None:
    """What the method reports skipped, for the rows that count (the host's finished rows
    skip nothing the ledger reads)."""
    assert (mine is None) == (host is None), f"forward {n}: one dense, one not"
    if mine is None:
        return
    live = ~f.finished
    for a, b in zip(mine, host):
        if a is None or b is None:
            assert a is b, f"forward {n}"
            continue
        if a.dim() and a.shape[0] == len(live) and f.phase is Phase.DECODE:
            a, b = a[live], b[live]
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=f"forward {n}: skipped differs")
