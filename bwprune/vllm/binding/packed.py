"""Kept neurons inside vLLM's CPU MoE kernel: packed once, changed in place, slot by slot.

vLLM's CPU build multiplies its dense layers through oneDNN on weights packed into an opaque
format, so a kept set gathered into plain matrices either re-packs on every change (a refresh of
SmolLM2's 30 layers cost about 1.6 dense decode steps at batch 16) or multiplies unpacked (plain
GEMM here ran the sliced FFN 1.5-2x slower than packed). vLLM's CPU fused-MoE kernel instead
packs into an ordinary tensor of panels — `[rows / P, cols, P]`, P output rows side by side — and
takes the FFN's whole gate|up, SiLU-and-mul, down chain in one call. A kept set is one "expert"
of C slots: gate rows then up rows (2C, H) and down columns (H, C), every token routed to it
with weight 1. Knowing the panel layout, a refresh writes each changed slot's H values straight
into their packed places (`PackedKeptWeights.write`): no re-pack, no allocation.

The layout is not documented, so it is read off the kernel itself: row and column numbers packed
as values show where each weight lands, and the panel formula is used only if it reproduces that
exactly for the shape at hand (`panel_width`); otherwise, and where the kernel is missing or the
sizes do not fit it, the host uses plain matrices (`bwprune.models.sliced_mlp.KeptWeights`).
"""

from __future__ import annotations

from functools import cache

import torch

from bwprune.models.kept_slots import SlotWrites

ISA = "vec"  # the kernel's portable x86/AVX code path (fp32)
ALIGN = 32  # the kernel's output sizes (the hidden size and 2C) must be multiples of this
PANELS = (16, 8, 32, 64)  # panel widths tried against the kernel's layout, likeliest first


def _ops():
    from vllm import _custom_ops as ops

    return ops


def supported(hidden: int, dtype: torch.dtype, device: torch.device, biased: bool) -> bool:
    """Whether an FFN of this kind can run its kept set through the packed kernel (at a
    capacity that `fits`)."""
    if device.type != "cpu" or dtype != torch.float32 or biased or hidden % ALIGN:
        return False
    return hasattr(_ops(), "cpu_fused_moe") and hasattr(torch.ops._C, "cpu_fused_moe")


def fits(hidden: int, slots: int) -> bool:
    """Whether the panel layout of both packed weights is known at `slots` slots."""
    return panel_width(2 * slots, hidden) is not None and panel_width(hidden, slots) is not None


@cache
def panel_width(rows: int, cols: int) -> int | None:
    """P such that the kernel packs a (1, rows, cols) fp32 weight's (r, c) at flat position
    (r // P)·cols·P + c·P + r % P, checked on every element; None if no P in `PANELS` does."""
    pack = _ops().cpu_prepack_moe_weight
    r = torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, cols)
    c = torch.arange(cols, dtype=torch.float32)[None, :].expand(rows, cols)
    packed_r = pack(r[None].contiguous(), ISA).flatten().long()
    packed_c = pack(c[None].contiguous(), ISA).flatten().long()
    where = torch.arange(rows * cols)
    for p in PANELS:
        if rows % p == 0 and torch.equal(
            (packed_r // p) * cols * p + packed_c * p + packed_r % p, where
        ):
            return p
    return None


class _Routes:
    """Every token to the one expert with weight 1: views of two tensors shared by every layer
    and grown (doubled) on demand, so they hold as much as the longest forward needs. (A tensor
    per token count and layer grew a preempting server's worker by 513 MiB in 1000 requests:
    every recomputed prompt has a count of its own.)"""

    def __init__(self) -> None:
        self.weight = torch.ones(0, 1)
        self.expert = torch.zeros(0, 1, dtype=torch.int32)

    def take(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        if tokens > len(self.weight):
            size = max(tokens, 2 * len(self.weight))
            self.weight = torch.ones(size, 1)
            self.expert = torch.zeros(size, 1, dtype=torch.int32)
        return self.weight[:tokens], self.expert[:tokens]


_ROUTES = _Routes()


class PackedKeptWeights:
    """C slots of a gated FFN in the kernel's packed layout, written slot by slot."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down_rows: torch.Tensor,
                 slots: int) -> None:  # fmt: skip
        """`gate`, `up`: (D_ff, H); `down_rows`: (D_ff, H), the down projection's columns as
        rows (`bwprune.models.sliced_mlp.neuron_rows`): the sources slots are written from."""
        hidden = gate.shape[1]
        self.sources, self.slots, self.hidden = (gate, up, down_rows), slots, hidden
        self.w13 = gate.new_zeros(1, 2 * slots, hidden)  # zeros pack to zeros in any layout
        self.w2 = down_rows.new_zeros(1, hidden, slots)
        self.p13, self.p2 = panel_width(2 * slots, hidden), panel_width(hidden, slots)

    @torch.no_grad()
    def write(self, writes: SlotWrites) -> None:
        """Each written slot's gate and up rows and down column, straight into their panels:
        (r, c) of a weight packed in panels of P lives at [r // P, c, r % P] of the packed
        tensor seen as (rows / P, cols, P). The slots come in ascending order, so rows of one
        panel are written one after another while its cache lines are still near."""
        (gate, up, down_rows), slots = self.sources, writes.slots
        w13 = self.w13.view(-1, self.hidden, self.p13)
        by_slot = self.w2.view(-1, self.slots, self.p2).transpose(0, 1)  # (C, H / P, P)
        down_cols = writes.gather(down_rows).view(len(slots), -1, self.p2)
        if writes.refill:  # every slot, in order: a panel is the transpose of P gathered rows
            w13.copy_(writes.gather(gate, up).view(-1, self.p13, self.hidden).mT)
            by_slot.copy_(down_cols)
            return
        rows = torch.cat([slots, slots + self.slots])  # gate rows, then up rows
        w13[rows // self.p13, :, rows % self.p13] = writes.gather(gate, up)
        by_slot.index_copy_(0, slots, down_cols)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return run_expert(x, self.w13, self.w2)


def run_expert(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """(T, H) -> (T, H): every token through the one expert packed as `w13` (1, 2N, H) and `w2`
    (1, H, N), weight 1."""
    weight, expert = _ROUTES.take(x.shape[0])
    out = torch.empty_like(x)
    _ops().cpu_fused_moe(out, x.contiguous(), w13, w2, None, None, weight, expert, "silu", ISA,
                         False)  # fmt: skip
    return out
