"""Counts, from the tensors of each decode step, the parameters a forward provably left out.

Independent of every method's own bookkeeping, so the ledger can be checked against it. Per row
and decode step, a weight W_ij of a decoder layer's linear (q, k, v, o, gate, up, down) is left
out when it is absent (a structured method removed it, or a sliced MLP did not gather it), zero,
multiplied by a zero input x_j, or in an up-projection row whose gate activation is zero (its
product with the gate is zero whatever it computes: what CATS's kernel skips). The sum over the
model, divided by the parameters of the model as loaded, is what the ledger reports as (c).
"""

from __future__ import annotations

import torch
from torch import nn

from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import ModelAdapter
from bwprune.models.sliced_mlp import SlicedMLP


class SkipOracle:
    """Context manager: hooks every layer, then `per_row`. Enter it with the method attached,
    so its hooks run after the method's glue and see what the method changed."""

    def __init__(self, model: nn.Module, adapter: ModelAdapter, total_params: float) -> None:
        self.model, self.adapter, self.total = model, adapter, total_params
        # Parameters a static method removed for good (relative to the model as loaded).
        self.removed = total_params - adapter.num_params()
        self.steps: list[torch.Tensor] = []  # (B,) parameters left out, per decode step
        self._step: torch.Tensor | None = None
        self._hooks = HookSet()

    def __enter__(self) -> SkipOracle:
        self._hooks.forward_pre(self.model, self._begin, with_kwargs=True)
        self._hooks.forward(self.model, self._end)
        for i in range(len(self.adapter.layers)):
            a, f = self.adapter.attn(i), self.adapter.ffn(i)
            for lin in (a.q, a.k, a.v, a.o, f.gate, f.down):
                self._hooks.forward_pre(lin, self._linear())
            gate_out: dict[str, torch.Tensor] = {}
            self._hooks.forward(f.gate, lambda m, args, out, d=gate_out: d.update(out=out))
            self._hooks.forward_pre(f.up, self._linear(f.act, gate_out))
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.close()

    def _begin(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._step = None
        if ids.shape[1] == 1:  # a decode step
            self._step = torch.zeros(ids.shape[0], dtype=torch.float64)

    def _end(self, module: nn.Module, args: tuple, out) -> None:
        if self._step is not None:
            self.steps.append(self._step + self.removed + self._sliced())
        self._step = None

    def _sliced(self) -> float:
        """Weights a `SlicedMLP` did not gather in this forward (the method set its index)."""
        absent = 0.0
        for layer in self.adapter.layers:
            mlp = layer.mlp
            if isinstance(mlp, SlicedMLP) and mlp.index is not None:
                per_neuron = mlp.gate_proj.in_features * 2 + mlp.down_proj.out_features
                absent += (mlp.d_ff - mlp.kept) * per_neuron
        return absent

    def _linear(self, act=None, gate_out: dict | None = None):
        """Pre-hook of one linear: count its left-out weights for every row of a decode step."""

        def count(module: nn.Linear, args: tuple) -> None:
            if self._step is None:
                return
            x = args[0][:, -1]  # (B, in)
            used = (module.weight != 0)[None] & (x != 0)[:, None, :]  # (B, out, in)
            if gate_out is not None:  # up rows whose gate activation is zero are not needed
                needed = act(gate_out["out"][:, -1]) != 0  # (B, out)
                used &= needed[:, :, None]
            self._step += (module.weight.numel() - used.sum(dim=(1, 2))).double()

        return count

    def per_row(self, decode_steps: list[int]) -> list[float]:
        """Mean over each row's own decode steps of its left-out fraction of all parameters."""
        steps = torch.stack(self.steps)  # (S, B)
        return [float(steps[:n, b].sum()) / n / self.total for b, n in enumerate(decode_steps)]
