"""One copy of an FFN's weights in vLLM's CPU MoE kernel's panels: a kept set is one expert of
it, the other neurons a second (`generation.kept_weights=in_place` in the vLLM backend).

vLLM's dense layers multiply weights it packed for oneDNN, an opaque format no row can be read
from, so a kept set otherwise runs from panels of its own (`bwprune.vllm.binding.packed`), gathered
from a plain copy of the MLP: three forms of the MLP at once, 2.15x the 1.5B's weights at ρ 0.5
(docs/configuration.md, Memory). Here the MLP is held once, in the panel layout that kernel reads
(`packed.panel_width`): the kept set's neurons are the first expert (gate and up rows, down
columns, C slots), every other neuron the second (R slots), both views of one store per weight,
padding slots zero. A sparse step runs the first expert through the kernel, as the packed kept
set does; a refresh swaps each entering neuron with the one leaving its slot, in place.

A dense step (the prompt, an observing window) must also show the method Z, which the fused kernel
does not return: the MLP's own projections are given a method (`PanelLinear`, in place of vLLM's
oneDNN one) that multiplies the panels with batched matmuls and puts the neuron axis back in the
model's order, so every hook and sink sees each neuron where the checkpoint has it. That step is
slower than vLLM's packed dense one (measured in docs/engine.md), which is why `buffers` stays the
default. A dense step sums the neurons in the order the last kept sets left, so each generation
starts from the checkpoint's order (`reset`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from bwprune.errors import UserError
from bwprune.models.kept_slots import EMPTY, SlotWrites, capacity
from bwprune.models.scratch import scratch
from bwprune.vllm.binding import packed

CHUNK = 512  # rows moved at a time between panels and plain rows (3 MB at the 1.5B's hidden size)
FEW_TOKENS = 32  # a dense forward of at most this many tokens multiplies the panels as they lie


class Expert:
    """`slots` neurons of an FFN as one expert of the kernel, in its panel layout over the
    stores' first elements: gate rows then up rows (2N, H), packed as (2N / P, H, P), and down
    columns (H, N), packed as (H / P, N, P)."""

    def __init__(self, w13: Tensor, w2: Tensor, slots: int, hidden: int) -> None:
        """`w13`, `w2`: flat storage from this expert's first element on."""
        self.slots, self.hidden = slots, hidden
        self.w13 = w13[: 2 * slots * hidden].view(1, 2 * slots, hidden)
        self.w2 = w2[: hidden * slots].view(1, hidden, slots)
        self.p13 = packed.panel_width(2 * slots, hidden) if slots else 1
        self.p2 = packed.panel_width(hidden, slots) if slots else 1
        if self.p13 is None or self.p2 is None:
            raise ValueError(f"the kernel's panel layout is unknown at {slots} slots of {hidden}")

    def _panels13(self) -> Tensor:  # (2N / P, H, P)
        return self.w13.view(2 * self.slots // self.p13, self.hidden, self.p13)

    def panels2(self) -> Tensor:
        """The down columns as (H / P, N, P) panels."""
        return self.w2.view(self.hidden // self.p2, self.slots, self.p2)

    def read(self, slots: Tensor) -> Tensor:
        """(3, n, H): the gate rows, up rows and down columns of `slots`."""
        rows = torch.cat([slots, slots + self.slots])
        gate_up = self._panels13()[rows // self.p13, :, rows % self.p13]  # (2n, H)
        down = self.panels2()[:, slots, :].transpose(0, 1).reshape(len(slots), self.hidden)
        return torch.cat([gate_up, down]).view(3, len(slots), self.hidden)

    def write(self, slots: Tensor, weights: Tensor) -> None:
        """`slots` hold `weights` ((3, n, H), as `read` gives them) from now on."""
        rows = torch.cat([slots, slots + self.slots])
        self._panels13()[rows // self.p13, :, rows % self.p13] = weights[:2].flatten(0, 1)
        by_slot = self.panels2().transpose(0, 1)  # (N, H / P, P)
        by_slot.index_copy_(0, slots, weights[2].view(len(slots), -1, self.p2))

    def _chunks13(self, neurons: Tensor) -> Iterator[tuple[slice, Tensor, Tensor]]:
        """Gate|up rows a few panels at a time: (panels, each row's part (0 gate, 1 up), each
        row's neuron) for slots holding `neurons`."""
        step = self.p13 * max(1, CHUNK // self.p13)
        for start in range(0, 2 * self.slots, step):
            rows = torch.arange(start, min(start + step, 2 * self.slots))
            part = (rows >= self.slots).long()
            yield (slice(start // self.p13, (start + len(rows)) // self.p13), part,
                   neurons[rows - part * self.slots])  # fmt: skip

    def fill(self, plain: Tensor, neurons: Tensor) -> None:
        """Slot i holds neuron `neurons[i]` of `plain` ((3, D_ff, H) by neuron; `EMPTY`:
        zeros), a chunk at a time: a panel is the transpose of P rows."""
        panels, by_slot = self._panels13(), self.panels2().transpose(0, 1)  # (N, H / P, P)
        for where, part, neuron in self._chunks13(neurons):
            rows = plain[part, neuron.clamp_min(0)].masked_fill_((neuron < 0)[:, None], 0)
            panels[where].copy_(rows.view(-1, self.p13, self.hidden).mT)
        for start in range(0, self.slots, CHUNK):
            neuron = neurons[start : start + CHUNK]
            rows = plain[2, neuron.clamp_min(0)].masked_fill_((neuron < 0)[:, None], 0)
            by_slot[start : start + len(neuron)].copy_(rows.view(len(neuron), -1, self.p2))

    def unpack(self, plain: Tensor, neurons: Tensor) -> None:
        """`fill`'s inverse: each slot's weights into its neuron's rows of `plain`."""
        panels, by_slot = self._panels13(), self.panels2().transpose(0, 1)
        for where, part, neuron in self._chunks13(neurons):
            real = neuron >= 0
            rows = panels[where].mT.reshape(-1, self.hidden)
            plain[part[real], neuron[real]] = rows[real]
        for start in range(0, self.slots, CHUNK):
            neuron = neurons[start : start + CHUNK]
            rows = by_slot[start : start + len(neuron)].reshape(len(neuron), self.hidden)
            plain[2, neuron[neuron >= 0]] = rows[neuron >= 0]

    def __call__(self, x: Tensor) -> Tensor:
        """(T, H) -> (T, H): SiLU(gate)·up through down, in the kernel (`packed`)."""
        return packed.run_expert(x, self.w13, self.w2)


class OneCopyFFN:
    """An FFN's weights held once as two experts: kept slots [0, C), the rest [C, C + R)."""

    def __init__(self, gate: Tensor, up: Tensor, down: Tensor,
                 align: int = packed.ALIGN) -> None:  # fmt: skip
        """`gate`, `up`: (D_ff, H); `down`: (H, D_ff), as loaded (copied, not kept)."""
        d_ff, hidden = gate.shape
        self.d_ff, self.hidden, self.align = d_ff, hidden, align
        room = capacity(d_ff, align) + align  # a kept part and a rest, each rounded up to align
        self.w13 = gate.new_zeros(2 * room * hidden)
        self.w2 = gate.new_zeros(room * hidden)
        self.at = torch.full((room,), EMPTY, dtype=torch.long)  # position -> neuron
        self.row = torch.arange(d_ff)  # neuron -> position
        plain = scratch("plain", (3, d_ff, hidden), gate)
        plain[0].copy_(gate)
        plain[1].copy_(up)
        plain[2].copy_(down.mT)
        self._lay(plain, torch.zeros(0, dtype=torch.long), 0)

    def _lay(self, plain: Tensor, kept: Tensor, slots: int) -> None:
        """Lay out `plain` ((3, D_ff, H) by neuron): `kept` (neurons, `EMPTY` for an empty
        slot) in the first `slots` slots, every other neuron after them in ascending order."""
        rest_mask = torch.ones(self.d_ff, dtype=torch.bool)
        rest_mask[kept[kept >= 0]] = False
        rest = torch.nonzero(rest_mask).flatten()
        kept_part = Expert(self.w13, self.w2, slots, self.hidden)
        rest_part = Expert(self.w13[2 * slots * self.hidden :], self.w2[slots * self.hidden :],
                           capacity(len(rest), self.align), self.hidden)  # fmt: skip
        if slots and (kept_part.p13, kept_part.p2) != (rest_part.p13, rest_part.p2):
            raise ValueError(f"the kernel packs {slots} and {rest_part.slots} slots of "
                             f"{self.hidden} in panels of different widths")  # fmt: skip
        self.kept, self.rest = kept_part, rest_part
        self.at.fill_(EMPTY)
        self.at[: len(kept)] = kept
        self.at[slots : slots + len(rest)] = rest
        for expert, first in ((self.kept, 0), (self.rest, slots)):
            expert.fill(plain, self.at[first : first + expert.slots])
        self._made = None
        laid = slots + self.rest.slots  # past them the stores hold nothing (zeros, not stale rows)
        self.w13[2 * laid * self.hidden :].zero_()
        self.w2[laid * self.hidden :].zero_()
        real = self.at >= 0
        self.row[self.at[real]] = torch.nonzero(real).flatten()
        self.identity = slots == 0

    def _plain(self) -> Tensor:
        """The weights as rows by neuron, (3, D_ff, H), in the process's scratch."""
        plain = scratch("plain", (3, self.d_ff, self.hidden), self.w13)
        for expert, first in ((self.kept, 0), (self.rest, self.kept.slots)):
            expert.unpack(plain, self.at[first : first + expert.slots])
        return plain

    @torch.no_grad()
    def lay_kept(self, neurons: Tensor, slots: int) -> None:
        """A kept set of `slots` slots holding `neurons` (slot order, `EMPTY` for none)."""
        self._lay(self._plain(), neurons, slots)

    @torch.no_grad()
    def swap(self, slots: Tensor, neurons: Tensor) -> None:
        """Kept slots `slots` hold `neurons` (none of them kept now) from now on; the neurons
        they held take those neurons' places among the rest."""
        places = self.row[neurons] - self.kept.slots
        leaving = self.at[slots]
        held = self.kept.read(slots)
        self.kept.write(slots, self.rest.read(places))
        self.rest.write(places, held)
        self.at[slots], self.at[places + self.kept.slots] = neurons, leaving
        self.row[neurons] = slots
        self.row[leaving[leaving >= 0]] = places[leaving >= 0] + self.kept.slots
        self._made = None

    def reset(self) -> None:
        """Every neuron in the rest, in ascending order: the checkpoint's."""
        if not self.identity:
            self.lay_kept(torch.zeros(0, dtype=torch.long), 0)

    def _maps(self) -> tuple[Tensor, Tensor]:
        """Each neuron's gate row then each one's up row in the stores' gate|up rows (2 D_ff,),
        and each place's neuron (C + R,; a padding place any neuron's), made once per layout."""
        if self._made is None:
            c, r, place = self.kept.slots, self.rest.slots, self.row
            kept = place < c
            gate = torch.where(kept, place, place + c)  # the rest's rows start at 2C
            up = torch.where(kept, place + c, place + c + r)
            self._made = (torch.cat([gate, up]), self.at[: c + r].clamp_min(0))
        return self._made

    def gate_up(self, x: Tensor) -> Tensor:
        """(T, H) -> (T, 2 D_ff): gate then up, each in the model's neuron order: one batched
        matmul over both experts' panels (they lie one after the other, in panels of one
        width), then the rows put in the model's order. A matmul per panel is P outputs wide,
        too narrow for a GEMM to run well at many tokens (a prompt): there, blocks of panels are
        copied out as plain matrices first (`FEW_TOKENS`)."""
        rows, p = 2 * (self.kept.slots + self.rest.slots), self.rest.p13
        panels = self.w13[: rows * self.hidden].view(rows // p, self.hidden, p)
        if len(x) <= FEW_TOKENS:
            by_row = torch.matmul(x, panels).transpose(0, 1).reshape(len(x), rows)
        else:
            step = max(1, CHUNK // p)
            by_row = torch.cat([x @ panels[i : i + step].permute(1, 0, 2).reshape(self.hidden, -1)
                                for i in range(0, len(panels), step)], dim=1)  # fmt: skip
        return by_row.index_select(-1, self._maps()[0])

    def down(self, z: Tensor) -> Tensor:
        """(T, D_ff) in the model's order -> (T, H), as `gate_up` computes. A padding place
        takes any neuron's value: its down column is zero."""
        by_place, c = z.index_select(-1, self._maps()[1]), self.kept.slots
        parts = [(by_place[:, :c], self.kept.panels2()), (by_place[:, c:], self.rest.panels2())]
        if len(z) <= FEW_TOKENS:
            out = sum(torch.matmul(part, panels) for part, panels in parts if part.shape[1])
            return out.transpose(0, 1).reshape(len(z), self.hidden)
        out = z.new_zeros(len(z), self.hidden)
        for part, panels in parts:
            for i in range(0, part.shape[1], CHUNK):
                rows = panels[:, i : i + CHUNK].transpose(0, 1).reshape(-1, self.hidden)
                out.addmm_(part[:, i : i + CHUNK], rows)
        return out


class OneCopyKept:
    """The first expert of a `OneCopyFFN` as its kept set (a `SlotWeights`): writing a slot
    moves its neuron there."""

    def __init__(self, ffn: OneCopyFFN, slots: int) -> None:
        self.ffn, self.slots = ffn, slots

    def write(self, writes: SlotWrites) -> None:
        if writes.refill:  # every slot, in slot order
            self.ffn.lay_kept(writes.neurons, self.slots)
        elif bool((writes.neurons < 0).any()):  # a slot emptied: the rest has no place laid for it
            kept = self.ffn.at[: self.slots].clone()
            kept[writes.slots] = writes.neurons
            self.ffn.lay_kept(kept, self.slots)
        else:
            self.ffn.swap(writes.slots, writes.neurons)

    def __call__(self, x: Tensor) -> Tensor:
        return self.ffn.kept(x)


class PanelLinear:
    """A vLLM linear method (in place of its oneDNN one) for an MLP held by a `OneCopyFFN`: gate|up
    or down computed from the panels, in the model's neuron order, so vLLM's own MLP forward, and
    every hook on its projections, run unchanged."""

    def __init__(self, ffn: OneCopyFFN, part: str) -> None:
        self.ffn, self.part = ffn, part

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Nothing to pack: the weights live in the panels."""

    def apply(self, layer: nn.Module, x: Tensor, bias: Tensor | None = None):
        flat = x.reshape(-1, x.shape[-1])
        out = self.ffn.gate_up(flat) if self.part == "gate_up" else self.ffn.down(flat)
        out = out.view(*x.shape[:-1], -1)
        return out if bias is None else out + bias


def hold_once(mlp: nn.Module) -> OneCopyFFN:
    """Move a loaded vLLM MLP's weights into one `OneCopyFFN`; its projections compute from it
    and vLLM's own weights go (their oneDNN pack is never made)."""
    gate_up, down = mlp.gate_up_proj.weight.data, mlp.down_proj.weight.data
    biased = mlp.gate_up_proj.bias is not None or mlp.down_proj.bias is not None
    if not packed.supported(down.shape[0], down.dtype, down.device, biased):
        raise UserError(
            f"generation.kept_weights=in_place holds the MLP in vLLM's CPU MoE kernel, which runs "
            f"an unbiased fp32 MLP of a hidden size divisible by {packed.ALIGN} on CPU (here "
            f"{down.dtype}, hidden {down.shape[0]}, {down.device}, biased={biased}); run "
            "generation.kept_weights=buffers"
        )
    gate, up = gate_up.chunk(2)
    ffn = OneCopyFFN(gate, up, down)
    for linear, part in ((mlp.gate_up_proj, "gate_up"), (mlp.down_proj, "down")):
        linear.quant_method = PanelLinear(ffn, part)
        linear.weight = nn.Parameter(linear.weight.new_empty(0), requires_grad=False)
    return ffn
