"""vLLM's request length from the run: sized to its prompts and token limit, refused in one line
when the KV cache cannot hold it (before vLLM allocates anything)."""

import pytest

from bwprune.errors import UserError
from bwprune.vllm.running.context import context_length, kv_bytes_per_token

# Qwen2.5-Coder-1.5B's shape: 28 layers, 2 KV heads of 128 dims
QWEN_1P5B = {"num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "hidden_size": 1536, "max_position_embeddings": 32768}  # fmt: skip


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer() -> None:
    assert kv_bytes_per_token(QWEN_1P5B, 4) == 2 * 28 * 2 * 128 * 4
    assert kv_bytes_per_token(QWEN_1P5B, 4, shards=2) == 2 * 28 * 1 * 128 * 4
    # the model's own length needs 1.75 GiB in fp32, more than the default 1 GiB
    assert kv_bytes_per_token(QWEN_1P5B, 4) * 32768 / 2**30 == 1.75


def test_a_run_is_sized_to_its_longest_prompt_and_token_limit() -> None:
    assert context_length(QWEN_1P5B, 4, 1.0, None, 180 + 640, "k") == 820
    assert context_length(QWEN_1P5B, 4, 8.0, None, 10**6, "k") == 32768  # never past the model's


def test_a_server_is_sized_to_what_its_kv_cache_holds() -> None:
    assert context_length(QWEN_1P5B, 4, 1.0, None, None, "serve.kv_cache_gib") == 2**30 // 57344
    assert context_length(QWEN_1P5B, 4, 4.0, None, None, "serve.kv_cache_gib") == 32768


def test_a_length_the_kv_cache_cannot_hold_names_the_setting() -> None:
    with pytest.raises(UserError, match=r"1\.75 GiB .* 32768 tokens .*kv_cache_gib=1 holds 18724"):
        context_length(QWEN_1P5B, 4, 1.0, 32768, None, "generation.vllm.kv_cache_gib")
    with pytest.raises(UserError, match=r"longest prompt plus max_new_tokens.*raise k$"):
        context_length(QWEN_1P5B, 4, 0.01, None, 820, "k")
