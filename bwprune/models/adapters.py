"""Architecture adapters: where "layer i's MLP" and "layer i's attention" live in each model family.

Methods reach modules only through these views, so supporting a new family means adding it here,
not touching any method. This module does not change the model; `hooks.py` and `sliced_mlp.py` do.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from bwprune.errors import UserError

# Families whose decoder layers hold `mlp.{gate,up,down}_proj` + `mlp.act_fn` (gated MLP, Eq. 1)
# and `self_attn.{q,k,v,o}_proj`.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def check_model_type(model_type: str | None) -> None:
    """Raise a `UserError` naming `model_type` and the supported ones, before any weight loads."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(
            f"model type {model_type!r} is not supported; supported types: "
            f"{list(SUPPORTED_MODEL_TYPES)} (gated MLP with gate/up/down projections)"
        )


@dataclass(frozen=True)
class FFNView:
    """Layer `index`'s gated MLP: y = down(act(gate(x)) * up(x)); `d_ff` = intermediate size."""

    index: int
    layer: nn.Module  # the decoder layer; its `mlp` attribute is what `SlicedMLP` swaps
    mlp: nn.Module
    gate: nn.Linear
    up: nn.Linear
    down: nn.Linear
    act: nn.Module
    norm: nn.Module  # post_attention_layernorm: its output is what gate and up read

    @property
    def d_ff(self) -> int:
        return self.gate.out_features

    @property
    def num_params(self) -> int:
        """Weights (and biases) of gate, up and down."""
        return sum(p.numel() for m in (self.gate, self.up, self.down) for p in m.parameters())


@dataclass(frozen=True)
class AttnView:
    """Layer `index`'s attention projections and head layout (GQA: num_kv_heads <= num_heads)."""

    index: int
    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    num_heads: int
    num_kv_heads: int
    head_dim: int
    norm: nn.Module  # input_layernorm: its output is what q, k and v read


class ModelAdapter:
    """Per-layer views of a decoder-only causal LM with gated MLPs."""

    def __init__(self, model: nn.Module) -> None:
        check_model_type(getattr(model.config, "model_type", None))
        self.model = model
        self.layers: list[nn.Module] = list(model.model.layers)
        config = model.config
        self._num_heads = config.num_attention_heads
        self._num_kv_heads = getattr(config, "num_key_value_heads", None) or self._num_heads
        self._head_dim = getattr(config, "head_dim", None) or config.hidden_size // self._num_heads

    def ffn(self, i: int) -> FFNView:
        layer = self.layers[i]
        mlp = layer.mlp
        return FFNView(i, layer, mlp, mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn,
                       layer.post_attention_layernorm)  # fmt: skip

    def ffns(self) -> list[FFNView]:
        return [self.ffn(i) for i in range(len(self.layers))]

    def attn(self, i: int) -> AttnView:
        a = self.layers[i].self_attn
        return AttnView(
            i, a.q_proj, a.k_proj, a.v_proj, a.o_proj,
            self._num_heads, self._num_kv_heads, self._head_dim, self.layers[i].input_layernorm,
        )  # fmt: skip

    def num_params(self) -> int:
        """All parameters of the model, tied embeddings counted once."""
        return sum(p.numel() for p in self.model.parameters())


def adapter_for(model: nn.Module) -> ModelAdapter:
    """The adapter for `model`, or a `UserError` listing the supported model types."""
    return ModelAdapter(model)
