"""Per-step traces: the sparsity of every decode step, and re-firing statistics of activations."""

import pytest
import torch

from bwprune.engine.realized import combine
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.generation.traces import StepTrace, activation_trace, refire_stats, sparsity_trace
from bwprune.models.adapters import adapter_for
from bwprune.report import figures
from tests.conftest import PROMPTS, chat, method_from_conf, prepared, tiny_model


def traced(method, new_tokens=30):
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    prepared(method, model, tok)
    ledger = StepTrace(adapter, torch.device("cpu"))
    sampling = SamplingConfig(new_tokens, ignore_eos=True)
    return BatchedRunner(model, tok, method, adapter, sampling, ledger=ledger), adapter, tok


def test_step_trace_follows_the_schedule_and_sums_to_the_ledger():
    method = method_from_conf("ours", sparsity=0.5, t_init=8, t_explore=4, t_prune=16)
    runner, _, tok = traced(method)
    steps = sparsity_trace(runner, chat(tok, PROMPTS))
    assert len(steps) == 29  # the first new token comes from prefill
    assert steps[:8] == [0.0] * 8  # t_init dense steps, then k = D/2 on every pruned step
    assert steps[8:24] == [0.5] * 16 and steps[24:28] == [0.0] * 4
    total = combine(runner.ledger.rows())["ffn"]
    assert sum(steps) / len(steps) == pytest.approx(total)


def test_activation_trace_is_one_row_per_decode_step():
    runner, adapter, tok = traced(method_from_conf("dense"), new_tokens=12)
    trace = activation_trace(runner, adapter, chat(tok, PROMPTS[:1])[0], layer=1)
    assert trace.shape == (11, adapter.ffn(1).d_ff) and (trace >= 0).all()


def test_refire_stats_on_a_known_pattern():
    trace = torch.zeros(40, 10)
    trace[::10, 0] = 5.0  # fires every 10 steps: 4 episodes, period 10
    trace[5:9, 1] = 4.0  # one episode of 4 steps: never re-fires
    trace[:, 2] = torch.tensor([3.0, 3.0, 0.0, 0.0] * 10)  # 2-step episodes every 4 steps
    stats = refire_stats(trace, top=3, fire_fraction=0.1)  # one neuron fires per step
    assert stats.neurons == [2, 0, 1]  # by mean magnitude: 1.5, 1.25, 0.4
    assert stats.fires[1] == [0, 10, 20, 30]
    assert stats.rate == pytest.approx(2 / 3)
    assert stats.period == 4.0  # gaps: nine 4s (neuron 2) and three 10s (neuron 0)
    with pytest.raises(ValueError, match="top=11"):
        refire_stats(trace, top=11)


def test_trace_figures_build():
    steps = {"kind": "sparsity_steps", "model": "m", "benchmark": "b", "batch_size": 2,
             "target_sparsity": 0.5, "per_step": {"ours": [0, 0.5], "dense": [0, 0]}}  # fmt: skip
    assert len(figures.sparsity_over_steps(steps).axes[0].lines) == 3  # two methods + target
    refire = {"kind": "refire", "model": "m", "layer": 1, "top_neurons": 2, "period": 4.0,
              "rate": 0.5, "magnitudes": [[1, 0, 1], [0, 1, 0]],
              "fires": [[0, 2], [1]]}  # fmt: skip
    fig = figures.refiring(refire)
    assert "period 4 tokens" in fig.axes[0].get_title()
