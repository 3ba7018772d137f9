"""One copy of an FFN's weights, its neurons reordered in place so that a kept set is a prefix.

`KeptWeights` (`bwprune.models.sliced_mlp`) gathers a kept set into buffers beside the dense
weights, from a copy of down's columns as rows: at ρ 0.5 that is 0.83 of an MLP more, 1.56x the
1.5B's weights in the HF loop (docs/configuration.md, Memory). Here the FFN's own weights are the
kept set's buffers: the kept neurons lie in the first C rows of gate, up and down's neuron rows,
and a refresh swaps each entering neuron with a leaving one in place (`ReorderedFFN.swap`), the
same slot the buffers would write (`bwprune.models.kept_slots`). A kept forward multiplies those
first rows; a dense forward multiplies all of them as they lie, and the projections put the
neuron axis back in the model's order on the way out of gate and up and into down, so every hook,
sink, site and method sees each neuron where the checkpoint has it.

What it costs (docs/engine.md has the numbers): a dense forward multiplies down from its neuron
rows, a transposed product, and indexes its neuron axis three times (an observing step of the 0.5B
11 % slower at batch 16); a refresh writes both rows of a swap; a first fill reorders the whole
MLP. A kept forward costs what the buffers' does. A dense forward sums the neurons in the order the
last kept sets left, so a generation starts from the checkpoint's order (`reset`) and computes the
same whatever ran before it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bwprune.models.file_pages import FilePages
from bwprune.models.kept_slots import EMPTY, SlotWrites
from bwprune.models.scratch import scratch

_PAGES = FilePages()  # the checkpoint's pages, dropped once a weight is our own copy


class NeuronOrder:
    """Which neuron each row of an FFN's reordered weights holds, and each neuron's row."""

    def __init__(self, d_ff: int, device: torch.device) -> None:
        self.at = torch.arange(d_ff, device=device)  # row -> neuron
        self.row = torch.arange(d_ff, device=device)  # neuron -> row
        self.identity = True  # row i holds neuron i: nothing to index

    def to_neurons(self, y: torch.Tensor) -> torch.Tensor:
        """(..., D_ff) by row -> by neuron."""
        return y if self.identity else y.index_select(-1, self.row)

    def to_rows(self, z: torch.Tensor) -> torch.Tensor:
        """(..., D_ff) by neuron -> by row."""
        return z if self.identity else z.index_select(-1, self.at)


def _owned(weight: torch.Tensor, transposed: bool = False) -> torch.Tensor:
    """A contiguous copy of `weight` (of its transpose) that is ours to reorder; the checkpoint's
    pages it was read from leave the resident set (a later read of the file faults them back)."""
    weight = weight.detach()
    source = weight.mT if transposed else weight
    copy = torch.empty(source.shape, dtype=source.dtype, device=source.device).copy_(source)
    _PAGES.release(weight)
    return copy


class NeuronRows(nn.Linear):
    """Gate or up with its rows (output neurons) in `order`; its output in the model's order."""

    def __init__(self, linear: nn.Linear, order: NeuronOrder) -> None:
        super().__init__(linear.in_features, linear.out_features, linear.bias is not None,
                         device="meta")  # fmt: skip
        self.weight = nn.Parameter(_owned(linear.weight), requires_grad=False)
        if linear.bias is not None:
            self.bias = nn.Parameter(_owned(linear.bias), requires_grad=False)
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.order.to_neurons(F.linear(x, self.weight, self.bias))


class NeuronColumns(nn.Linear):
    """Down with each input neuron's column held as a row, rows in `order`; its input in the
    model's order. `weight` is the (H, D_ff) transpose of the (D_ff, H) rows, so its first C
    columns (a kept set) are C contiguous rows."""

    def __init__(self, linear: nn.Linear, order: NeuronOrder) -> None:
        super().__init__(linear.in_features, linear.out_features, linear.bias is not None,
                         device="meta")  # fmt: skip
        rows = _owned(linear.weight, transposed=True)
        self.weight = nn.Parameter(rows.mT, requires_grad=False)
        if linear.bias is not None:
            self.bias = nn.Parameter(_owned(linear.bias), requires_grad=False)
        self.order = order

    @property
    def rows(self) -> torch.Tensor:
        return self.weight.mT

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(self.order.to_rows(z), self.weight, self.bias)


class ReorderedFFN:
    """A gated MLP's gate, up and down replaced by one reorderable copy (`NeuronRows`,
    `NeuronColumns`); built once per MLP (`of`), whatever hosts come and go."""

    def __init__(self, mlp: nn.Module) -> None:
        self.order = NeuronOrder(mlp.gate_proj.out_features, mlp.gate_proj.weight.device)
        mlp.gate_proj = NeuronRows(mlp.gate_proj, self.order)
        mlp.up_proj = NeuronRows(mlp.up_proj, self.order)
        mlp.down_proj = NeuronColumns(mlp.down_proj, self.order)
        self.gate, self.up, self.down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.act_fn = mlp.act_fn
        mlp.bwprune_reordered = self

    @classmethod
    def of(cls, mlp: nn.Module) -> ReorderedFFN:
        return getattr(mlp, "bwprune_reordered", None) or cls(mlp)

    def _by_neuron(self) -> list[torch.Tensor]:
        """Every tensor with a row per neuron, in `order`'s rows."""
        return [t.data for t in (self.gate.weight, self.up.weight, self.down.rows,
                                 self.gate.bias, self.up.bias) if t is not None]  # fmt: skip

    @torch.no_grad()
    def reorder(self, at: torch.Tensor) -> None:
        """Row i holds neuron `at[i]` from now on (`at`: every neuron once)."""
        source = self.order.row[at]
        for tensor in self._by_neuron():
            through = scratch("reorder", tensor.shape, tensor)
            tensor.copy_(torch.index_select(tensor, 0, source, out=through))
        rows = torch.arange(len(at), device=at.device)
        self.order.at.copy_(at)
        self.order.row[at] = rows
        self.order.identity = bool(torch.equal(at, rows))

    @torch.no_grad()
    def swap(self, rows: torch.Tensor, neurons: torch.Tensor) -> None:
        """Rows `rows` hold `neurons` from now on; the neurons they held take those neurons'
        rows."""
        order = self.order
        others, leaving = order.row[neurons], order.at[rows]
        for tensor in self._by_neuron():
            held = tensor.index_select(0, rows)
            tensor.index_copy_(0, rows, tensor.index_select(0, others))
            tensor.index_copy_(0, others, held)
        order.at[rows], order.at[others] = neurons, leaving
        order.row[neurons], order.row[leaving] = rows, others
        order.identity = False

    def reset(self) -> None:
        """Every neuron back in its own row: the checkpoint's order."""
        if not self.order.identity:
            self.reorder(torch.arange(len(self.order.at), device=self.order.at.device))

    def kept(self, slots: int) -> InPlaceKept:
        return InPlaceKept(self, slots)


class InPlaceKept:
    """The first `slots` rows of a reordered FFN as its kept set (a `SlotWeights`): slot i is
    row i, so writing a slot moves its neuron there."""

    def __init__(self, ffn: ReorderedFFN, slots: int) -> None:
        self.ffn, self.slots = ffn, slots
        self.act: Callable[[torch.Tensor], torch.Tensor] = ffn.act_fn
        # views of the first rows, made once: reordering writes in place, so they stay valid
        c = slots
        self.gate = (ffn.gate.weight[:c], None if ffn.gate.bias is None else ffn.gate.bias[:c])
        self.up = (ffn.up.weight[:c], None if ffn.up.bias is None else ffn.up.bias[:c])
        self.down = ffn.down.weight[:, :c]

    def write(self, writes: SlotWrites) -> None:
        if bool((writes.neurons == EMPTY).any()):
            raise ValueError(
                "kept weights in place hold a neuron in every slot; a kept set of "
                f"{int((writes.neurons != EMPTY).sum())} neurons leaves some empty"
            )
        at = self.ffn.order.at
        if writes.refill:  # the kept set first, in slot order, then the rest as they lie
            rest = torch.ones(len(at), dtype=torch.bool, device=at.device)
            rest[writes.neurons] = False
            self.ffn.reorder(torch.cat([writes.neurons, at[rest[at]]]))
        else:
            self.ffn.swap(writes.slots, writes.neurons)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        z = self.act(F.linear(x, *self.gate)) * F.linear(x, *self.up)
        return F.linear(z, self.down, self.ffn.down.bias)
