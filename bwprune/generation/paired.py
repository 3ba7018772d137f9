"""Paired timing inside a run: the dense model redoes the work the method just did.

Comparing a pruned run's tokens/s with a separate dense run's mixes two processes, often two
machines and two loads (on one CPU the same config ran at 1.5 and at 39.9 tok/s). So after the
method generates one of a run's first batches, both sides are timed here, in this process, on the
same prompts and the same decode steps per row: teacher-forced on the method's own completions (the
method then prunes exactly as it did while generating), alternated, after warm-up, pair after pair
until the speedup's interval is tight (`alternate_until`). The ratios are summarized by
`bwprune.runs.speedup`; `bwprune.generation.speed` (`make bench`) times through the same
procedure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch import nn

from bwprune.engine.ledger import SparsityLedger
from bwprune.generation.runner import BatchedRunner, Completion, Forcing
from bwprune.generation.timing import Precision, alternate_until
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import ModelAdapter, adapter_for
from bwprune.runs.speedup import timed_ratios


def weight_bytes(model: nn.Module) -> dict:
    """`read`: bytes one dense decode step reads (every parameter once, lm_head included; an
    untied input embedding is not read whole: a lookup reads B rows); `params`: bytes of all
    parameters, the base of the realized fraction (c)."""
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    read = every
    if model.get_output_embeddings().weight is not embedding:
        read -= embedding.numel() * embedding.element_size()
    return {"read": read, "params": every}


def timed_lengths(completions: Sequence[Completion], max_steps: int | None) -> list[int]:
    """How many tokens of each completion a timed trial decodes: all of them, or the first
    `max_steps` (`speed.max_steps`)."""
    cap = max_steps if max_steps is not None else max(c.new_tokens for c in completions)
    return [min(c.new_tokens, cap) for c in completions]


def own_forcing(completions: Sequence[Completion], pad_id: int, device: torch.device,
                max_steps: int | None = None) -> Forcing:  # fmt: skip
    """The completions as a reference to teacher-force: the same tokens, the same lengths (each
    cut to its first `max_steps` tokens when given)."""
    lengths = timed_lengths(completions, max_steps)
    n = max(lengths)
    tokens = [c.token_ids[:k] + [pad_id] * (n - k) for c, k in zip(completions, lengths)]
    return Forcing(torch.tensor(tokens, device=device), torch.tensor(lengths, device=device))


@dataclass(frozen=True)
class PairedSettings:
    """Which of a run's batches are timed and how (conf/config.yaml `speed`)."""

    batches: int  # the run's first N batches
    warmup: int  # untimed trials of each side first (allocation, compilation)
    precision: Precision  # how many timed pairs per batch: until the interval is tight
    auto_budget: bool = False  # `speed.budget_s: auto`: each batch's budget from the run's size
    max_steps: int | None = None  # each trial decodes a row's first max_steps tokens at most

    @classmethod
    def from_config(cls, speed: Mapping) -> PairedSettings:
        """From a run's `speed` node; `budget_s: auto` leaves the budget to `for_batch`."""
        auto = str(speed["budget_s"]).lower() == "auto"
        node = {**speed, "budget_s": math.inf} if auto else speed
        steps = speed.get("max_steps")
        return cls(int(speed["batches"]), int(speed["warmup"]), Precision.from_config(node), auto,
                   None if steps is None else int(steps))  # fmt: skip

    def for_batch(self, generation_s: float, run_batches: int) -> Precision:
        """The stop rule for one timed batch that took `generation_s` to generate in a run of
        `run_batches` batches. With `budget_s: auto` the timed batches may together add pairs
        for about as long as generating the whole run takes (this batch's seconds x the run's
        batches, shared among the timed ones): a run of two batches is not held for 20 minutes
        of timing, a run of hundreds gets the pairs its interval needs. The minimum pairs run
        whatever the budget."""
        if not self.auto_budget:
            return self.precision
        timed = max(1, min(self.batches, run_batches))
        return replace(self.precision, budget_s=generation_s * run_batches / timed)


def pair_status(status: dict) -> str:
    """One line for the progress bar while a batch is timed (`alternate_until`'s `progress`):
    the pairs done of the fewest and most, the interval's half-width against its target, the
    seconds spent and the budget (the fewest pairs run even past it)."""
    p: Precision = status["precision"]
    seconds = f"{status['seconds']:.0f} s (budget {p.budget_s:.0f} s)"
    if status["warming_up"]:
        return f"timing vs dense: warm-up, {seconds}"
    width = status["half_width"]
    interval = "no interval yet" if width is None else f"interval ±{width:.1%}"
    return (f"timing vs dense: {status['pairs']} of {p.min_pairs}-{p.max_pairs} pairs, "
            f"{interval} (target ±{p.half_width:.1%}), {seconds}")  # fmt: skip


class PairedTiming:
    """Times a method's runner against a dense runner on the method's own completions."""

    def __init__(
        self,
        runner: BatchedRunner,
        adapter: ModelAdapter,
        dense_model: nn.Module,
        settings: PairedSettings,
    ) -> None:
        """`dense_model`: the runner's own model when the method leaves the weights alone, else
        the model as loaded, loaded once more."""
        self.runner, self.settings = runner, settings
        dense_adapter = adapter if dense_model is runner.model else adapter_for(dense_model)
        self.dense = BatchedRunner(
            dense_model, runner.tokenizer, PruningMethod(), dense_adapter, runner.sampling,
            ledger=SparsityLedger(dense_adapter, runner.device), engine=runner.engine,
            batch_invariant=runner.batch_invariant,
        )  # fmt: skip
        self.weight_bytes = weight_bytes(dense_model)

    def measure(self, ids: torch.Tensor, attn: torch.Tensor, completions: list[Completion],
                precision: Precision | None = None,
                progress: Callable[[dict], None] | None = None) -> dict:  # fmt: skip
        """The `paired` entry of the batch's timing row: per trial, each side's prefill and decode
        seconds; how precise the pairs came out and what else loaded the machine (`precision`);
        the weight bytes the bound needs; what the timing cost in wall seconds. `precision`: the
        batch's stop rule (`PairedSettings.for_batch`), else the settings' own; `progress`:
        hears every pair (`alternate_until`)."""
        start = time.perf_counter()
        steps = self.settings.max_steps
        forced = own_forcing(completions, self.runner.pad_id, self.runner.device, steps)
        sides = {"method": self.runner, "dense": self.dense}
        trials = {
            side: partial(_trial, runner, ids, attn, forced) for side, runner in sides.items()
        }
        precision = precision or self.settings.precision
        results, stop = alternate_until(
            trials, precision, self.settings.warmup, timed_ratios, progress
        )
        return {**results, "precision": stop, "weight_bytes": self.weight_bytes,
                "max_steps": steps, "overhead_s": time.perf_counter() - start}  # fmt: skip


def _trial(runner: BatchedRunner, ids, attn, forced: Forcing) -> dict:
    """One timed generation (the runner attaches its method for it and detaches it after, so
    the next trial may be another method on the same model)."""
    _, timing = runner.generate_tokens(ids, attn, forced=forced)
    return {"prefill_s": timing.prefill_s, "decode_s": timing.decode_s, "phases": timing.phases}
