"""Wall-clock timing of prefill and decode steps without a host sync per step, and the
alternation every comparison of timings uses.

On CUDA each mark records an event and the elapsed times are read once, at the end of the batch;
on CPU marks are `perf_counter` readings. Either way the decode loop itself never waits on timing.
`alternate` runs a fixed number of repeats; `alternate_until` adds pairs until the ratios it is
asked about are pinned down to a target precision (or a cap or a time budget stops it), because
on a shared machine a fixed three trials cannot tell noise from an effect of a few percent.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from bwprune.runs import interference
from bwprune.runs.speedup import relative_half_width

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
    results: dict[str, list[T]] = {label: [] for label in trials}
    for rep, row in zip(range(warmup + repeats), _alternation(trials)):
        if rep >= warmup:
            for label, result in row.items():
                results[label].append(result)
        after_repeat(rep)
    return results


@dataclass(frozen=True)
class Precision:
    """When `alternate_until` stops (conf/config.yaml `speed`, conf/bench/default.yaml)."""

    min_pairs: int  # timed repeats at least, whatever the interval says
    max_pairs: int  # ... and at most
    half_width: float  # target: every interval within this fraction of its median (0.03: ±3 %)
    confidence: float  # of the intervals (`bwprune.runs.speedup.median_interval`)
    budget_s: float  # no repeat starts after this many seconds (warm-up included)

    @classmethod
    def from_config(cls, node: Mapping) -> Precision:
        """From a config node with `repeats` (the minimum), `max_repeats`, `half_width`,
        `confidence` and `budget_s`: a run's `speed` and `make bench`'s `bench` alike."""
        return cls(
            int(node["repeats"]), int(node["max_repeats"]), float(node["half_width"]),
            float(node["confidence"]), float(node["budget_s"]),
        )  # fmt: skip


def alternate_until(
    trials: Mapping[str, Callable[[], T]],
    precision: Precision,
    warmup: int,
    ratios: Callable[[Mapping[str, list[T]]], Sequence[Sequence[float]]],
    progress: Callable[[dict], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, list[T]], dict]:
    """`alternate`, repeated until every ratio list `ratios(results)` gives (one per comparison
    the caller reports, e.g. dense / method per pair) has an interval of its median within
    `precision.half_width` of it, or `max_pairs` or `budget_s` is reached (never before
    `min_pairs`). Returns each trial's results after warm-up, as `alternate` does, and what the
    stop was: `{"pairs", "target", "confidence", "half_width" (the widest, relative), "reached",
    "stopped" ("tight" | "cap" | "budget"), "seconds", "interference"}` (`interference.between`:
    load and steal at the start and the end). Warm-up results enter no interval.

    `progress`, when given, hears at the start and after every timed pair how far it is:
    `{"pairs", "warming_up", "half_width", "seconds", "precision"}`, so a user watching a timing
    that may last many minutes sees it move towards its target."""
    start, before = clock(), interference.snapshot()
    results: dict[str, list[T]] = {label: [] for label in trials}
    widest, pairs = math.inf, 0

    def report() -> None:
        if progress is not None:
            progress({"pairs": pairs, "warming_up": pairs == 0 and warmup > 0,
                      "half_width": widest if math.isfinite(widest) else None,
                      "seconds": clock() - start, "precision": precision})  # fmt: skip

    report()
    for rep, row in enumerate(_alternation(trials)):
        if rep < warmup:
            continue
        for label, result in row.items():
            results[label].append(result)
        pairs += 1
        compared = ratios(results)
        widest = max((relative_half_width(r, precision.confidence) for r in compared), default=0.0)
        report()
        if pairs < precision.min_pairs:
            continue
        if widest <= precision.half_width:
            stopped = "tight"
        elif pairs >= precision.max_pairs:
            stopped = "cap"
        elif clock() - start >= precision.budget_s:
            stopped = "budget"
        else:
            continue
        break
    return results, {
        "pairs": pairs, "target": precision.half_width, "confidence": precision.confidence,
        "half_width": widest if math.isfinite(widest) else None,  # None: no interval yet
        "reached": widest <= precision.half_width, "stopped": stopped,
        "seconds": clock() - start,
        "interference": interference.between(before, interference.snapshot()),
    }  # fmt: skip


def _alternation(trials: Mapping[str, Callable[[], T]]) -> Iterator[dict[str, T]]:
    """Every trial once per repeat, in the order reversed every repeat (A B, B A, ...), for ever:
    the callers decide when to stop."""
    order = list(trials)
    for rep in itertools.count():
        yield {label: trials[label]() for label in (order if rep % 2 == 0 else order[::-1])}
