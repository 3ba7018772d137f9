"""Wall-clock timing of prefill and decode steps without a host sync per step, and the
alternation every comparison of timings uses.

On CUDA each mark records an event and the elapsed times are read once, at the end of the batch;
on CPU marks are `perf_counter` readings. Either way the decode loop itself never waits on timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

T = TypeVar("T")


class StepTimer:
    """`mark()` before the first step and after every step; `intervals_s()` gives durations."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append(event)
        else:
            self._marks.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._marks, self._marks[1:])]
        return [b - a for a, b in zip(self._marks, self._marks[1:])]


def alternate(
    trials: Mapping[str, Callable[[], T]],
    repeats: int,
    warmup: int,
    after_repeat: Callable[[int], None] = lambda _: None,
) -> dict[str, list[T]]:
    """Run every trial `warmup + repeats` times, reversing their order every repeat (A B, B A, ...)
    so drift (heat, other load) hits them alike; returns each trial's results after warm-up.

    The one alternation of the speed benchmark and of a run's paired timing."""
    order = list(trials)
    results: dict[str, list[T]] = {label: [] for label in order}
    for rep in range(warmup + repeats):
        for label in order if rep % 2 == 0 else order[::-1]:
            result = trials[label]()
            if rep >= warmup:
                results[label].append(result)
        after_repeat(rep)
    return results
