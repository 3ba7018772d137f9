"""Kept neurons in fixed slots: a new kept set moves only the neurons that changed.

A structured method's FFN runs over buffers that hold its kept neurons (gate and up rows, down
columns), one neuron per *slot*. Consecutive kept sets mostly agree (docs/engine.md measures by
how much), and the FFN's output does not depend on the order of its neurons, so a refresh need
not re-gather the whole set: each neuron that entered is written into the slot of one that left,
and every other slot stays as it is (LLM in a Flash's DRAM buffer, paper §3.3). `KeptSlots` is
that bookkeeping alone — which neuron each slot holds — so every host and every weight layout
(plain rows here, a kernel's packed panels in `bwprune.vllm.binding.packed`) moves the same neurons.

Capacity is the kept count rounded up to `align` (a kernel's panel width); a slot that holds no
neuron holds zero weights and adds exactly nothing. A kept count of another capacity (a
threshold method's, which moves with the batch) refills every slot, unless the slots only
`grow`: then a set that fits keeps them, and only a larger one refills (a tensor-parallel rank's
share of a global kept set moves with every refresh: `bwprune.vllm.binding.host`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EMPTY = -1  # the neuron of a slot that holds none (its weights are zero)


@dataclass(frozen=True)
class SlotWrites:
    """What a host writes: slot `slots[i]` now holds neuron `neurons[i]` (`EMPTY`: zeros)."""

    slots: torch.Tensor  # (W,) long
    neurons: torch.Tensor  # (W,) long
    entered: int  # neurons that were not kept before (all of them on a refill)
    refill: bool  # every slot, in slot order (`slots` is arange): a new capacity, or a first set

    def __len__(self) -> int:
        return int(self.slots.numel())

    def gather(self, *sources: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The written neurons' rows of each source, source after source (gate, up: a (2W, H)
        block of gate rows then up rows), zeros for `EMPTY` (every layout keeps a neuron's
        weights as a row of its source: a column is H strided reads). `out`: a contiguous
        tensor of the result's shape to gather into (a refill's buffer: one pass over the
        weights instead of a gather and a copy)."""
        full = self.entered == len(self)  # no slot is emptied: every neuron is a real one
        neurons = self.neurons if full else self.neurons.clamp_min(0)
        if len(sources) == 1:
            picked = torch.index_select(sources[0], 0, neurons, out=out)
        else:
            n, first = len(neurons), sources[0]
            picked = first.new_empty((len(sources) * n, *first.shape[1:])) if out is None else out
            for j, source in enumerate(sources):
                torch.index_select(source, 0, neurons, out=picked.narrow(0, j * n, n))
        if full:
            return picked
        empty = (self.neurons < 0).repeat(len(sources))
        return picked.masked_fill_(empty.view([-1] + [1] * (picked.dim() - 1)), 0)


def capacity(kept: int, align: int) -> int:
    """Slots for `kept` neurons: rounded up to a multiple of `align`."""
    return -(-kept // align) * align


class KeptSlots:
    """Which neuron each of a fixed number of slots holds, for one FFN of `d_ff` neurons."""

    def __init__(self, d_ff: int, align: int = 1, grow: bool = False) -> None:
        """`grow`: capacity follows the largest kept count seen, never a smaller one."""
        self.d_ff, self.align, self.grow = d_ff, align, grow
        self.slots: torch.Tensor | None = None  # (capacity,) neuron per slot, EMPTY for none
        self._resident: torch.Tensor | None = None  # (d_ff,) bool: held by some slot
        self._held = 0  # slots holding a neuron

    @property
    def capacity(self) -> int:
        return 0 if self.slots is None else int(self.slots.numel())

    def assign(self, index: torch.Tensor) -> SlotWrites:
        """Hold exactly the neurons of `index` (1-D, distinct) from now on; the slots to write.

        Entering neurons take the slots of leaving ones first, then empty slots; a leaving
        neuron whose slot no entering one takes leaves it empty."""
        kept = int(index.numel())
        if self.slots is None or self._capacity(kept) != self.capacity:
            return self._refill(index)
        wanted = torch.zeros(self.d_ff, dtype=torch.bool, device=index.device)
        wanted[index] = True
        if self._held == self.capacity:  # no empty slot (k a multiple of `align`: the usual case)
            leaving = (~wanted[self.slots]).nonzero().flatten()
            targets = leaving
        else:
            held = self.slots >= 0
            leaving = (held & ~wanted[self.slots.clamp_min(0)]).nonzero().flatten()
            targets = torch.cat([leaving, (~held).nonzero().flatten()])
        entering = index[~self._resident[index]]
        slots = targets[: max(len(entering), len(leaving))]
        neurons = entering
        if len(entering) < len(slots):
            neurons = torch.full_like(slots, EMPTY)
            neurons[: len(entering)] = entering
        self._resident[self.slots[leaving]] = False
        self._resident[entering] = True
        self.slots[slots] = neurons
        self._held = kept
        return SlotWrites(slots, neurons, len(entering), refill=False)

    def _capacity(self, kept: int) -> int:
        """Slots for a set of `kept` neurons (at least one slot, so a kernel has a shape)."""
        needed = capacity(max(kept, 1), self.align)
        return max(needed, self.capacity) if self.grow else needed

    def _refill(self, index: torch.Tensor) -> SlotWrites:
        slots = torch.full((self._capacity(int(index.numel())),), EMPTY,
                           dtype=torch.long, device=index.device)  # fmt: skip
        slots[: index.numel()] = index
        self.slots = slots
        self._resident = torch.zeros(self.d_ff, dtype=torch.bool, device=index.device)
        self._resident[index] = True
        self._held = int(index.numel())
        every = torch.arange(len(slots), device=index.device)
        return SlotWrites(every, slots.clone(), int(index.numel()), refill=True)
