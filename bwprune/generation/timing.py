"""Wall-clock timing of prefill and decode steps without a host sync per step.

On CUDA each mark records an event and the elapsed times are read once, at the end of the batch;
on CPU marks are `perf_counter` readings. Either way the decode loop itself never waits on timing.
"""

from __future__ import annotations

import time

import torch


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
