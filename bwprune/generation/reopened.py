"""A finished run reopened under this checkout, for what is measured after the fact: its record,
its config made runnable here, its benchmark and its batches as they were generated
(`bwprune.generation.remeasure`: paired speedup; `bwprune.generation.requality`: fidelity to
dense)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.base import Benchmark, Example
from bwprune.config import build
from bwprune.errors import UserError
from bwprune.generation.cost_target import with_rho
from bwprune.runs.identity import LATE_OPTIONS, current_target
from bwprune.runs.recorder import RunRecorder, batch_keys


@dataclass
class Reopened:
    """A complete run's record, its config as run here, its benchmark and its rows."""

    recorder: RunRecorder
    cfg: DictConfig
    benchmark: Benchmark
    samples: list[dict]
    timings: list[dict]

    @cached_property
    def examples(self) -> dict[int, Example]:
        return {e.index: e for e in self.benchmark.examples()}

    def batch(self, timing: dict) -> list[tuple[Example, int]]:
        """The (problem, sample) pairs of one recorded batch, in the order they were generated."""
        return [(self.examples[i], k) for i, k in batch_keys(timing)]


def reopen(run_dir: str | Path, current: DictConfig, what: str) -> Reopened:
    """The run in `run_dir` reopened; `current`: this checkout's composed config (`relocated`);
    `what`: the measurement, named in the error a run that generates nothing gets."""
    run_dir = Path(run_dir)
    recorder = RunRecorder(run_dir.parent, run_dir.name)
    if not recorder.is_complete():
        raise UserError(f"{str(run_dir)!r} is not a complete run folder (no run.json)")
    cfg = relocated(OmegaConf.load(run_dir / "config.yaml"), current)
    cfg.method.setdefault("name", run_dir.parent.name)  # recorded before methods carried it
    search = recorder.cost_search()
    if search is not None:  # a matched-cost run ran at the ρ its search chose
        cfg = with_rho(cfg, search["rho"])
    benchmark: Benchmark = build(cfg.benchmark)
    if benchmark.kind != "generate":
        raise UserError(f"{str(run_dir)!r} is a {benchmark.kind} run: it generates nothing to "
                        f"{what}")  # fmt: skip
    samples, timings = recorder.rows()
    return Reopened(recorder, cfg, benchmark, samples, timings)


def relocated(recorded: DictConfig, current: DictConfig) -> DictConfig:
    """The run's config made runnable here: this checkout's `speed`, `paths` and engine keys
    (older runs lack them; none changes what is computed), data shipped in the package named in
    this checkout (the run may have been recorded in another folder), a renamed method class
    under its current name, and method options added since at the value the run behaved as."""
    old_data = str(recorded.paths.data_dir)
    new_data = str(current.paths.data_dir)

    def move(node):
        if isinstance(node, dict):
            return {k: move(v) for k, v in node.items()}
        if isinstance(node, list):
            return [move(v) for v in node]
        if isinstance(node, str) and node.startswith(old_data):
            return new_data + node[len(old_data) :]
        return node

    cfg = OmegaConf.create(move(OmegaConf.to_container(recorded, resolve=True)))
    cfg.method._target_ = current_target(cfg.method._target_)
    accepts = inspect.signature(get_class(cfg.method._target_).__init__).parameters
    for (group, key), value in LATE_OPTIONS.items():  # options the run's code did not have yet
        if group == "method" and key in accepts and key not in cfg.method:
            cfg.method[key] = value
    cfg.speed, cfg.paths = current.speed, current.paths
    cfg.generation = OmegaConf.merge(current.generation, cfg.generation)
    return cfg
