"""The vLLM host: a vLLM model's side of the method glue (`bwprune.methods.host`).

vLLM runs a forward over the flat tokens of its scheduled requests, `(N, D)`, in its input
batch's order, which is not the method's slot order (a finished request's place is refilled by
the last one). The session (`bwprune.vllm.session`) hands each forward's tokens to the driver
as the HF loop would — a `(B, T)` mask in slot order — and gives this host the permutation from
that order to vLLM's (`place`), so the method sees the same tokens in the same order in either
engine. Kept sets run as `SlicedMLP`s over the weights the plugin kept; keep masks zero entries
of vLLM's hidden states, which are sometimes tuples (fused add-norm) or fused (gate|up).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bwprune.errors import UserError
from bwprune.methods.base import PruningMethod, StepContext, Tokens
from bwprune.methods.host import FFNSlot, Host, Site


def _first(value):
    return value[0] if isinstance(value, tuple) else value


def _with_first(value, x: torch.Tensor):
    return (x, *value[1:]) if isinstance(value, tuple) else x


def _linear(weight: torch.Tensor, bias: torch.Tensor | None):
    """x -> x @ weight.T + bias, through the matmul vLLM's CPU build uses for its own linear
    layers (oneDNN, weights packed once) when there is one: plain `F.linear` on sliced weights
    ran slower than vLLM's packed dense layers."""
    if weight.device.type == "cpu":
        from vllm import _custom_ops as ops

        if ops._supports_onednn:
            handler = ops.create_onednn_mm(weight.t(), 32)
            return lambda x: ops.onednn_mm(handler, x, bias)
    return lambda x: F.linear(x, weight, bias)


class SlicedMLP(nn.Module):
    """A vLLM gated MLP (gate_up_proj, act_fn, down_proj) computing only the neurons of an
    index: the kept gate and up rows and down columns gathered (and packed) once per index."""

    def __init__(self, mlp: nn.Module, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        super().__init__()
        self.mlp, self.act_fn = mlp, mlp.act_fn
        self.gate_up_weight, self.down_weight = gate_up, down  # (2 D_ff, H), (H, D_ff)
        self.gate_up_bias = getattr(mlp.gate_up_proj, "bias", None)
        self.down_bias = getattr(mlp.down_proj, "bias", None)
        self.d_ff = down.shape[1]
        self.index: torch.Tensor | None = None

    @torch.no_grad()
    def set_index(self, index: torch.Tensor | None) -> None:
        """Keep the neurons in `index` (1-D) from now on; None runs dense (vLLM's own MLP)."""
        if index is not None and self.index is not None and torch.equal(self.index, index):
            return
        self.index = index
        if index is None:
            return
        rows = torch.cat([index, index + self.d_ff])
        gate_up_bias = None if self.gate_up_bias is None else self.gate_up_bias[rows]
        self._gate_up = _linear(self.gate_up_weight[rows].contiguous(), gate_up_bias)
        self._down = _linear(self.down_weight[:, index].contiguous(), self.down_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.index is None:
            return self.mlp(x)
        return self._down(self.act_fn(self._gate_up(x)))


class VLLMHost(Host):
    """The glue on a vLLM model built by the plugin (`bwprune.vllm.plugin`)."""

    def __init__(self, method: PruningMethod, compiled: bool) -> None:
        """`compiled`: the engine runs the model under torch.compile."""
        super().__init__(method)
        self.compiled = compiled
        self._order: torch.Tensor | None = None  # vLLM's index of each token; None: the same

    def attach(self, model: nn.Module, adapter=None):
        if self.glued and self.compiled:
            # vLLM compiles the decoder without guards: a Python branch inside it is frozen at
            # warm-up, so the glue would run once and every forward after it silently dense.
            raise UserError(
                f"{type(self.method).__name__} decides inside every forward, which vLLM's "
                "compiled model would freeze at warm-up; run it with enforce_eager"
            )
        if self.glued and not hasattr(model, "bwprune_session"):
            raise UserError(
                f"the vLLM model is {type(model).__name__}, not one of the bwprune plugin's "
                "(bwprune.vllm.plugin): is bwprune installed in vLLM's environment?"
            )
        return super().attach(model, adapter)

    @staticmethod
    def mlp_weights(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (gate|up, down) weights: those the plugin kept at load time, else the
        layers' own (random weights of a dummy load, which calls no `load_weights`) while vLLM
        has not packed them away."""
        kept = getattr(model, "bwprune_weights", None)
        if kept is not None:
            return kept
        own = [(layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)
               for layer in model.model.layers]  # fmt: skip
        if any(w.numel() == 0 for pair in own for w in pair):
            raise UserError("vLLM packed the MLP weights before the plugin could keep them "
                            "(a dummy load on CPU): load real weights")  # fmt: skip
        return own

    def place(self, order: torch.Tensor | None) -> None:
        """The next forward's tokens: vLLM's index of each of the method's tokens (None: vLLM
        runs them in the method's order, nothing else)."""
        self._order = order

    def ffns(self, model: nn.Module, adapter=None) -> list[FFNSlot]:
        layers = model.model.layers
        if [s.mlp for s in self.sliced] != [layer.mlp for layer in layers]:
            self.sliced = [SlicedMLP(layer.mlp, *w) for layer, w in
                           zip(layers, self.mlp_weights(model))]  # fmt: skip
        return [FFNSlot(layer, "mlp", layer.mlp.down_proj, s)
                for layer, s in zip(layers, self.sliced)]  # fmt: skip

    def site(self, model: nn.Module, adapter, layer: int, name: str) -> Site:
        decoder = model.model.layers[layer]
        mlp = decoder.mlp
        if name == "gate_act":  # vLLM fuses gate and up: the gate is the first half
            d = self.mlp_weights(model)[layer][1].shape[1]
            return Site(
                mlp.gate_up_proj, "output", F.silu,
                part=lambda out: out[0][..., :d],
                with_part=lambda out, g: (torch.cat([g, out[0][..., d:]], dim=-1), *out[1:]),
            )  # fmt: skip
        return {
            "attn_in": Site(decoder.input_layernorm, "output", None, _first, _with_first),
            "attn_out": Site(decoder.self_attn.o_proj, "input"),
            "mlp_in": Site(decoder.post_attention_layernorm, "output", None, _first, _with_first),
            "mlp_mid": Site(mlp.down_proj, "input"),
        }[name]

    def num_layers(self, model: nn.Module, adapter=None) -> int:
        return len(model.model.layers)

    def tokens(self, ctx: StepContext, valid: torch.Tensor, slots: torch.Tensor | None) -> Tokens:
        return self.padded_tokens(ctx, valid, slots)

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        return x if self._order is None else x[self._order]

    def unflat(self, keep: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        if self._order is None:
            return keep
        full = torch.ones(like.shape, dtype=torch.bool, device=like.device)
        full[self._order] = keep
        return full
