"""Physical removal of KV groups and neurons (paper B §3 step 3), FLAP bias compensation, and
saving / reloading the resulting heterogeneous model.

A pruned layer gets new, smaller `nn.Linear` modules: q/k/v lose the rows of the removed groups'
heads, o_proj the matching input columns; gate/up lose the removed neurons' rows, down_proj their
columns. HF attention reshapes with `-1` heads and removing whole KV groups keeps
`num_key_value_groups`, so the stock modules run (and fill the KV cache) unchanged. Bias
compensation (FLAP `compress`) adds W_out[:, pruned] · μ[pruned] to the o_proj/down_proj output
bias: the mean contribution of the removed channels over the calibration tokens.

The per-layer shapes are recorded in `config.trisp_structure`, which `save_pretrained` writes with
the config; `load_pruned` rebuilds those shapes before loading the weights (HF configs of these
families hold one head count and one intermediate size for all layers).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerBase

from bwprune.errors import UserError
from bwprune.models.adapters import ModelAdapter, adapter_for

STRUCTURE_KEY = "trisp_structure"


def _linear(
    weight: torch.Tensor, bias: torch.Tensor | None, requires_grad: bool = False
) -> nn.Linear:
    """A Linear holding copies of `weight` (d_out, d_in) and `bias`, on their device and dtype."""
    out_f, in_f = weight.shape
    m = nn.utils.skip_init(
        nn.Linear, in_f, out_f, bias=bias is not None, device=weight.device, dtype=weight.dtype
    )
    with torch.no_grad():
        m.weight.copy_(weight)
        if bias is not None:
            m.bias.copy_(bias)
    return m.requires_grad_(requires_grad)


def _rows(m: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    bias = None if m.bias is None else m.bias[rows]
    return _linear(m.weight[rows], bias, m.weight.requires_grad)


def _cols(m: nn.Linear, keep: torch.Tensor, mean: torch.Tensor | None) -> nn.Linear:
    """Keep input columns `keep`; with `mean` (μ of the inputs), add W[:, pruned]·μ[pruned] to the
    bias."""
    bias = m.bias
    if mean is not None:
        pruned = torch.ones(m.in_features, dtype=torch.bool, device=keep.device)
        pruned[keep] = False
        shift = m.weight[:, pruned].float() @ mean[pruned].float()
        bias = shift if bias is None else bias.float() + shift
        bias = bias.to(m.weight.dtype)
    return _linear(m.weight[:, keep], bias, m.weight.requires_grad)


def _head_rows(groups: torch.Tensor, width: int) -> torch.Tensor:
    """Rows (or columns) of units `groups` that are `width` contiguous rows each."""
    return (groups[:, None] * width + torch.arange(width, device=groups.device)).flatten()


@torch.no_grad()
def prune_layer(
    adapter: ModelAdapter,
    i: int,
    kv_groups: torch.Tensor,
    neurons: torch.Tensor,
    attn_mean: torch.Tensor | None = None,
    mlp_mean: torch.Tensor | None = None,
) -> None:
    """Keep KV groups `kv_groups` and MLP neurons `neurons` of layer `i` (indices in the original
    layer); with means, compensate the removed channels by an output bias."""
    a, f = adapter.attn(i), adapter.ffn(i)
    rep = a.num_heads // a.num_kv_heads
    device = a.q.weight.device
    kv_groups, neurons = kv_groups.to(device), neurons.to(device)
    q_rows, kv_rows = _head_rows(kv_groups, rep * a.head_dim), _head_rows(kv_groups, a.head_dim)
    attn = adapter.layers[i].self_attn
    attn.q_proj, attn.k_proj = _rows(a.q, q_rows), _rows(a.k, kv_rows)
    attn.v_proj = _rows(a.v, kv_rows)
    attn.o_proj = _cols(a.o, q_rows, attn_mean)
    mlp = f.mlp
    mlp.gate_proj, mlp.up_proj = _rows(f.gate, neurons), _rows(f.up, neurons)
    mlp.down_proj = _cols(f.down, neurons, mlp_mean)
    mlp.intermediate_size = len(neurons)


def record_structure(model: nn.Module, adapter: ModelAdapter) -> dict:
    """Write the per-layer shapes into `model.config.trisp_structure` (saved with the config)."""
    attns = [adapter.attn(i) for i in range(len(adapter.layers))]
    structure = {
        "num_kv_heads": [a.k.out_features // a.head_dim for a in attns],
        "intermediate_size": [f.d_ff for f in adapter.ffns()],
        "o_proj_bias": attns[0].o.bias is not None,
        "down_proj_bias": adapter.ffn(0).down.bias is not None,
    }
    setattr(model.config, STRUCTURE_KEY, structure)
    return structure


def _empty_like(m: nn.Linear, in_f: int, out_f: int, bias: bool) -> nn.Linear:
    return nn.utils.skip_init(
        nn.Linear, in_f, out_f, bias=bias, device=m.weight.device, dtype=m.weight.dtype
    )


def apply_structure(adapter: ModelAdapter, structure: dict) -> None:
    """Give a freshly built model the recorded per-layer shapes (weights uninitialised)."""
    for i in range(len(adapter.layers)):
        a, f = adapter.attn(i), adapter.ffn(i)
        rep = a.num_heads // a.num_kv_heads
        kv = structure["num_kv_heads"][i] * a.head_dim
        d, n = a.q.in_features, structure["intermediate_size"][i]
        attn = adapter.layers[i].self_attn
        attn.q_proj = _empty_like(a.q, d, rep * kv, a.q.bias is not None)
        attn.k_proj = _empty_like(a.k, d, kv, a.k.bias is not None)
        attn.v_proj = _empty_like(a.v, d, kv, a.v.bias is not None)
        attn.o_proj = _empty_like(a.o, rep * kv, d, structure["o_proj_bias"])
        f.mlp.gate_proj = _empty_like(f.gate, d, n, f.gate.bias is not None)
        f.mlp.up_proj = _empty_like(f.up, d, n, f.up.bias is not None)
        f.mlp.down_proj = _empty_like(f.down, n, d, structure["down_proj_bias"])
        f.mlp.intermediate_size = n


def save_pruned(
    model: nn.Module, path: str | Path, tokenizer: PreTrainedTokenizerBase | None = None
) -> None:
    """`save_pretrained` (config with its `trisp_structure`, safetensors) and the tokenizer."""
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def load_pruned(path: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """A model saved by `save_pruned`, in eval mode without gradients."""
    path = Path(path)
    config = AutoConfig.from_pretrained(path)
    structure = getattr(config, STRUCTURE_KEY, None)
    if structure is None:
        raise UserError(f"{str(path)!r} holds no TriSP-pruned model (no {STRUCTURE_KEY} in config)")
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    apply_structure(adapter_for(model), structure)
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(path.glob("*.safetensors")):
        state.update(load_file(shard, device=str(device)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = sorted(set(missing) - tied)
    if unexpected or missing:
        raise UserError(
            f"{path}: weights do not match the recorded structure "
            f"(missing {missing}, unexpected {sorted(unexpected)})"
        )
    return model.eval().requires_grad_(False)
