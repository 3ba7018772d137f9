"""Adapters resolve every layer's modules; unsupported architectures fail with the choices."""

import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from bwprune.errors import UserError
from bwprune.models.adapters import SUPPORTED_MODEL_TYPES, adapter_for


def test_views_are_the_modules_forward_calls(tiny):
    model, tok = tiny
    adapter = adapter_for(model)
    views = [
        m
        for i in range(len(adapter.layers))
        for f, a in [(adapter.ffn(i), adapter.attn(i))]
        for m in (f.gate, f.up, f.down, f.act, a.q, a.k, a.v, a.o)
    ]
    called = set()
    handles = [m.register_forward_hook(lambda mod, *_: called.add(id(mod))) for m in views]
    model(**tok(["hello"], return_tensors="pt"))
    for h in handles:
        h.remove()
    assert {id(m) for m in views} <= called
    assert adapter.ffn(0).d_ff == model.config.intermediate_size
    assert adapter.attn(0).num_kv_heads == model.config.num_key_value_heads


def test_unsupported_architecture_names_type_and_choices():
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(UserError, match="'gpt2'") as e:
        adapter_for(model)
    for t in SUPPORTED_MODEL_TYPES:
        assert t in str(e.value)
