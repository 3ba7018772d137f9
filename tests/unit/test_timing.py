"""Timing (bwprune/generation/timing.py): the alternation every paired comparison uses, and step
intervals read without a sync per step."""

import torch

from bwprune.generation.timing import StepTimer, alternate


def test_alternation_reverses_the_order_every_repeat_and_drops_warm_up():
    calls: list[str] = []
    counter = iter(range(100))

    def trial(label):
        return lambda: calls.append(label) or next(counter)

    repeats: list[int] = []
    results = alternate({"a": trial("a"), "b": trial("b")}, repeats=3, warmup=1,
                        after_repeat=repeats.append)  # fmt: skip
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]  # A B, B A, ... so drift hits both
    assert results == {"a": [3, 4, 7], "b": [2, 5, 6]}  # the warm-up pair (0, 1) is dropped
    assert repeats == [0, 1, 2, 3]


def test_cpu_step_timer_gives_one_interval_between_consecutive_marks():
    timer = StepTimer(torch.device("cpu"))
    for _ in range(4):
        timer.mark()
    intervals = timer.intervals_s()
    assert len(intervals) == 3 and all(s >= 0 for s in intervals)
