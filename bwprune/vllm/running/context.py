"""How long a request may be in vLLM (`max_model_len`): from the run, not from the model.

vLLM refuses to start when its KV cache cannot hold one request of `max_model_len` tokens, and a
model's own length (32768 for Qwen2.5) needs 1.75 GiB of fp32 KV cache at 1.5B on a CPU where
`kv_cache_gib` is 1. A run knows its longest prompt and its token limit, so the engine is sized to
those; a server, which does not, to what its KV cache holds. A length that still does not fit is
one line naming the setting to change, before vLLM allocates anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bwprune.errors import UserError


def _getter(config: Mapping | Any):
    """Read a field of an HF config object or of its dict alike (None when absent)."""
    return config.get if isinstance(config, Mapping) else lambda k: getattr(config, k, None)


def kv_bytes_per_token(config: Mapping | Any, dtype_bytes: int, shards: int = 1) -> int:
    """Bytes of K and V one token holds across every layer (an HF config object or its dict), on
    one of `shards` tensor-parallel workers (each holds its share of the KV heads, at least one)."""
    get = _getter(config)
    heads = get("num_attention_heads")
    head_dim = get("head_dim") or get("hidden_size") // heads
    kv_heads = max(1, (get("num_key_value_heads") or heads) // shards)
    return 2 * get("num_hidden_layers") * kv_heads * head_dim * dtype_bytes


def context_length(config: Mapping | Any, dtype_bytes: int, kv_cache_gib: float,
                   requested: int | None, needed: int | None, setting: str,
                   shards: int = 1) -> int:  # fmt: skip
    """`requested` (`generation.vllm.max_model_len`) when set; else `needed` (longest prompt plus
    `max_new_tokens`) when known, else what `kv_cache_gib` holds (per worker, of `shards`); never
    past the model's own. `setting`: the config key of the KV cache's size, named in the error."""
    get = _getter(config)
    own = int(get("max_position_embeddings"))
    per_token = kv_bytes_per_token(config, dtype_bytes, shards)
    holds = int(kv_cache_gib * 2**30) // per_token
    length = requested or min(own, needed if needed else holds)
    if length > holds:
        why = ("generation.vllm.max_model_len" if requested
               else "the longest prompt plus max_new_tokens")  # fmt: skip
        raise UserError(
            f"vLLM needs {length * per_token / 2**30:.2f} GiB of KV cache for one request of "
            f"{length} tokens ({why}), but {setting}={kv_cache_gib:g} holds {holds} tokens; "
            f"raise {setting}"
        )
    return length
