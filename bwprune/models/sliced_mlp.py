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
        """Keep the neurons in `index` (1-D, any order) from now on; `None` runs dense."""
        if index is None:
            self.index, self._gate_up, self._gate_up_bias, self._down = None, None, None, None
            return
        if (
            self.index is not None
            and self.index.shape == index.shape
            and torch.equal(self.index, index)
        ):
            return  # same neurons: keep the gathered buffers
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        self.index = index
        self._gate_up = torch.cat([g.weight[index], u.weight[index]]).contiguous()
        self._gate_up_bias = (
            torch.cat([g.bias[index], u.bias[index]]) if g.bias is not None else None
        )
        self._down = d.weight[:, index].contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, self._gate_up, self._gate_up_bias).chunk(2, dim=-1)
        return F.linear(self.act_fn(gate) * up, self._down, self.down_proj.bias)
