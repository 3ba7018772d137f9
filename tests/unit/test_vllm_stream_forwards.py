"""How a vLLM stream reads a forward (`ForwardBatch`): prompts entering, decode steps, and
requests vLLM preempted coming back, with prefix caching on or off."""

from __future__ import annotations

import pytest

from bwprune.vllm.binding.session import ForwardBatch


def forward(*requests: tuple[str, int, int, int]) -> ForwardBatch:
    """Requests as (id, tokens computed before, tokens scheduled now, prompt length)."""
    starts = [0]
    for _, _, scheduled, _ in requests:
        starts.append(starts[-1] + scheduled)
    return ForwardBatch([r for r, *_ in requests], starts, [c for _, c, _, _ in requests],
                        [p for *_, p in requests], starts[-1])  # fmt: skip


SEATED = ["a", "b", None, None]
RAN = {"a": 140, "b": 131}  # tokens each seated request had computed after its last forward


@pytest.mark.parametrize(
    ("batch", "entering", "decode"),
    [
        (forward(("c", 0, 90, 90), ("d", 0, 12, 12)), True, False),  # new prompts, whole
        (forward(("a", 140, 1, 108), ("b", 131, 1, 100)), False, True),  # a decode step
        (forward(("a", 0, 140, 108), ("c", 0, 90, 90)), True, False),  # preempted, recomputed
        # prefix caching (methods that do not decide per forward): past a cached prefix
        (forward(("a", 128, 12, 108)), True, False),
        (forward(("c", 0, 90, 90), ("a", 128, 12, 108)), True, False),
        # every token but the last still cached: a decode step alone, a re-entry among new ones
        (forward(("a", 140, 1, 108)), False, True),
        (forward(("c", 0, 90, 90), ("a", 140, 1, 108)), True, False),
        (forward(("a", 140, 1, 108), ("b", 0, 131, 100)), True, False),  # ... or resumed ones
        (forward(("c", 0, 40, 90)), False, False),  # a chunk of a prompt: neither
    ],
)
def test_a_stream_tells_entering_prompts_from_decode_steps(batch, entering, decode):
    assert batch.entering(SEATED, RAN) is entering
    assert batch.decode is decode
