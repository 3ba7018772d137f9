"""`SlicedMLP`: a gated MLP that runs real, smaller matmuls over a kept set of neurons (Eq. 4).

Masking the output of a dense matmul saves nothing, so structured methods keep the kept rows of
gate/up and the kept columns of down in buffers of their own and multiply by those. The buffers
are allocated once per capacity and a new kept set rewrites only the slots whose neuron changed
(`bwprune.models.kept_slots`): a refresh costs the neurons that moved, not the whole set. With no
index set, the module runs the original projections, so hooks on them (e.g. a pre-hook on
`down_proj` that reads the FF activation Z) still fire.
This module holds no policy: which neurons to keep is the method's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from bwprune.models import ffn_op
from bwprune.models.in_place import ReorderedFFN
from bwprune.models.kept_slots import KeptSlots, SlotWrites


class SlotWeights(Protocol):
    """Kept weights of a fixed number of slots, in some kernel's layout."""

    slots: int

    def write(self, writes: SlotWrites) -> None: ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def neuron_rows(down: torch.Tensor) -> torch.Tensor:
    """A down projection's (H, D_ff) weight with each neuron's column as a row: the source a
    refresh gathers down columns from. On CPU a contiguous copy, made once: gathering 85 strided
    columns of each of SmolLM2's 30 layers took 24 ms per refresh against 4 from rows (one
    thread); elsewhere a view, as a copy would hold a third of the FFN's weights twice."""
    return down.t().contiguous() if down.device.type == "cpu" else down.t()


class KeptWeights:
    """A gated FFN's kept neurons as plain matrices, slot by slot: (2C, H) gate rows then up
    rows and (C, H) down columns held as rows, C slots, so a slot is contiguous in every buffer
    (a refresh writing down columns in place touched every cache line of the buffer: 31 against
    11.5 ms for SmolLM2's 30 layers at 11 % churn, one thread, and the (C, H) product was no
    slower: 21-54 against 21-96 us at batch 4-16). Their addresses never change, so a compiled
    step (or a CUDA graph) that reads them reads each refresh in place."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down_rows: torch.Tensor,
                 biases: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None],
                 glu: Callable[[torch.Tensor], torch.Tensor], slots: int) -> None:  # fmt: skip
        """`gate`, `up`: (D_ff, H); `down_rows`: (D_ff, H), the down projection's columns as
        rows (`neuron_rows`): the sources slots are written from; `biases`: gate's, up's,
        down's; `glu`: (..., 2C) gate|up outputs -> (..., C)."""
        self.sources, self.glu, self.slots = (gate, up, down_rows), glu, slots
        self.gate_bias, self.up_bias, self.down_bias = biases
        self.gate_up = gate.new_zeros(2 * slots, gate.shape[1])
        self.down_rows = down_rows.new_zeros(slots, down_rows.shape[1])
        self.gate_up_bias = None if self.gate_bias is None else gate.new_zeros(2 * slots)
        for buffer in (self.gate_up, self.down_rows, self.gate_up_bias):
            if buffer is not None:  # a CUDA graph reads it in place rather than copying it in
                torch._dynamo.mark_static_address(buffer, guard=False)

    @torch.no_grad()
    def write(self, writes: SlotWrites) -> None:
        (gate, up, down_rows), c = self.sources, self.slots
        self._put(writes, gate, self.gate_up, 0)
        self._put(writes, up, self.gate_up, c)
        self._put(writes, down_rows, self.down_rows, 0)
        if self.gate_up_bias is not None:
            self._put(writes, self.gate_bias, self.gate_up_bias, 0)
            self._put(writes, self.up_bias, self.gate_up_bias, c)

    def _put(self, writes: SlotWrites, source: torch.Tensor, buffer: torch.Tensor,
             offset: int) -> None:  # fmt: skip
        """The written neurons' rows of `source` into `buffer`'s slots from `offset`. A refill
        gathers straight into the buffer (a third of the time of gathering, then copying into
        every slot: 23 against 70 ms for SmolLM2's 30 layers on one thread)."""
        if writes.refill:
            writes.gather(source, out=buffer.narrow(0, offset, self.slots))
        else:
            buffer.index_copy_(0, writes.slots + offset, writes.gather(source))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = F.linear(x, self.gate_up, self.gate_up_bias)
        return F.linear(self.glu(gate_up), self.down_rows.mT, self.down_bias)


class KeptFFN(nn.Module):
    """An FFN that computes a kept set when one is set, through slot weights a subclass builds;
    dense otherwise (`dense`). Shared by the hosts, so each moves the same neurons."""

    def __init__(self, d_ff: int, align: int = 1, grow: bool = False) -> None:
        """`align`: slots come in multiples of it (a kernel's panel width); `grow`: a smaller
        kept set keeps the slots (`KeptSlots`)."""
        super().__init__()
        self.d_ff = d_ff
        self.index: torch.Tensor | None = None
        self.slots = KeptSlots(d_ff, align, grow)
        self.weights: SlotWeights | None = None
        self.sink: torch.Tensor | None = None  # where a dense forward leaves Z (see `forward`)

    # -- a subclass -------------------------------------------------------------------------------
    def slot_weights(self, slots: int) -> SlotWeights:
        """Empty (zero) weights of `slots` slots."""
        raise NotImplementedError

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        """The FFN as its model runs it: hooks on its projections fire."""
        raise NotImplementedError

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """Z, the down projection's input."""
        raise NotImplementedError

    def project(self, z: torch.Tensor) -> torch.Tensor:
        """The down projection of Z, calling no hook on it."""
        raise NotImplementedError

    @property
    def weight(self) -> torch.Tensor:
        """A weight of the FFN: the dtype and device of its activations."""
        raise NotImplementedError

    @property
    def relays(self) -> bool:
        """Whether a first kept set re-lays the whole FFN in place (not slots beside it)."""
        return False

    # -- the mechanism ----------------------------------------------------------------------------
    @property
    def kept(self) -> int:
        """Neurons computed on the next forward."""
        return self.d_ff if self.index is None else int(self.index.numel())

    @torch.no_grad()
    def set_index(self, index: torch.Tensor | None) -> SlotWrites | None:
        """Keep the neurons in `index` (1-D, distinct, any order) from now on; `None` runs dense.
        The slots whose neuron changed are rewritten (all of them for a new capacity); the
        writes are returned (None: nothing moved)."""
        if index is None or (self.index is not None and torch.equal(self.index, index)):
            self.index = index
            return None
        writes = self.slots.assign(index)
        if self.weights is None or self.weights.slots != self.slots.capacity:
            self.weights = self.slot_weights(self.slots.capacity)
        if len(writes):
            self.weights.write(writes)
        self.index = index
        return writes

    def restart(self) -> None:
        """Dense, and the next kept set fills the slots afresh, in its own order (the buffers
        stay): a generation then computes the same whatever ran before it."""
        self.index = None
        self.slots = KeptSlots(self.d_ff, self.slots.align, self.slots.grow)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The kept set; else dense, leaving Z in the `sink` where a host gave one.

        A host gives sinks for a forward whose Z its method observes, when its own observer is
        the only hook on the down projections (`bwprune.methods.host.Host.end` hands them over):
        a hook per layer, its index and the scores' bookkeeping cost an observing decode step
        of SmolLM2 several ms on this CPU, where one copy per layer and one fold of every layer
        at once cost about one."""
        if self.index is not None:
            return self.weights(x)
        if self.sink is None:
            return self.dense(x)
        z = self.activation(x)
        self.sink.copy_(z)
        return self.project(z)


class SlicedMLP(KeptFFN):
    """Wraps an HF gated MLP (gate_proj, up_proj, down_proj, act_fn); same output when dense.
    Traced by a compiled step off CUDA, a kept set is the opaque op `bwprune::ffn` (`ffn_op`),
    so the step runs the kept set in force at each call; dense, it is traced (a graph of its own)
    with Z copied into the sink where the host gave one, else with the down projection behind
    `bwprune::observed`, so the observers in force fire (called out to layer by layer, they cost
    a compiled observing step of SmolLM2 about 5 ms at batch 4: an op, a module call, a hook and
    an index per layer, 140-155 us each)."""

    def __init__(self, mlp: nn.Module, in_place: bool = False) -> None:
        """`in_place`: the MLP's own weights, reordered, hold the kept set (`ReorderedFFN`: one
        copy of the weights) instead of buffers beside them (`KeptWeights`)."""
        super().__init__(mlp.gate_proj.out_features)
        self.mlp = mlp
        self.reordered = ReorderedFFN.of(mlp) if in_place else None
        self.opaque = ffn_op.opaque(mlp.gate_proj.weight.device)
        self.handle = ffn_op.register(self)
        self.down_handle = ffn_op.register(mlp.down_proj)
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.act_fn = mlp.act_fn
        self.down_rows: torch.Tensor | None = None  # made once, by the first kept set

    def slot_weights(self, slots: int) -> SlotWeights:
        if self.reordered is not None:
            return self.reordered.kept(slots)
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        if self.down_rows is None:
            self.down_rows = neuron_rows(d.weight.detach())
        return KeptWeights(g.weight, u.weight, self.down_rows, (g.bias, u.bias, d.bias),
                           self._glu, slots)  # fmt: skip

    @property
    def relays(self) -> bool:
        return self.reordered is not None

    def restart(self) -> None:
        super().restart()
        if self.reordered is not None:
            self.reordered.reset()

    def _glu(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.act_fn(gate) * up

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        return self.act_fn(self.gate_proj(x)) * self.up_proj(x)

    def project(self, z: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(z)

    def dense(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.activation(x))

    @property
    def weight(self) -> torch.Tensor:
        return self.gate_proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.opaque and torch.compiler.is_compiling():
            if self.index is not None:
                return torch.ops.bwprune.ffn(x, self.handle)
            if self.sink is None:  # gate, up and their product as compiled dense does
                z = self.activation(x)
                return torch.ops.bwprune.observed(z, self.down_handle, self.down_proj.out_features)
        return super().forward(x)
