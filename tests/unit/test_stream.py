"""Continuous batching (`generation.batching=continuous`): slots refilled as rows finish.

A row's computation in a stream must be the one it gets alone — its own positions, KV entries and
first token — for every method whose rows do not see each other (dense, per-token TEAL and CATS),
across refills, cache rebases and the final drain; batch-coupled methods must run and account.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from bwprune.config import validate
from bwprune.errors import UserError
from bwprune.experiment import run
from bwprune.generation.runner import BatchedRunner, EngineConfig, Forcing, SamplingConfig
from bwprune.generation.speed import measure_streaming, stream_lengths
from bwprune.generation.stream import StreamRunner
from bwprune.generation.timing import Precision
from bwprune.models.adapters import adapter_for
from bwprune.report.speed_table import stream_line
from bwprune.report.stream import static_runs, stream_pairs
from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from tests.conftest import chat, kv_addresses, method_from_conf, prepared, tiny_model
from tests.unit.test_engine import methods

CAP = 30
TEXTS = [f"Q{i} " + "ab " * (i * 3 % 5) for i in range(20)]


def prompts(tok) -> list[torch.Tensor]:
    return [tok(t, return_tensors="pt", add_special_tokens=False).input_ids[0]
            for t in chat(tok, TEXTS)]  # fmt: skip


def references(n: int) -> list[torch.Tensor]:
    """Teacher-forced continuations of uneven lengths, 2 ... CAP tokens."""
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 300, ((5 * i + 2) % (CAP - 1) + 2,), generator=g) for i in range(n)]


def alone(runner: BatchedRunner, ids: list[torch.Tensor], forced=None):
    """Each item as a static batch of one: completions and (item, index) -> logits."""
    out, logits = [], {}
    for i, p in enumerate(ids):
        one = None if forced is None else Forcing(forced[i][None], torch.tensor([len(forced[i])]))

        def keep(n, x, i=i):
            logits[(i, n)] = x[0].clone()

        out += runner.generate_tokens(p[None], torch.ones_like(p[None]), forced=one, observe=keep)[
            0
        ]
    return out, logits


def streamed(runner: BatchedRunner, slots: int, ids, forced=None):
    """The items through `slots` slots: completions in item order, (item, index) -> logits,
    the order they finished in, and the stream."""
    done, logits, order = {}, {}, []

    def finished(items, completions, timing):
        order.extend(items)
        done.update(zip(items, completions))

    def observe(items, index, x):
        for i, n, row in zip(items.tolist(), index.tolist(), x):
            logits[(i, n)] = row.clone()

    stream = StreamRunner(runner, slots)
    stream.run(ids, finished, forced=forced, observe=observe)
    return [done[i] for i in range(len(ids))], logits, order, stream


def setup(tiny, method, engine=None, cap=CAP, invariant=False):
    model, tok = tiny
    adapter = adapter_for(model)
    prepared(method, model, tok)
    sampling = SamplingConfig(cap)
    engine = engine or EngineConfig()
    runner = BatchedRunner(model, tok, method, adapter, sampling, engine=engine,
                           batch_invariant=invariant)  # fmt: skip
    return runner, runner.driver.attached(), prompts(tok)


@pytest.mark.parametrize("name", ["dense", "teal", "cats"])
def test_a_streamed_row_computes_what_it_computes_alone(tiny, name):
    """Teacher-forced rows of uneven lengths through 3 slots: refills, a rebase of the cache
    (20 rows of up to 30 tokens pass through a 128-column cache) and the drain. Every logit a
    row sees equals its logit alone (float noise of other batch shapes aside), the same argmax."""
    runner, hooks, ids = setup(tiny, methods(shared=False)[name])
    forced = references(len(ids))
    with hooks:
        _, ref_logits = alone(runner, ids, forced)
        out, logits, order, stream = streamed(runner, 3, ids, forced)
    assert stream.rebases >= 1
    assert order != sorted(order)  # rows overtook each other: slots were refilled out of order
    assert [c.token_ids for c in out] == [f.tolist() for f in forced]
    assert logits.keys() == ref_logits.keys()
    for key, row in ref_logits.items():
        torch.testing.assert_close(logits[key], row, atol=1e-4, rtol=1e-4)
        assert logits[key].argmax() == row.argmax()
    assert [c.sparsity["decode_steps"] for c in out] == [len(f) - 1 for f in forced]


def test_free_generation_stops_rows_at_their_own_stop_tokens(tiny):
    """Greedy dense rows that stop at different steps: a stream gives each row its tokens alone,
    with or without compaction of the drain."""
    runner, _, ids = setup(tiny, method_from_conf("dense"))
    ref, _ = alone(runner, ids)
    firsts = {c.token_ids[0] for c in ref}
    later = [t for c in ref for t in c.token_ids[3:] if t not in firsts]
    runner.stop_ids = torch.tensor(sorted(set(later[:: max(1, len(later) // 3)]))[:3])
    ref, _ = alone(runner, ids)
    assert len({c.new_tokens for c in ref}) >= 3  # uneven lengths
    out, _, _, _ = streamed(runner, 4, ids)
    assert [(c.token_ids, c.finish_reason) for c in out] == [
        (c.token_ids, c.finish_reason) for c in ref
    ]
    runner.engine = EngineConfig(compaction=False)
    kept, _, _, _ = streamed(runner, 4, ids)
    assert [c.token_ids for c in kept] == [c.token_ids for c in out]


def test_batch_invariant_streams_are_bit_identical_to_rows_alone():
    runner, _, ids = setup(tiny_model("tiny_llama"), method_from_conf("dense"), invariant=True)
    forced = references(len(ids))
    _, ref_logits = alone(runner, ids, forced)
    _, logits, order, _ = streamed(runner, 4, ids, forced)
    assert order == list(range(len(ids)))  # computed alone, one after the other
    assert all(torch.equal(logits[k], v) for k, v in ref_logits.items())


@pytest.mark.parametrize("name", ["ours", "griffin", "teal", "cats"])
def test_batch_coupled_methods_stream_and_account_every_row(name):
    """Shared masks see other rows, so no equality to rows alone: every item comes back once,
    with the decode steps it ran and what the method skipped on them."""
    runner, hooks, ids = setup(tiny_model("tiny_llama"), methods(shared=True)[name])
    forced = references(len(ids))
    with hooks:
        out, _, _, _ = streamed(runner, 3, ids, forced)
    assert [c.token_ids for c in out] == [f.tolist() for f in forced]
    assert [c.sparsity["decode_steps"] for c in out] == [len(f) - 1 for f in forced]
    assert sum(c.sparsity["sparse_steps"] for c in out) > 0
    assert all(0 < c.sparsity["ffn_sparse_steps"] < 1 for c in out if c.sparsity["sparse_steps"])


def test_a_stream_reuses_one_cache():
    """Refills and rebases write into the same preallocated tensors."""
    runner, _, ids = setup(tiny_model("tiny_llama"), method_from_conf("dense"), cap=CAP)
    seen: set[tuple[int, ...]] = set()
    step = runner.step
    runner.step = lambda cache, *a: (seen.add(tuple(kv_addresses(cache))), step(cache, *a))[1]
    runner.engine = EngineConfig(compaction=False)
    _, _, _, stream = streamed(runner, 3, ids, references(len(ids)))
    assert stream.rebases >= 1 and len(seen) == 1


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["generation.batching=dynamic"], r"'dynamic'.*\['continuous', 'static'\]"),
        (["generation.batching=continuous", "generation.kv_cache=dynamic"], "kv_cache=static"),
        (["generation.batching=continuous", "speed.paired=true"], "speed.paired=true"),
    ],
)
def test_bad_stream_settings_are_named(cfg_factory, overrides, named):
    with pytest.raises(UserError, match=named):
        validate(cfg_factory(*overrides))


def test_a_continuous_run_records_samples_as_they_finish_and_resumes(cfg_factory, monkeypatch):
    """run.py with batching=continuous: every sample recorded once with quality, timing lines
    that partition the work; an interrupted stream resumes with the missing samples only."""
    args = ["model=tiny_llama", "limit=7", "batch_size=3", "generation.batching=continuous",
            "generation.max_new_tokens=12", "quality.enabled=true", "quality.max_tokens=6",
            "method=ours", "method.t_init=2", "method.t_prune=3", "method.t_explore=2"]  # fmt: skip
    cfg = cfg_factory(*args)
    record = run(cfg)
    recorder = RunRecorder(cfg.paths.runs_dir, record["run_key"])
    samples, _ = recorder.rows()
    assert sorted(s["index"] for s in samples) == list(range(7))
    assert all(s["quality"]["tokens"] == 6 for s in samples)
    assert record["metrics"]["realized_sparsity"]["ffn"] > 0
    assert "continuous" in (Path(recorder.dir) / "config.yaml").read_text()
    # interrupted: the first stream (quality) passes, generation stops on its first call
    cfg = cfg_factory(*args, "seed=1")
    calls = []
    real = StreamRunner.run

    def stop_after_three(self, prompts, on_finish, **kw):
        def partial_finish(items, completions, timing):
            calls.append(len(items))
            on_finish(items, completions, timing)
            if "forced" not in kw and sum(calls) >= 3:
                raise KeyboardInterrupt

        return real(self, prompts, partial_finish, **kw)

    monkeypatch.setattr(StreamRunner, "run", stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    interrupted = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    assert 3 <= len(interrupted.samples()) < 7 and not interrupted.is_complete()
    monkeypatch.setattr(StreamRunner, "run", real)
    resumed = run(cfg)
    assert resumed["metrics"]["n"] == 7


def test_the_streaming_benchmark_times_the_same_heavy_tailed_work_both_ways():
    model, tok = tiny_model("tiny_llama")
    lengths = stream_lengths(64, (4, 8), 32, 0.25, seed=0)
    assert set(lengths) - set(range(4, 9)) == {32} and 4 <= lengths.count(32) <= 28
    out = measure_streaming(model, tok, adapter_for(model), Precision(1, 1, 0.03, 0.95, 60.0),
                            batch=4, items=8, short=(4, 8), long=32, prompt_len=8,
                            warmup=0)  # fmt: skip
    assert out["tokens"] == sum(stream_lengths(8, (4, 8), 32, 0.125, seed=0))
    assert out["tokens_per_s_static"]["median"] > 0 and out["ratio"]["median"] > 0
    assert stream_line(out).startswith("Continuous batching: 8 answers in 4 slots")


def test_each_continuous_run_is_shown_beside_its_static_twin_only():
    """stream_pairs pairs on everything but the batching; static views leave streams out."""

    def row(key, batching, policy, batch, kl, on_enter="prompt"):
        gen = {"max_new_tokens": 64, **({"batching": batching} if batching != "static" else {})}
        method = {"sparsity": 0.5, **({"memory_policy": policy} if policy != "max" else {}),
                  **({"on_enter": on_enter} if on_enter != "prompt" else {})}  # fmt: skip
        return {"run_key": key, "batching": batching, "method": "ours", "batch_size": batch,
                "variant": json.dumps({k: v for k, v in method.items() if k != "sparsity"}),
                "settings": json.dumps({"generation": gen, "method": method, "batch_size": batch}),
                "benchmark": "gsm8k", "model": "m", "problems": 48, "kl": kl,
                "nll_increase": kl, "realized_params": 0.2, "realized_ffn": 0.4}  # fmt: skip

    runs = pd.DataFrame([
        row("s-max-4", "static", "max", 4, 1.0), row("c-max-4", "continuous", "max", 4, 2.0),
        row("s-decay-4", "static", "decay", 4, 1.5),
        row("c-decay-4", "continuous", "decay", 4, 1.6),
        row("s-defer-4", "static", "decay", 4, 1.5, "defer"),
        row("c-defer-4", "continuous", "decay", 4, 1.7, "defer"),
        row("s-request-4", "static", "request", 4, 1.0),
        row("c-request-4", "continuous", "request", 4, 1.2),
        row("c-max-16", "continuous", "max", 16, 3.0),  # no static twin: left out
    ])  # fmt: skip
    pairs = stream_pairs(runs)
    assert list(pairs["label"]) == ["ours (decay)", "ours (decay, defer)", "ours (max)",
                                    "ours (request)"]  # fmt: skip
    assert list(pairs["kl_static"]) == [1.5, 1.5, 1.0, 1.0]
    assert list(pairs["kl_continuous"]) == [1.6, 1.7, 2.0, 1.2]
    assert list(pairs["run_keys"]) == [("s-decay-4", "c-decay-4"), ("s-defer-4", "c-defer-4"),
                                       ("s-max-4", "c-max-4"),
                                       ("s-request-4", "c-request-4")]  # fmt: skip
    assert set(static_runs(runs)["run_key"]) == {"s-max-4", "s-decay-4", "s-defer-4",
                                                 "s-request-4"}  # fmt: skip


@pytest.mark.parametrize("name", ["ours", "teal"])
def test_a_compiled_stream_computes_the_eager_stream_and_never_recompiles(name):
    """Decode shapes stay static through refills and rebases, so the captured step (dynamo,
    backend `eager`) replays: the same logits, and a second stream adds no graph."""
    from torch._dynamo.utils import counters

    tiny = tiny_model("tiny_llama")
    forced = references(len(TEXTS))

    def run_with(engine):
        runner, hooks, ids = setup(tiny, methods(shared=True)[name], engine)
        with hooks:
            _, logits, _, stream = streamed(runner, 3, ids, forced)
        return runner, hooks, ids, logits, stream

    _, _, _, eager, _ = run_with(EngineConfig())
    torch._dynamo.reset()
    counters.clear()
    runner, _, ids, compiled, stream = run_with(EngineConfig(compile=True, backend="eager"))
    assert stream.rebases >= 1 and eager.keys() == compiled.keys()
    for key, row in eager.items():
        torch.testing.assert_close(compiled[key], row, atol=1e-5, rtol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the stream's decode steps ran compiled
    streamed(runner, 3, ids, forced)  # attached again: the first hooks were removed
    assert counters["stats"]["unique_graphs"] == graphs


def test_rows_that_live_through_several_rebases_keep_all_their_columns():
    """Rows nearly as long as the cache (cap 75 in 128 columns) see it move left several times
    while they run: each rebase must move past the columns of the oldest live row, wherever
    earlier rebases put them."""
    runner, _, ids = setup(tiny_model("tiny_llama"), method_from_conf("dense"), cap=75)
    ids = (ids * 2)[:24]
    g = torch.Generator().manual_seed(1)
    forced = [torch.randint(3, 300, (75 - (7 * i) % 37,), generator=g) for i in range(len(ids))]
    _, ref_logits = alone(runner, ids, forced)
    _, logits, _, stream = streamed(runner, 6, ids, forced)
    assert stream.rebases >= 3
    for key, row in ref_logits.items():
        torch.testing.assert_close(logits[key], row, atol=1e-4, rtol=1e-4)


def test_the_callers_time_is_not_the_streams(monkeypatch):
    """What the caller does with finished work (scoring, writing) is not decode or prefill time."""
    import time

    runner, _, ids = setup(tiny_model("tiny_llama"), method_from_conf("dense"))
    timed, calls = [], []

    def slow_caller(items, completions, timing):
        timed.append(timing.prefill_s + timing.decode_s)
        calls.append(len(items))
        time.sleep(0.05)

    start = time.perf_counter()
    StreamRunner(runner, 3).run(ids, slow_caller, forced=references(len(ids)))
    wall = time.perf_counter() - start
    assert sum(calls) == len(ids)
    assert sum(timed) < wall - 0.05 * len(calls) + 0.01


def test_sliding_window_models_are_refused(monkeypatch):
    model, tok = tiny_model("tiny_qwen2")
    monkeypatch.setattr(model.config, "layer_types", ["sliding_attention", "full_attention"])
    dense = method_from_conf("dense")
    runner = BatchedRunner(model, tok, dense, adapter_for(model), SamplingConfig(4))
    with pytest.raises(UserError, match="full-attention"):
        StreamRunner(runner, 2)
