"""Zero heads appended so that vLLM can split a model's attention
(`bwprune/vllm/binding/padding.py`): the fewest whole groups that make the heads split, and a padded
model whose outputs are the original's."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from bwprune.vllm.binding.padding import Heads, pad_heads


@pytest.mark.parametrize(
    ("heads", "size", "hidden", "padded"),
    [
        (Heads(9, 3), 2, 576, Heads(12, 4)),  # SmolLM2-135M: one more group of 3
        (Heads(9, 3), 3, 576, Heads(9, 3)),  # splits already
        (Heads(3, 3), 2, 576, Heads(4, 4)),  # one head per KV head
        (Heads(3, 1), 2, 576, Heads(6, 2)),  # one KV head shared by all: a second group
        (Heads(6, 2), 4, 576, Heads(12, 4)),
        (Heads(3, 3), 2, 90, Heads(6, 6)),  # 4 heads would not divide the width (transformers)
        (Heads(3, 3), 2, 3, None),  # nothing divides it
    ],
)
def test_the_fewest_whole_groups_make_the_heads_split(heads, size, hidden, padded):
    assert heads.padded(size, hidden) == padded
    if padded is not None:
        assert padded.split(size) and padded.query // padded.kv == heads.query // heads.kv


@pytest.mark.parametrize(("query", "kv"), [(3, 1), (3, 3), (6, 2)])
def test_a_padded_model_computes_the_originals_outputs(query, kv):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=96, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=query, num_key_value_heads=kv, head_dim=16,
                         vocab_size=100, attn_implementation="eager")  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    to = Heads(query, kv).padded(4, config.hidden_size)
    state, padded_config = pad_heads(model.state_dict(), model.config, to)
    assert Heads.of(model.config) == Heads(query, kv)  # the model's own config is not touched
    padded = LlamaForCausalLM(padded_config).eval()
    padded.load_state_dict(state)
    assert Heads.of(padded.config) == to and to != Heads(query, kv)
    ids = torch.randint(0, 100, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(padded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)
