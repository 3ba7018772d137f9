"""Per-step traces of generation, for the figures about dynamics that run records do not keep.

Run records keep per-row totals (bwprune/engine/ledger.py); two of the paper's figures need what
happens step by step: (1) the realized sparsity of each decode step under each method, which
shows a schedule's dense exploration steps and a threshold's drift as the batch changes, and
(2) the activation magnitudes of one layer's neurons over a long generation, which show that
strongly activated neurons fall silent and re-fire (the observation behind the activation memory;
paper A Fig. 1 right reports a re-fire period of ~22 tokens and a rate of ~76 % on a 7B model).
`scripts/trace.py` records both into results/traces/; `bwprune.report.figures` draws them.

The paper does not publish its exact re-fire definitions, so ours are stated in `refire_stats`.
"""

from __future__ import annotations

import itertools
import json
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from bwprune.config import build, build_method, compose_config
from bwprune.engine.ledger import SparsityLedger
from bwprune.errors import UserError
from bwprune.generation.prepared import PreparedModel, prepare_model
from bwprune.generation.prompts import render_prompt
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.methods.base import StepSparsity
from bwprune.methods.hooks import HookSet
from bwprune.models.adapters import ModelAdapter
from bwprune.runs.provenance import provenance

log = logging.getLogger(__name__)


class StepTrace(SparsityLedger):
    """A sparsity ledger that also keeps every decode step's FFN sparsity.

    `per_step[t]` is the neuron-weighted FFN sparsity of step t averaged over the rows still
    generating (0 on a dense step); one host sync per step, which a trace can afford.
    """

    def reset(self, batch_size: int) -> None:
        super().reset(batch_size)
        self.per_step: list[float] = []

    def record(self, sparsity: StepSparsity | None, active: torch.Tensor) -> None:
        super().record(sparsity, active)
        if sparsity is None or not bool(active.any()):
            self.per_step.append(0.0)
            return
        s = sparsity.ffn.to(torch.float64).expand(len(active), len(self.d_ff))[active]
        self.per_step.append(float((s @ self.d_ff).mean() / self.d_ff.sum()))


def sparsity_trace(runner: BatchedRunner, prompts: list[str]) -> list[float]:
    """Per-decode-step FFN sparsity of one batch; `runner.ledger` must be a `StepTrace`."""
    if not isinstance(runner.ledger, StepTrace):
        raise TypeError("sparsity_trace needs a runner built with a StepTrace ledger")
    runner.generate(prompts)
    return list(runner.ledger.per_step)


@torch.inference_mode()
def activation_trace(
    runner: BatchedRunner, adapter: ModelAdapter, prompt: str, layer: int
) -> torch.Tensor:
    """(steps, d_ff) |act(gate(x)) * up(x)| of `layer` at every decode step of one generation.

    These are the inputs of the layer's down projection, the same magnitudes the neuron-importance
    scores of ours, Griffin and TEAL start from. Prefill is left out: the figure is about decode.
    """
    ffn = adapter.ffn(layer)
    rows: list[torch.Tensor] = []

    def keep(_module, args):
        h = args[0]
        if h.shape[1] == 1:  # a decode step (prefill feeds the whole prompt at once)
            rows.append(h[0, 0].abs().float().cpu())

    with HookSet() as hooks:
        hooks.forward_pre(ffn.down, keep)
        runner.generate([prompt])
    if not rows:
        raise UserError("the generation stopped after its first token: no decode step to trace")
    return torch.stack(rows)


@dataclass(frozen=True)
class RefireStats:
    """Re-firing of a layer's most active neurons over one generation (see `refire_stats`)."""

    neurons: list[int]  # the `top` neurons by mean magnitude, most active first
    period: float | None  # median steps between the starts of consecutive firing episodes
    rate: float  # fraction of the neurons that fire, fall silent, and fire again
    fires: list[list[int]]  # per neuron, the steps at which it fires


def refire_stats(trace: torch.Tensor, top: int = 64, fire_fraction: float = 0.1) -> RefireStats:
    """Re-fire period and rate of the `top` most active neurons of a (steps, d_ff) trace.

    A neuron *fires* at a step when its magnitude is in that step's top `fire_fraction` of the
    layer's neurons. A firing *episode* is a maximal run of consecutive firing steps; a neuron
    *re-fires* when it has a second episode. The period is the median gap between the starts of
    consecutive episodes, pooled over the `top` neurons; the rate is the fraction of the `top`
    neurons with at least two episodes.
    """
    d_ff = trace.shape[1]
    if not 0 < fire_fraction <= 1 or not 0 < top <= d_ff:
        raise ValueError(f"need 0 < fire_fraction={fire_fraction} <= 1, 0 < top={top} <= {d_ff}")
    k = max(1, round(fire_fraction * d_ff))
    firing = torch.zeros_like(trace, dtype=torch.bool)
    firing.scatter_(1, trace.topk(k, dim=1).indices, True)
    neurons = trace.mean(dim=0).topk(top).indices.tolist()
    gaps: list[int] = []
    refiring = 0
    fires = []
    for j in neurons:
        on = firing[:, j]
        fires.append(torch.nonzero(on).flatten().tolist())
        starts = torch.nonzero(on & ~torch.cat([on.new_zeros(1), on[:-1]])).flatten().tolist()
        if len(starts) >= 2:
            refiring += 1
            gaps += [b - a for a, b in itertools.pairwise(starts)]
    period = float(statistics.median(gaps)) if gaps else None
    return RefireStats(neurons, period, refiring / top, fires)


def _traced_runner(
    cfg: DictConfig, new_tokens: int, ignore_eos: bool
) -> tuple[BatchedRunner, PreparedModel]:
    """The configured method prepared on a fresh model, with a `StepTrace` ledger."""
    method = build_method(cfg.method)
    ledgers = []
    p = prepare_model(cfg, method, lambda p: ledgers.append(StepTrace(p.adapter, p.device)))
    sampling = SamplingConfig(new_tokens, ignore_eos=ignore_eos)
    runner = BatchedRunner(p.model, p.tokenizer, method, p.adapter, sampling, cfg.seed, ledgers[0])
    return runner, p


def record_traces(conf_dir: str | Path, overrides: list[str]) -> list[Path]:
    """`make traces`: both traces of conf/trace/default.yaml -> `<results_dir>/traces/*.json`."""

    def config(*extra: str) -> DictConfig:
        return compose_config(conf_dir, ["+trace=default", *overrides, *extra])

    cfg = config()
    name = f"{cfg.model.name}_{cfg.benchmark.name}"
    examples = build(cfg.benchmark).examples()
    out = Path(cfg.paths.results_dir) / "traces"
    out.mkdir(parents=True, exist_ok=True)
    steps = sparsity_steps_record(cfg, examples, config)
    refire = refire_record(config("method=dense"), examples)
    written = [
        out / f"{name}_sparsity_steps_bs{steps['batch_size']}.json",
        out / f"{name}_refire_L{refire['layer']}.json",
    ]
    written[0].write_text(json.dumps(steps, indent=1) + "\n")
    written[1].write_text(json.dumps(refire) + "\n")
    return written


def sparsity_steps_record(cfg: DictConfig, examples: list, config) -> dict:
    """Per-step FFN sparsity of one batch (the first problems) under each `trace.sparsity`
    method; `config(override)` composes a method's config. Each method gets a freshly loaded
    model: some edit weights in `prepare`."""
    s = cfg.trace.sparsity
    batch = examples[: s.batch_size]
    per_method = {}
    for method in s.methods:
        mcfg = config(f"method={method}")
        runner, p = _traced_runner(mcfg, s.new_tokens, ignore_eos=True)
        prompts = [render_prompt(p.tokenizer, mcfg.model, e.question) for e in batch]
        per_method[method] = [round(v, 5) for v in sparsity_trace(runner, prompts)]
        mean = sum(per_method[method]) / max(1, len(per_method[method]))
        log.info("%s: mean FFN sparsity over decode steps %.3f", method, mean)
    return {
        "kind": "sparsity_steps", "model": cfg.model.name, "benchmark": cfg.benchmark.name,
        "batch_size": s.batch_size, "target_sparsity": cfg.sparsity,
        "examples": [e.id for e in batch], "per_step": per_method,
        "provenance": provenance(cfg.seed, str(p.device)),
    }  # fmt: skip


def refire_record(cfg: DictConfig, examples: list) -> dict:
    """One layer's activations over a dense generation of one problem, with `refire_stats`."""
    r = cfg.trace.refire
    runner, p = _traced_runner(cfg, r.new_tokens, ignore_eos=False)
    layer = r.layer if r.layer is not None else len(p.adapter.layers) // 2
    example = examples[r.example]
    prompt = render_prompt(p.tokenizer, cfg.model, example.question)
    trace = activation_trace(runner, p.adapter, prompt, layer)
    stats = refire_stats(trace, r.top_neurons, r.fire_fraction)
    log.info("layer %d: re-fire period %s steps, rate %.2f over %d steps", layer, stats.period,
             stats.rate, trace.shape[0])  # fmt: skip
    return {
        "kind": "refire", "model": cfg.model.name, "benchmark": cfg.benchmark.name,
        "example": example.id, "layer": layer, "d_ff": trace.shape[1], "steps": trace.shape[0],
        "top_neurons": r.top_neurons, "fire_fraction": r.fire_fraction,
        "period": stats.period, "rate": stats.rate, "neurons": stats.neurons,
        "fires": stats.fires,
        "magnitudes": [[round(v, 4) for v in trace[:, j].tolist()] for j in stats.neurons],
        "provenance": provenance(cfg.seed, str(p.device)),
    }  # fmt: skip
