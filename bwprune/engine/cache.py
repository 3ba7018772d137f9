"""KV caches for the decode loop: a static one preallocated per shape, or HF's growing one.

`static` (the default) allocates keys/values for `rows × length` once and writes each step in
place, so a decode step allocates nothing and copies no old entries, and a compiled step sees the
same tensors at the same addresses every step. Lengths are rounded up to `LENGTH_BUCKET` and
caches are pooled by shape, so batches of the same size reuse one cache (and one compiled graph)
whatever their prompt lengths. The attention mask is a fixed (rows, length) buffer filled as
tokens are written. `dynamic` is HF's `DynamicCache` (grows by concatenation): the reference.

Rows leave by `copy_rows`: live rows are copied into the pooled cache of the smaller shape (see
`bwprune.engine.rows`), so compaction also allocates nothing once every shape has been seen.

Continuous batching (`bwprune.generation.stream`) keeps one write column for all rows, as HF's
static cache does, and gives each row its own span of columns: a row entering a slot has its
prompt's keys/values `place`d just before the write column (its own positions are in the keys
already: RoPE is applied before caching), and when the write column reaches the end, `rebase`
moves every column left past the ones no live row uses any more.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from transformers import DynamicCache, StaticCache

from bwprune.errors import choices_error

KINDS = ("static", "dynamic")
LENGTH_BUCKET = 128  # static lengths are multiples of this: few shapes, little waste


def cache_keyword(model: nn.Module) -> str:
    """The forward's name for the KV cache: `cache` from transformers 5.20, `past_key_values`
    before (the GPU check runs where only transformers 5.17 is installed)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class SlotCache:
    """The KV cache and attention mask of `rows` rows of at most `length` tokens each."""

    def __init__(self, model: nn.Module, kind: str, rows: int, length: int) -> None:
        """Made by `CachePool`, which checks `kind`."""
        self.kind, self.rows, self.length = kind, rows, length
        device = next(model.parameters()).device
        if kind == "static":
            self.cache = StaticCache(config=model.config, max_cache_len=length)
        else:
            self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(rows, length, dtype=torch.long, device=device)
        self.used = 0  # positions written so far (the same for every row: left padding)
        self._config = model.config
        self.keyword = cache_keyword(model)

    def inputs(self) -> dict:
        """The cache as the model's forward takes it."""
        return {self.keyword: self.cache, "use_cache": True}

    def start(self, attn: torch.Tensor) -> torch.Tensor:
        """A new batch whose prompts have (rows, T) attention mask `attn`; returns the prefill's
        mask. The static cache is cleared in place (its tensors keep their addresses)."""
        if self.kind == "static":
            self.cache.reset()
        else:
            self.cache = DynamicCache(config=self._config)
        self.mask.zero_()
        t = attn.shape[1]
        self.mask[:, :t] = attn
        self.used = t
        return attn

    def advance(self) -> torch.Tensor:
        """One more position for every row; the mask the decode step attends with."""
        self.mask[:, self.used] = 1
        self.used += 1
        return self.mask if self.kind == "static" else self.mask[:, : self.used]

    def copy_rows(self, source: SlotCache, rows: torch.Tensor) -> None:
        """Become `source` restricted to its rows `rows` (len(rows) == self.rows)."""
        self.mask.copy_(source.mask[rows])
        self.used = source.used
        if self.kind == "dynamic":
            self.cache = source.cache
            self.cache.batch_select_indices(rows)
            return
        for dst, layer in zip(self.cache.layers, source.cache.layers):
            if not dst.is_initialized:  # allocate once, as the first update would
                k, v = layer.keys, layer.values
                empty_k = k.new_empty(self.rows, k.shape[1], 0, k.shape[3])
                dst.lazy_initialization(empty_k, v.new_empty(self.rows, v.shape[1], 0, v.shape[3]))
            dst.keys.copy_(layer.keys[rows])
            dst.values.copy_(layer.values[rows])
            dst.cumulative_length.copy_(layer.cumulative_length)

    def place(self, slots: torch.Tensor, source: SlotCache) -> None:
        """Rows entering `slots` (continuous batching): `source` holds just their prompts,
        `source.used` columns wide, left-padded; they take this cache's last `source.used`
        columns before the write position, and nothing else of those slots stays visible."""
        width = source.used
        if self.kind != "static" or width > self.used:
            raise ValueError(f"{width} columns do not fit before column {self.used} ({self.kind})")
        columns = slice(self.used - width, self.used)
        self.mask[slots] = 0
        self.mask[slots, columns] = source.mask[:, :width]
        for dst, src in zip(self.cache.layers, source.cache.layers):
            dst.keys[slots, :, columns] = src.keys[:, :, :width]
            dst.values[slots, :, columns] = src.values[:, :, :width]

    def rebase(self, shift: int) -> None:
        """Move every column `shift` to the left, the first `shift` dropped (no live row uses
        them): the write position goes back by `shift`. One copy of the cache, made once in many
        steps (`bwprune.generation.stream` sizes the cache so), which is what one attention step
        reads anyway."""
        n = self.used - shift
        self.mask[:, :n] = self.mask[:, shift : self.used].clone()
        self.mask[:, n:] = 0
        for layer in self.cache.layers:
            layer.keys[:, :, :n] = layer.keys[:, :, shift : self.used].clone()
            layer.values[:, :, :n] = layer.values[:, :, shift : self.used].clone()
            layer.cumulative_length.sub_(shift)
        self.used = n


class CachePool:
    """One `SlotCache` per (rows, bucketed length), reused across batches."""

    def __init__(self, model: nn.Module, kind: str) -> None:
        if kind not in KINDS:
            raise choices_error("generation.kv_cache", kind, KINDS)
        self.model, self.kind = model, kind
        self._caches: dict[tuple[int, int], SlotCache] = {}

    def get(self, rows: int, tokens: int) -> SlotCache:
        """A cache for `rows` rows of at least `tokens` positions."""
        if self.kind == "dynamic":
            return SlotCache(self.model, self.kind, rows, tokens)
        length = -(-tokens // LENGTH_BUCKET) * LENGTH_BUCKET
        key = (rows, length)
        if key not in self._caches:
            self._caches[key] = SlotCache(self.model, self.kind, rows, length)
        return self._caches[key]
