"""KV caches (bwprune/engine/cache.py): pooled by bucketed shape, and the column bookkeeping that
compaction (`copy_rows`) and continuous batching (`place`, `rebase`) rely on."""

import pytest
import torch

from bwprune.engine.cache import LENGTH_BUCKET, CachePool, SlotCache
from bwprune.errors import UserError
from tests.conftest import tiny_model


def prefilled(kind: str, rows: int = 2, length: int = 16, prompt: int = 5) -> SlotCache:
    """A cache after the prefill of `rows` random prompts; row 1 has 2 columns of padding."""
    model, _ = tiny_model("tiny_llama")
    cache = SlotCache(model, kind, rows, length)
    ids = torch.randint(3, 100, (rows, prompt))
    attn = torch.ones_like(ids)
    attn[1, :2] = 0
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    model(input_ids=ids, attention_mask=cache.start(attn), position_ids=positions,
          **cache.inputs())  # fmt: skip
    return cache


def keys(cache: SlotCache) -> list[torch.Tensor]:
    return [layer.keys.clone() for layer in cache.cache.layers]


def test_static_caches_are_pooled_by_rows_and_bucketed_length():
    model, _ = tiny_model("tiny_llama")
    pool = CachePool(model, "static")
    assert pool.get(2, 5) is pool.get(2, LENGTH_BUCKET)  # any prompt length in one bucket
    assert pool.get(2, LENGTH_BUCKET + 1).length == 2 * LENGTH_BUCKET
    assert pool.get(3, 5) is not pool.get(2, 5)
    dynamic = CachePool(model, "dynamic")
    assert dynamic.get(2, 5) is not dynamic.get(2, 5) and dynamic.get(2, 5).length == 5
    with pytest.raises(UserError, match=r"kv_cache='paged'.*\['dynamic', 'static'\]"):
        CachePool(model, "paged")


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_each_step_adds_one_visible_column_to_every_row(kind):
    cache = prefilled(kind)
    assert cache.used == 5 and cache.mask[1].tolist()[:5] == [0, 0, 1, 1, 1]
    mask = cache.advance()
    assert cache.used == 6 and cache.mask[:, 5].tolist() == [1, 1]
    assert mask.shape == ((2, 16) if kind == "static" else (2, 6))  # static: a fixed buffer


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_copy_rows_keeps_exactly_the_chosen_rows(kind):
    source = prefilled(kind, rows=3)
    before, mask = keys(source), source.mask.clone()
    model, _ = tiny_model("tiny_llama")
    target = SlotCache(model, kind, 2, 16)
    target.copy_rows(source, torch.tensor([0, 2]))
    assert target.used == 5 and torch.equal(target.mask, mask[[0, 2]])
    for got, old in zip(keys(target), before):
        torch.testing.assert_close(got[:, :, :5], old[[0, 2], :, :5], rtol=0, atol=0)


def test_place_puts_prompts_just_before_the_write_column_of_their_slots_only():
    cache = prefilled("static", rows=3)
    for _ in range(4):
        cache.advance()  # write column 9
    others, mask = keys(cache), cache.mask.clone()
    source = prefilled("static", rows=2, prompt=3)
    cache.place(torch.tensor([2, 0]), source)
    assert torch.equal(cache.mask[1], mask[1])  # the slot that stays keeps its columns
    assert cache.mask[2].tolist()[:9] == [0] * 6 + [1, 1, 1]
    assert cache.mask[0].tolist()[:9] == [0] * 6 + [0, 0, 1]  # its prompt's padding stays hidden
    for layer, src, old in zip(cache.cache.layers, source.cache.layers, others):
        assert torch.equal(layer.keys[[2, 0], :, 6:9], src.keys[:, :, :3])
        assert torch.equal(layer.keys[1], old[1])
    with pytest.raises(ValueError, match="do not fit"):
        cache.place(torch.tensor([0]), prefilled("static", rows=2, prompt=12))


def test_rebase_moves_every_column_left_and_the_write_position_back():
    cache = prefilled("static")
    for _ in range(3):
        cache.advance()
    before, mask = keys(cache), cache.mask.clone()
    lengths = [layer.cumulative_length.clone() for layer in cache.cache.layers]
    cache.rebase(2)
    assert cache.used == 6
    assert torch.equal(cache.mask[:, :6], mask[:, 2:8]) and not cache.mask[:, 6:].any()
    for layer, old, n in zip(cache.cache.layers, before, lengths):
        assert torch.equal(layer.keys[:, :, :6], old[:, :, 2:8])
        assert torch.equal(layer.cumulative_length, n - 2)
