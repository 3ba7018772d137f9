"""`SlicedMLP`: a gated MLP that runs real, smaller matmuls over a kept set of neurons (Eq. 4).

Masking the output of a dense matmul saves nothing, so structured methods gather the kept rows of
gate/up and the kept columns of down into contiguous buffers and multiply by those. The gather runs
only when the kept index changes. With no index set, the module runs the original projections, so
hooks on them (e.g. a pre-hook on `down_proj` that reads the FF activation Z) still fire.
This module holds no policy: which neurons to keep is the method's business.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SlicedMLP(nn.Module):
    """Wraps an HF gated MLP (gate_proj, up_proj, down_proj, act_fn); same output when dense."""

    def __init__(self, mlp: nn.Module) -> None:
        super().__init__()
        self.mlp = mlp
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.act_fn = mlp.act_fn
        self.d_ff = mlp.gate_proj.out_features
        self.index: torch.Tensor | None = None
        self._gate_up: torch.Tensor | None = None  # (2k, D): kept gate rows, then kept up rows
        self._gate_up_bias: torch.Tensor | None = None
        self._down: torch.Tensor | None = None  # (D, k): kept down columns

    @property
    def kept(self) -> int:
        """Neurons computed on the next forward."""
        return self.d_ff if self.index is None else int(self.index.numel())

    @torch.no_grad()
    def set_index(self, index: torch.Tensor | None) -> None:
        """Keep the neurons in `index` (1-D, any order) from now on; `None` runs dense.

        The gathers write into buffers allocated once per kept size: a mask refresh copies
        weights but allocates nothing (fresh allocations cost more than the copy on CPU).
        """
        if index is None:
            self.index = None
            return
        if (
            self.index is not None
            and self.index.shape == index.shape
            and torch.equal(self.index, index)
        ):
            return  # same neurons: keep the gathered buffers
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        k = index.numel()
        if self._down is None or self._down.shape[1] != k:
            self._gate_up = g.weight.new_empty(2 * k, g.in_features)
            self._down = d.weight.new_empty(d.out_features, k)
            self._gate_up_bias = g.bias.new_empty(2 * k) if g.bias is not None else None
        torch.index_select(g.weight, 0, index, out=self._gate_up[:k])
        torch.index_select(u.weight, 0, index, out=self._gate_up[k:])
        torch.index_select(d.weight, 1, index, out=self._down)
        if self._gate_up_bias is not None:
            torch.index_select(g.bias, 0, index, out=self._gate_up_bias[:k])
            torch.index_select(u.bias, 0, index, out=self._gate_up_bias[k:])
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, self._gate_up, self._gate_up_bias).chunk(2, dim=-1)
        return F.linear(self.act_fn(gate) * up, self._down, self.down_proj.bias)
