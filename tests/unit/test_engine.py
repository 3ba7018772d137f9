"""The decode engine: static KV cache, compiled step, live-row compaction — each against the eager
reference (dynamic cache, no compile, no compaction), token for token, for every method family."""

from __future__ import annotations

import io

import pytest
import torch
from torch._dynamo.utils import counters
from tqdm import tqdm

from baselines.teal import TEAL
from bwprune.engine.rows import bucket
from bwprune.generation.evaluate import BatchProgress
from bwprune.generation.runner import BatchedRunner, EngineConfig, Forcing, SamplingConfig
from bwprune.methods.base import PruningMethod
from bwprune.methods.thresholds import SiteCost
from bwprune.models.adapters import adapter_for
from tests.conftest import PROMPTS, chat, kv_addresses, method_from_conf, prepared, tiny_model

REFERENCE = EngineConfig(kv_cache="dynamic", compaction=False)
N = 30  # ours below: t_init 2, then periods of 3 sparse + 2 dense steps


def hand_set(name: str, threshold: float, **args) -> PruningMethod:
    """TEAL or CATS whose `prepare` sets `threshold` everywhere (no calibration), and the costs
    its own `prepare` would."""
    method = method_from_conf(name, sparsity=0.5, calibration={"x": 1}, **args)

    def prepare(model, adapter, tok):  # [layer][site], as the method's `prepare` sets them
        method.thresholds = [[threshold] * len(method.sites) for _ in adapter.layers]
        if name == "teal":
            method.costs = [TEAL._costs(adapter, i) for i in range(len(adapter.layers))]
        else:
            method.costs = [[SiteCost(1.0 / f.d_ff, float(f.up.in_features + f.down.out_features))]
                            for f in adapter.ffns()]  # fmt: skip

    method.prepare = prepare
    return method


def methods(shared: bool = True, teal: float = 0.02) -> dict:
    """One method per family; the threshold methods with a hand-set threshold (no calibration)."""
    return {
        "dense": method_from_conf("dense"),
        "ours": method_from_conf("ours", sparsity=0.5, t_init=2, t_prune=3, t_explore=2),
        "griffin": method_from_conf("griffin", sparsity=0.5),
        "teal": hand_set("teal", teal, shared_mask=shared),
        "cats": hand_set("cats", 0.05, shared_mask=shared),
    }


def generate(model, tok, method, engine, prompts=PROMPTS, lengths=None, n=N, runner=None):
    """(completions, (steps, B, V) logits): free greedy generation, or teacher-forced on fixed
    tokens with per-row `lengths` (rows finish at different steps)."""
    adapter = adapter_for(model)
    prepared(method, model, tok)
    runner = runner or BatchedRunner(model, tok, method, adapter, SamplingConfig(n), engine=engine)
    ids, attn = runner.encode(chat(tok, prompts))
    forced = None
    if lengths is not None:
        tokens = torch.randint(
            3, 300, (len(prompts), n), generator=torch.Generator().manual_seed(0)
        )
        forced = Forcing(tokens, torch.tensor(lengths))
    logits: list[torch.Tensor] = []
    out, _ = runner.generate_tokens(
        ids, attn, forced=forced, observe=lambda i, x: logits.append(x.clone())
    )
    return out, torch.stack(logits)


@pytest.mark.parametrize("name", ["dense", "ours", "griffin", "teal", "cats"])
def test_static_cache_generates_the_reference_tokens(tiny, name):
    model, tok = tiny
    ref, _ = generate(model, tok, methods()[name], REFERENCE)
    out, _ = generate(model, tok, methods()[name], EngineConfig(compaction=False))
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    assert [c.sparsity for c in out] == [c.sparsity for c in ref]


def test_a_decode_step_allocates_no_cache_and_batches_reuse_it():
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    dense = method_from_conf("dense")
    runner = BatchedRunner(model, tok, dense, adapter, SamplingConfig(12, ignore_eos=True))
    seen: list[list[int]] = []
    step = runner.step
    runner.step = lambda cache, *a: (seen.append(kv_addresses(cache)), step(cache, *a))[1]
    runner.generate(chat(tok, PROMPTS))
    runner.generate(chat(tok, PROMPTS[::-1]))  # same batch size, other prompt lengths
    assert len(seen) == 22 and all(ptrs == seen[0] for ptrs in seen)


@pytest.mark.parametrize("name", ["dense", "ours", "griffin", "teal", "cats"])
def test_compaction_changes_no_completion(tiny, name):
    """Rows finish at 3, 5 and 30 tokens of a batch of 4: the batch shrinks to 2, then 1 rows.
    What the surviving rows compute — every batch-shared decision included — is unchanged."""
    model, tok = tiny
    prompts, lengths = [*PROMPTS, "Two plus two?"], [N, 3, 5, 3]
    ref, ref_logits = generate(model, tok, methods()[name], REFERENCE, prompts, lengths)
    out, logits = generate(model, tok, methods()[name], EngineConfig(), prompts, lengths)
    assert [c.sparsity for c in out] == [c.sparsity for c in ref]
    assert [(c.token_ids, c.finish_reason) for c in out] == [
        (c.token_ids, c.finish_reason) for c in ref
    ]
    for b, n in enumerate(lengths):  # the logits each row's own steps produced
        torch.testing.assert_close(logits[:n, b], ref_logits[:n, b], atol=1e-5, rtol=1e-5)
        assert torch.equal(logits[:n, b].argmax(-1), ref_logits[:n, b].argmax(-1))


def test_buckets_are_powers_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]


@pytest.mark.parametrize("name", ["dense", "ours", "griffin", "teal", "cats"])
def test_compiled_step_generates_the_reference_tokens_and_never_recompiles(name):
    """Dynamo capture (backend `eager`: the same graph without code generation) of the decode
    step: the same tokens, and after the first batch no new graph — across mask refreshes,
    ours' dense/sparse alternation and a new batch of the same size. Off CUDA every step runs
    compiled, ours' observing steps too: their observers run at run time, through an op."""
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    ref, _ = generate(model, tok, methods()[name], REFERENCE)
    torch._dynamo.reset()
    counters.clear()
    method = methods()[name]
    engine = EngineConfig(compile=True, backend="eager", compaction=False)
    runner = BatchedRunner(model, tok, method, adapter, SamplingConfig(N), engine=engine)
    out, _ = generate(model, tok, method, engine, runner=runner)
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    assert [c.sparsity for c in out] == [c.sparsity for c in ref]  # accounting inside the graph
    graphs = counters["stats"]["unique_graphs"]
    assert 1 <= graphs <= 2  # every method compiles; ours: a sparse and a dense step
    assert not runner.step._said_eager
    generate(model, tok, method, engine, prompts=PROMPTS[::-1], runner=runner)
    assert counters["stats"]["unique_graphs"] == graphs


def test_one_model_compiled_under_several_methods_runs_each_methods_own_graph():
    """Paired timing and cost searches run dense and a hooked method on one model in one
    process: a graph traced without TEAL's hooks (or with other thresholds) must not serve it."""
    model, tok = tiny_model("tiny_llama")
    torch._dynamo.reset()
    engine = EngineConfig(compile=True, backend="eager", compaction=False)

    def make(name: str, threshold: float | None) -> PruningMethod:
        return methods(teal=threshold or 0.02)[name]

    for name, threshold in [("dense", None), ("teal", 0.02), ("teal", 0.08), ("cats", None),
                            ("dense", None)]:  # fmt: skip
        ref, _ = generate(model, tok, make(name, threshold), REFERENCE)
        out, _ = generate(model, tok, make(name, threshold), engine)
        assert [c.token_ids for c in out] == [c.token_ids for c in ref]
        assert [c.sparsity for c in out] == [c.sparsity for c in ref]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ours", "teal"])
def test_inductor_compiled_step_generates_the_reference_tokens(name):
    """Inductor's generated code (the GPU engine's backend) gives the eager tokens and sparsity.
    Ours compiles both of its graphs (dense exploration steps, the sliced step) and TEAL its
    threshold hooks with their accounting; every method's capture is checked above under the
    `eager` backend, so dense and CATS are left out here (a cold compile costs ~8-18 s each)."""
    model, tok = tiny_model("tiny_qwen2")
    ref, _ = generate(model, tok, methods()[name], REFERENCE)
    out, _ = generate(model, tok, methods()[name], EngineConfig(compile=True, compaction=False))
    assert [c.token_ids for c in out] == [c.token_ids for c in ref]
    for got, want in zip(out, ref):  # generated code may sum the skipped counts in another order
        assert got.sparsity.keys() == want.sparsity.keys()
        for key, value in want.sparsity.items():
            assert got.sparsity[key] == pytest.approx(value, rel=1e-12), key


@pytest.mark.parametrize("name", ["teal", "cats"])
def test_threshold_accounting_keeps_its_address_across_steps_and_batches(name):
    """A CUDA graph replays the hooks' in-place adds only into static addresses (and re-records
    when one moves): each decode step of a batch size accounts into the same tensors, marked
    static, across batches and attaches (every batch attaches anew)."""
    model, tok = tiny_model("tiny_llama")
    adapter = adapter_for(model)
    method = methods()[name]
    prepared(method, model, tok)
    runner = BatchedRunner(model, tok, method, adapter, SamplingConfig(6, ignore_eos=True))
    seen: list[tuple[int, ...]] = []
    end_step = method.end_step

    def spy(ctx):
        out = end_step(ctx)
        if out is not None:
            seen.append((out.ffn.data_ptr(), out.params.data_ptr()))
            assert all(hasattr(t, "_dynamo_static_input_type") for t in (out.ffn, out.params))
        return out

    method.end_step = spy
    for prompts in (PROMPTS, PROMPTS[::-1]):
        runner.generate(chat(tok, prompts))
    assert len(seen) == 10 and len(set(seen)) == 1


def test_progress_inside_a_batch_sees_every_step_and_the_live_rows():
    model, tok = tiny_model("tiny_llama")
    calls: list[tuple[int, int]] = []
    adapter = adapter_for(model)
    dense = method_from_conf("dense")
    runner = BatchedRunner(model, tok, dense, adapter, SamplingConfig(6))
    ids, attn = runner.encode(chat(tok, PROMPTS))
    forced = Forcing(torch.full((3, 6), 50), torch.tensor([6, 2, 4]))
    runner.generate_tokens(ids, attn, forced=forced, progress=lambda *a: calls.append(a))
    assert calls == [(0, 3), (1, 2), (2, 2), (3, 1), (4, 1)]
    bar = tqdm(total=1, file=io.StringIO())
    show = BatchProgress(bar, every_s=0.0)
    show(41, 3)
    assert "step 42, live rows 3" in bar.postfix
