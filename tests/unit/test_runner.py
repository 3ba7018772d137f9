"""The batched loop: equals HF generate for dense; per-row stopping; row independence; sampling."""

import pytest
import torch

from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.models.adapters import adapter_for
from tests.conftest import PROMPTS, chat, method_from_conf


def make_runner(model, tok, n=24, **kw):
    dense = method_from_conf("dense")
    return BatchedRunner(model, tok, dense, adapter_for(model), SamplingConfig(n, **kw))


def test_greedy_equals_hf_generate(tiny):
    model, tok = tiny
    prompts = chat(tok, PROMPTS)
    completions, timing = make_runner(model, tok).generate(prompts)
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    ref = model.generate(**enc, do_sample=False, max_new_tokens=24, pad_token_id=tok.pad_token_id)
    ref = ref[:, enc.input_ids.shape[1] :]
    for b, c in enumerate(completions):
        assert c.token_ids == ref[b, : c.new_tokens].tolist()
        if c.finish_reason == "length":
            assert c.new_tokens == 24
    assert timing.decode_tokens == sum(c.new_tokens - 1 for c in completions)
    assert timing.prefill_s > 0 and timing.decode_s > 0


def test_row_output_does_not_depend_on_batch(tiny):
    """Left padding + position ids: a row generates the same tokens alone and in a batch."""
    model, tok = tiny
    prompts = chat(tok, PROMPTS)
    runner = make_runner(model, tok)
    batched, _ = runner.generate(prompts)
    for prompt, together in zip(prompts, batched):
        alone, _ = runner.generate([prompt])
        assert alone[0].token_ids == together.token_ids


def test_stop_token_ends_row_and_is_not_in_text(tiny):
    model, tok = tiny
    runner = make_runner(model, tok)
    runner.stop_ids = torch.arange(300)  # every token stops: one token per row
    completions, timing = runner.generate(chat(tok, PROMPTS[:2]))
    assert [c.new_tokens for c in completions] == [1, 1]
    assert all(c.finish_reason == "stop" and c.text == "" for c in completions)
    assert timing.decode_tokens == 0


def test_sampling_is_seeded():
    from tests.conftest import tiny_model

    model, tok = tiny_model("tiny_llama")
    prompts = chat(tok, PROMPTS)
    kw = dict(do_sample=True, temperature=0.8, top_p=0.9)
    a = [c.token_ids for c in make_runner(model, tok, **kw).generate(prompts)[0]]
    b = [c.token_ids for c in make_runner(model, tok, **kw).generate(prompts)[0]]
    greedy = [c.token_ids for c in make_runner(model, tok).generate(prompts)[0]]
    assert a == b
    assert a != greedy


@pytest.mark.parametrize("top_p", [1e-6])
def test_tiny_top_p_is_greedy(top_p):
    from tests.conftest import tiny_model

    model, tok = tiny_model("tiny_qwen2")
    prompts = chat(tok, PROMPTS)
    sampled = make_runner(model, tok, do_sample=True, temperature=1.0, top_p=top_p)
    greedy = make_runner(model, tok)
    assert [c.token_ids for c in sampled.generate(prompts)[0]] == [
        c.token_ids for c in greedy.generate(prompts)[0]
    ]
