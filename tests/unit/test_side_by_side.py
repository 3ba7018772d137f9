"""A generation's first kept sets fill the layers side by side, on threads that each run torch on
one thread (`bwprune.methods.side_by_side`), with the same weights as one thread writes."""

import threading

import pytest
import torch

from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.methods import side_by_side
from bwprune.models.adapters import adapter_for
from tests.conftest import PROMPTS, chat, method_from_conf, prepared


def test_each_keeps_the_order_and_the_callers_inference_mode():
    """Results come back in order, computed off the calling thread; an inference tensor (what a
    vLLM forward makes) can be updated in place, as in the caller's inference mode."""
    with torch.inference_mode():
        counts = [torch.zeros(1) for _ in range(6)]
    where = set()

    def bump(i: int) -> int:
        where.add(threading.get_ident())
        counts[i].add_(i)
        return i * i

    with torch.inference_mode():
        assert side_by_side.each(bump, range(6), threads=2) == [i * i for i in range(6)]
        assert threading.get_ident() not in where
        assert side_by_side.each(bump, [3], threads=2) == [9]  # one item: the calling thread
    assert [int(c) for c in counts] == [0, 1, 2, 6, 4, 5]
    assert threading.get_ident() in where


def test_each_raises_what_a_thread_raised():
    def fail(i: int) -> int:
        raise ValueError(f"layer {i}")

    with pytest.raises(ValueError, match="layer 0"):
        side_by_side.each(fail, range(3), threads=2)


def test_a_generations_first_kept_sets_fill_side_by_side_and_the_same_as_one_thread(
    tiny, monkeypatch
):
    """ours' first refresh of a generation fills every layer afresh, dealt to the caller's torch
    threads; later refreshes move neurons on one. The tokens are those of a fill on one thread."""
    model, tok = tiny
    method = method_from_conf("ours", sparsity=0.5, t_init=4, t_explore=2, t_prune=3)
    prepared(method, model, tok)
    runner = BatchedRunner(model, tok, method, adapter_for(model),
                           SamplingConfig(12, ignore_eos=True))  # fmt: skip
    ids, attn = runner.encode(chat(tok, PROMPTS))
    real, calls, outs = side_by_side.each, [], {}

    def spy(fn, items, threads):
        calls.append(threads)
        return real(fn, items, threads if dealt else 1)

    threads = torch.get_num_threads()
    monkeypatch.setattr(side_by_side, "each", spy)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # as on this 2-core machine
    try:
        for dealt in (False, True):
            calls.clear()
            outs[dealt] = runner.generate_tokens(ids, attn)[0]
            assert calls == [2, 1, 1]  # a fill, then two refreshes
    finally:
        torch.set_num_threads(threads)
    assert outs[True] == outs[False]
