"""Matched cost: the method's ρ chosen so that what it realizes lands on a target (`cost:` block).

Why: at one nominal ρ the methods pay very different costs (at ρ = 0.5 on SmolLM2 ours skips 0.22 of
all parameters per decode token, TEAL 0.41), and paper A's headline speed is at "50 % actual
sparsity", not at ρ = 0.5. With `cost.target` set, a run first searches ρ: each trial prepares
the method at one ρ on a fresh copy of the model as loaded (static methods edit weights in
`prepare`), generates the calibration problems through the normal runner, and reads the realized
`cost.quantity` off the sparsity ledger (`bwprune.engine.ledger`, its one definition). The
calibration problems are the benchmark's last `cost.problems` that the run does not evaluate, cut
into batches of the run's size (a batch-shared or thresholded method realizes a cost that depends
on the batch). Realized cost grows with ρ for every method here, and ρ = 0 is exactly dense
(realized 0, the contract suite), so the search brackets the target from [0, `cost.max_rho`].

The search is stored in the run folder (`RunRecorder.save_cost_search`), so a resumed run does not
repeat it, and recorded in run.json under `metrics.cost`. This module names no method: a method
without a `sparsity`, or one that refuses the ρ the search may try, is refused with its reason.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

from omegaconf import DictConfig, OmegaConf

from bwprune.benchmarks.base import Benchmark, Example
from bwprune.benchmarks.selection import select_examples, work_items
from bwprune.config import build_method
from bwprune.engine.realized import combine
from bwprune.errors import UserError, choices_error
from bwprune.generation.prepared import prepare_loaded
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import SamplingConfig
from bwprune.models.loading import load_model
from bwprune.runs.identity import method_name
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.shards import shard_batches

log = logging.getLogger(__name__)

# Ledger quantities a run can target (`bwprune.engine.realized.combine` keys): parameters skipped
# per decode token (c), FFN neurons skipped per decode token (a).
QUANTITIES = ("params", "ffn")
RHO_DIGITS = 4  # trial ρ rounded: the recorded ρ is the one the method ran with


@dataclass(frozen=True)
class Trial:
    """One calibration generation: the method's ρ and the quantity it realized."""

    rho: float
    realized: float


def next_rho(low: Trial, high: Trial | None, target: float, max_rho: float) -> float:
    """The next ρ inside the bracket (`low` realized less than `target`, `high` more): the
    midpoint up to `max_rho` while no trial has realized more, then the linear interpolation
    between the two, kept in the middle half of the bracket. Bisection guarantees the bracket
    shrinks (by a quarter at worst); interpolation lands a near-linear cost in a trial or two,
    where each trial is a whole calibration generation."""
    if high is None:
        return round((low.rho + max_rho) / 2, RHO_DIGITS)
    width = high.rho - low.rho
    guess = low.rho + (target - low.realized) / (high.realized - low.realized) * width
    return round(min(max(guess, low.rho + width / 4), high.rho - width / 4), RHO_DIGITS)


def search_rho(
    measure: Callable[[float], float],
    target: float,
    tolerance: float,
    start: float,
    max_rho: float,
    max_trials: int,
) -> list[Trial]:
    """Trials from `start` until one realizes `target` within `tolerance` (the last trial);
    `UserError` with every trial when `max_trials` do not reach it."""
    low, high = Trial(0.0, 0.0), None  # ρ = 0 is exactly dense: realized 0, not measured
    rho = round(start, RHO_DIGITS) if 0 < start < max_rho else next_rho(low, None, target, max_rho)
    trials: list[Trial] = []
    for _ in range(max_trials):
        trial = Trial(rho, measure(rho))
        trials.append(trial)
        if abs(trial.realized - target) <= tolerance:
            return trials
        if trial.realized < target:
            low = trial
        else:
            high = trial
        rho = next_rho(low, high, target, max_rho)
    tried = ", ".join(f"ρ {t.rho:g} → {t.realized:.4f}" for t in trials)
    hint = (
        f"lower cost.target (or raise cost.max_rho={max_rho:g})"
        if high is None
        else "raise cost.tolerance or cost.max_trials"
    )
    raise UserError(
        f"cost.target={target:g}: no ρ realized it within cost.tolerance={tolerance:g} in "
        f"{len(trials)} trials ({tried}); {hint}"
    )


@dataclass(frozen=True)
class CostTarget:
    """A validated `cost:` block and the calibration problems it generates."""

    quantity: str
    target: float
    tolerance: float
    max_trials: int
    max_rho: float
    max_new_tokens: int
    problems: list[Example]

    @classmethod
    def from_config(cls, cfg: DictConfig, benchmark: Benchmark) -> CostTarget | None:
        """The run's cost target (None when `cost.target` is null). Every bad setting fails here,
        before the run's folder exists."""
        cost = cfg.cost
        if cost.target is None:
            return None
        _check_ranges(cost, cfg.batch_size)
        if cost.quantity not in QUANTITIES:
            raise choices_error("cost.quantity", cost.quantity, QUANTITIES)
        if benchmark.kind != "generate":
            raise UserError(f"cost.target={cost.target}: benchmark={benchmark.name} generates "
                            "nothing to calibrate on; cost targets apply to generation "
                            "benchmarks")  # fmt: skip
        if cfg.num_shards > 1:
            raise UserError(
                f"cost.target={cost.target} with num_shards={cfg.num_shards}: each shard would "
                "search ρ on its own; run the matched run unsharded, or shard it with "
                "sparsity=<its metrics.cost.rho> and cost.target=null"
            )
        _check_method(cfg)
        examples = benchmark.examples()
        evaluated = {e.index for e in select_examples(examples, cfg)}
        spare = [e for e in examples if e.index not in evaluated]
        if len(spare) < cost.problems:
            raise UserError(
                f"cost.problems={cost.problems}: {benchmark.name} has only {len(spare)} problems "
                f"the run does not evaluate ({len(evaluated)} of {len(examples)} are); lower "
                "cost.problems or evaluate fewer (limit=...)"
            )
        return cls(str(cost.quantity), float(cost.target), float(cost.tolerance),
                   int(cost.max_trials), float(cost.max_rho), int(cost.max_new_tokens),
                   spare[-cost.problems :])  # fmt: skip

    def matched(self, cfg: DictConfig, recorder: RunRecorder) -> DictConfig:
        """`cfg` with the method's ρ the one the search chose: the search stored in the run
        folder, or a new one (then stored)."""
        search = recorder.cost_search()
        if search is None:
            search = self.search(cfg)
            recorder.save_cost_search(search)
        else:
            log.info("cost search stored in %s: ρ %g", recorder.dir, search["rho"])
        return with_rho(cfg, search["rho"])

    def search(self, cfg: DictConfig) -> dict:
        """Search ρ on the calibration problems (the model loaded once); the `cost.json` record."""
        model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
        batches = shard_batches(work_items(self.problems, 1), cfg.batch_size, 0, 1)
        sampling = SamplingConfig.from_config(cfg.generation, self.max_new_tokens)
        # Eager: every trial is a new model copy and method, so a compiled step would compile
        # anew per trial (tens of seconds per graph on a GPU) to save milliseconds; the engine
        # changes speed, never the sparsity measured here.
        eager = OmegaConf.merge(cfg.generation, {"compile": False})

        def measure(rho: float) -> float:
            trial_cfg = with_rho(cfg, rho)
            method = build_method(trial_cfg.method)
            p = prepare_loaded(copy.deepcopy(model), tokenizer, method)
            runner = p.runner(sampling, cfg.seed, eager)
            rows = []
            for batch in batches:
                ids, attn = runner.encode(batch_prompts(tokenizer, cfg.model, batch))
                rows += [c.sparsity for c in runner.generate_tokens(ids, attn)[0]]
            realized = combine(rows)[self.quantity]
            log.info("cost search: %s at ρ %g realized %s %.4f (target %g ± %g)",
                     method_name(cfg), rho, self.quantity, realized, self.target,
                     self.tolerance)  # fmt: skip
            return realized

        trials = search_rho(measure, self.target, self.tolerance, float(cfg.method.sparsity),
                            self.max_rho, self.max_trials)  # fmt: skip
        return {
            "quantity": self.quantity,
            "target": self.target,
            "tolerance": self.tolerance,
            "rho": trials[-1].rho,
            "realized": trials[-1].realized,
            "calibration": {
                "indices": [e.index for e in self.problems],
                "batch_size": int(cfg.batch_size),
                "max_new_tokens": self.max_new_tokens,
            },
            "trials": [asdict(t) for t in trials],
        }


def with_rho(cfg: DictConfig, rho: float) -> DictConfig:
    """A copy of `cfg` whose method runs at ρ = `rho`."""
    out = copy.deepcopy(cfg)
    out.method.sparsity = rho
    return out


def _check_ranges(cost: DictConfig, batch_size: int) -> None:
    """Each `cost` number in its range (`bwprune.config.validate` checked their types)."""
    rules = {
        "target": (0 < cost.target < 1, "in (0, 1)"),
        "tolerance": (cost.tolerance > 0, "> 0"),
        "max_rho": (0 < cost.max_rho < 1, "in (0, 1)"),
        "problems": (cost.problems >= batch_size, f">= batch_size={batch_size}, so calibration "
                     "batches are as full as the run's"),
        "max_trials": (cost.max_trials >= 1, ">= 1"),
        "max_new_tokens": (cost.max_new_tokens >= 1, ">= 1"),
    }  # fmt: skip
    for key, (ok, rule) in rules.items():
        if not ok:
            raise UserError(f"cost.{key}={cost[key]} must be {rule}")


def _check_method(cfg: DictConfig) -> None:
    """The method must have a ρ, and accept every ρ the search may try (up to `max_rho`)."""
    name, cost = method_name(cfg), cfg.cost
    if "sparsity" not in cfg.method:
        raise UserError(
            f"cost.target={cost.target} chooses the method's ρ, and method={name} has none (its "
            "config sets no `sparsity`); choose a method that prunes to a target ρ"
        )
    try:
        build_method(with_rho(cfg, cost.max_rho).method)
    except UserError as e:
        raise UserError(
            f"cost.target={cost.target}: the search tries method.sparsity up to "
            f"cost.max_rho={cost.max_rho}, and method={name} refuses it: {e}"
        ) from None
