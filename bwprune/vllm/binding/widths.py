"""vLLM's Llama, built layer by layer at each layer's own widths: the model TriSP leaves.

TriSP (`baselines.trisp`) removes whole KV groups and FFN neurons, a different number in every
layer, and records the result in the config it saves (`STRUCTURE_KEY`: per layer the KV-head
count and FFN intermediate size, and whether o_proj/down_proj gained a compensation bias). HF
configs of these families hold one width for all layers, so vLLM's own classes cannot build it.
vLLM's decoder layer takes its config per layer (as its `nemotron_nas` model does), so each layer
here is vLLM's `LlamaDecoderLayer` built from a copy of the config with that layer's widths.

Attention keeps the model's query heads per KV group (TriSP removes groups whole) and its head
size, so only the head counts change. Each layer's KV cache is then as wide as its KV heads: all
layers are full attention with one block size, which vLLM's KV-cache manager puts in one group of
layers with specs of their own sizes (`UniformTypeKVCacheSpecs`), one block table for all — no
padding, no zero heads.

Qwen2 is built the same way: vLLM's Qwen2 layer derives its head size from the head count (wrong
once heads are removed), and its blocks are Llama's with q/k/v biases (`_QKV_BIAS`).

What this does not do: run methods (`bwprune.vllm.binding.plugin` adds that), prune, or check that
the weights match the recorded widths (vLLM's loader refuses a mismatched shape).
"""

from __future__ import annotations

import copy

from torch import nn
from transformers import PretrainedConfig
from vllm.config import VllmConfig
from vllm.model_executor.layers.linear import RowParallelLinear
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from vllm.model_executor.models.utils import extract_layer_index

from bwprune.errors import UserError

# The config attribute holding the per-layer widths; baselines.trisp.prune writes it (same name).
STRUCTURE_KEY = "trisp_structure"

# Whether q/k/v carry biases, per model family: Qwen2's always do, Llama's when configured.
_QKV_BIAS = {
    "llama": lambda c: bool(getattr(c, "attention_bias", False) or getattr(c, "bias", False)),
    "qwen2": lambda c: True,
}


def layer_config(config: PretrainedConfig, i: int) -> PretrainedConfig:
    """A copy of `config` describing layer `i` alone: its KV heads (and their query heads), FFN
    neurons and compensation biases, at the model's head size."""
    if config.model_type not in _QKV_BIAS:
        raise UserError(f"per-layer widths in vLLM: model_type {config.model_type!r} is not "
                        f"supported; choose one of {sorted(_QKV_BIAS)}")  # fmt: skip
    s = getattr(config, STRUCTURE_KEY)
    rep = config.num_attention_heads // config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    out = copy.deepcopy(config)
    out.head_dim = head_dim
    out.num_key_value_heads = s["num_kv_heads"][i]
    out.num_attention_heads = rep * s["num_kv_heads"][i]
    out.intermediate_size = s["intermediate_size"][i]
    # LlamaDecoderLayer: o_proj's bias follows `attention_bias`, q/k/v's follow `qkv_bias`
    out.qkv_bias = _QKV_BIAS[config.model_type](config)
    out.attention_bias = bool(s["o_proj_bias"])
    return out


class WidthsDecoderLayer(LlamaDecoderLayer):
    """vLLM's Llama decoder layer at the widths `STRUCTURE_KEY` records for its index."""

    def __init__(self, vllm_config: VllmConfig, prefix: str = "", **_) -> None:
        config = vllm_config.model_config.hf_config
        own = layer_config(config, extract_layer_index(prefix))
        super().__init__(vllm_config, prefix, config=own)
        if getattr(config, STRUCTURE_KEY)["down_proj_bias"] and not getattr(own, "mlp_bias", 0):
            # bias compensation gives down_proj a bias and leaves gate/up without one, which
            # LlamaMLP's one `bias` flag cannot build
            self.mlp.down_proj = RowParallelLinear(
                input_size=own.intermediate_size, output_size=own.hidden_size, bias=True,
                quant_config=self.get_quant_config(vllm_config), prefix=f"{prefix}.mlp.down_proj",
            )  # fmt: skip


class WidthsForCausalLM(LlamaForCausalLM):
    """A Llama or Qwen2 whose layers have the widths of the config's `STRUCTURE_KEY`."""

    def _init_model(self, vllm_config: VllmConfig, prefix: str = "", **_) -> nn.Module:
        if not hasattr(vllm_config.model_config.hf_config, STRUCTURE_KEY):
            raise UserError(f"{type(self).__name__} builds a model whose config records "
                            f"{STRUCTURE_KEY!r} (TriSP's pruned model); this one has "
                            "none")  # fmt: skip
        return LlamaModel(vllm_config=vllm_config, prefix=prefix, layer_type=WidthsDecoderLayer)
