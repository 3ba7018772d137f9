"""TriSP's LoRA recovery on a tiny pruned model: training moves the output, merging keeps it."""

from __future__ import annotations

import copy

import torch
from torch import nn

from baselines.trisp.lora import LoraSettings, merge_lora, train_lora
from baselines.trisp.prune import prune_layer
from bwprune.models.adapters import adapter_for
from tests.conftest import tiny_model


def test_merged_lora_equals_unmerged_and_is_the_same_model():
    """On a pruned model with different shapes per layer, as TriSP trains it."""
    model, _ = tiny_model("tiny_llama")
    model = copy.deepcopy(model)
    adapter = adapter_for(model)
    prune_layer(adapter, 0, torch.tensor([1]), torch.arange(0, 128, 2))
    prune_layer(adapter, 1, torch.tensor([0, 1]), torch.arange(100))
    windows = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(0))
    ids = windows[:2]
    with torch.no_grad():
        before = model(input_ids=ids).logits
    peft_model = train_lora(model, windows, LoraSettings(rank=4, alpha=8, steps=3, lr=1e-2))
    with torch.no_grad():
        unmerged = peft_model(input_ids=ids).logits
    assert not torch.allclose(unmerged, before, atol=1e-3)  # the adapters learned something
    merged_model = merge_lora(peft_model)
    assert merged_model is model
    assert all(
        type(m) is nn.Linear for i in range(2) for m in (adapter.attn(i).q, adapter.ffn(i).down)
    )
    assert not any(p.requires_grad for p in merged_model.parameters())
    with torch.no_grad():
        merged = merged_model(input_ids=ids).logits
    torch.testing.assert_close(merged, unmerged, atol=1e-4, rtol=1e-4)
