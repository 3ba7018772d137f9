"""`make bench`: decode speed of several methods in one process -> results/speed/<key>.{json,md}.

python scripts/bench_speed.py [config overrides, e.g. model=tiny_llama bench.batch_sizes=[1]]

Seven measurements (`bench.parts`), each alternated and repeated in one process
(conf/bench/default.yaml): the methods on the configured model under every engine (eager,
compiled), the per-step overhead on a thin 28-layer model (eager vs compiled), live-row
compaction on a batch whose rows stop at very different lengths, static vs continuous
batching of a heavy-tailed workload, the vLLM part on each real model (in a process of its own
per model, so that one model's memory is freed before the next loads), vLLM (dense HF loop vs
dense vLLM, methods in vLLM), and vLLM on tensor-parallel workers (one engine per size, on a
model whose heads divide by them).
"""

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn
from transformers import PreTrainedTokenizerBase

from bwprune.config import build_method, compose_config
from bwprune.engine.protocol import MethodDriver
from bwprune.generation.runner import EngineConfig
from bwprune.generation.speed import measure, measure_compaction, measure_streaming
from bwprune.generation.timing import Precision
from bwprune.methods.base import PruningMethod
from bwprune.models.adapters import ModelAdapter, adapter_for
from bwprune.models.loading import load_model
from bwprune.report.speed_table import compaction_line, markdown_table, phase_table, stream_line
from bwprune.runs.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("methods", "overhead", "compaction", "stream", "vllm_models", "vllm", "vllm_tp")


def main(overrides: list[str]) -> None:
    cfg = compose_config(ROOT / "conf", ["+bench=default", *overrides])
    bench = cfg.bench
    parts = list(bench.parts)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        sys.exit(f"error: bench.parts={unknown} unknown; choose from {list(PARTS)}")
    torch.set_num_threads(bench.threads)
    engines = {k: EngineConfig(**OmegaConf.to_container(v)) for k, v in bench.engines.items()}
    precision = Precision.from_config(bench)
    model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
    adapter = adapter_for(model)
    record: dict = {"bench": OmegaConf.to_container(bench)}
    text = ""
    if "methods" in parts:
        methods = prepared(bench.methods, overrides, model, adapter, tokenizer)
        record["rows"] = measure(
            model, tokenizer, adapter, methods, list(bench.batch_sizes), precision,
            bench.new_tokens, bench.prompt_len, bench.warmup, cfg.seed, bench.hf_generate,
            log=print, engines=engines, in_place=bench.get("in_place", []),
        )  # fmt: skip
        text += f"{markdown_table(record['rows'])}\n{phase_table(record['rows'])}\n"
    if "overhead" in parts:
        thin_overrides = [*overrides, f"model={bench.overhead.model}"]
        thin_cfg = compose_config(ROOT / "conf", ["+bench=default", *thin_overrides]).model
        thin, thin_tok = load_model(thin_cfg, cfg.paths.cache_dir)
        thin_adapter = adapter_for(thin)
        probes = prepared(bench.overhead.methods, thin_overrides, thin, thin_adapter, thin_tok)
        record["overhead"] = measure(
            thin, thin_tok, thin_adapter, probes, list(bench.overhead.batch_sizes), precision,
            bench.overhead.new_tokens, bench.prompt_len, bench.warmup, cfg.seed,
            with_hf_generate=False, log=print, engines=engines,
        )  # fmt: skip
        table = markdown_table(record["overhead"])
        text += f"Overhead probe ({bench.overhead.model}):\n\n{table}\n"
    if "compaction" in parts:
        record["compaction"] = measure_compaction(
            model, tokenizer, adapter, precision, **bench.compaction, warmup=bench.warmup
        )
        text += f"{compaction_line(record['compaction'])}\n"
    if "stream" in parts:
        record["stream"] = measure_streaming(
            model, tokenizer, adapter, precision, **bench.stream, prompt_len=bench.prompt_len,
            warmup=bench.warmup, seed=cfg.seed,
        )  # fmt: skip
        text += f"\n{stream_line(record['stream'])}\n"
    device = str(next(model.parameters()).device)
    if "vllm_models" in parts:  # before vLLM starts here: each model's part has the memory
        record["vllm_models"] = {}
        for name in bench.vllm_models.models:
            rows, how = model_part(name, bench.vllm_models, overrides, device)
            record["vllm_models"][name] = rows
            text += f"vLLM on {name} ({how}):\n\n"
            text += f"{markdown_table(rows)}\n\n{phase_table(rows)}\n" if rows else "\n"
    if "vllm" in parts:  # last: vLLM's engine stays in this process once started
        v = bench.vllm
        record["vllm"], how = vllm_part(cfg, overrides, model, tokenizer, v.engines, v.methods,
                                        list(v.batch_sizes), v.hf_loop,
                                        bench.get("in_place", []))  # fmt: skip
        text += f"vLLM ({how}, in this process):\n\n{markdown_table(record['vllm'])}\n"
        text += f"\n{phase_table(record['vllm'])}\n"
    if "vllm_tp" in parts:
        tp = bench.vllm_tp
        tp_overrides = [*overrides, f"model={tp.model}"]
        tp_cfg = compose_config(ROOT / "conf", ["+bench=default", *tp_overrides])
        tp_model, tp_tokenizer = load_model(tp_cfg.model, cfg.paths.cache_dir)
        engines = {f"tp{n}": {"compile": "false", "tensor_parallel_size": n} for n in tp.sizes}
        record["vllm_tp"], how = vllm_part(tp_cfg, tp_overrides, tp_model, tp_tokenizer, engines,
                                           tp.methods, list(tp.batch_sizes))  # fmt: skip
        text += (
            f"vLLM on tensor-parallel workers ({tp.model}, {how}; tp<n>: n workers):\n\n"
            f"{markdown_table(record['vllm_tp'])}\n\n{phase_table(record['vllm_tp'])}\n"
        )
    key = record_key(cfg.model.name, device, parts)
    record = {"key": key, **record, "provenance": provenance(cfg.seed, device)}
    out = Path(cfg.paths.results_dir) / "speed"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{key}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (out / f"{key}.md").write_text(f"# Speed: {key}\n\n{text}")
    print(text)
    print(f"wrote {out / key}.json and .md")


def record_key(model: str, device: str, parts: list[str]) -> str:
    """The name of a record: model, device, threads, and its parts unless it has all."""
    key = f"{model}_{device.split(':')[0]}_{torch.get_num_threads()}t"
    return key if set(parts) == set(PARTS) else key + "_" + "_".join(p for p in PARTS if p in parts)


def model_part(name: str, spec, overrides: list[str], device: str) -> tuple[list[dict], str]:
    """The vLLM part on model `name` (`bench.vllm_models`), run by this script in a process of
    its own: its rows and how it ran. The process writes its record into a scratch folder, read
    back here: under results/speed/ it would take the name of that model's own `bench.parts=[vllm]`
    record and replace it (one made with other batch sizes or lengths). This run's other
    overrides go with it, but for the keys the part sets. A model that is not installed is a
    line in the record, not the end of a bench that has run for an hour."""
    mine = [
        f"model={name}", "bench.parts=[vllm]", f"bench.vllm.batch_sizes={list(spec.batch_sizes)}",
        f"bench.new_tokens={spec.new_tokens}", f"bench.vllm.hf_loop={str(spec.hf_loop).lower()}",
        *spec.overrides,
    ]  # fmt: skip
    set_here = {o.split("=")[0].lstrip("~+") for o in mine} | {"bench.vllm_models",
                                                               "paths.results_dir"}  # fmt: skip
    passed = [o for o in overrides if not o.split("=")[0].lstrip("~+").startswith(
        tuple(set_here))]  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, str(Path(__file__).resolve()), *passed, *mine,
                   f"paths.results_dir={scratch}"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"vLLM on {name}: not measured ({why})")
            return [], f"not measured: {why}"
        path = Path(scratch) / "speed" / f"{record_key(name, device, ['vllm'])}.json"
        return json.loads(path.read_text())["vllm"], "its own process"


def vllm_part(cfg, overrides: list[str], model: nn.Module, tokenizer, engine_specs: Mapping,
              method_specs: Mapping, batch_sizes: list[int], hf_loop: bool = True,
              in_place: Sequence[str] = ()) -> tuple[list[dict], str]:  # fmt: skip
    """Dense in our HF loop (unless not `hf_loop`) and in vLLM, and `method_specs` (label ->
    overrides) in vLLM, at `batch_sizes`, in each of `engine_specs` (label -> `generation.vllm`
    overrides); and how vLLM ran. A method that edits weights (TriSP's smaller model) is
    prepared on a copy of the model loaded again and runs in engines of its own, timed against
    dense vLLM as the others are; so do the labels in `in_place`, in engines that hold each MLP
    once (`generation.kept_weights=in_place`)."""
    from bwprune.generation.prepared import prepare_loaded
    from bwprune.generation.runner import SamplingConfig
    from bwprune.vllm.running.runner import VLLMRunner
    from bwprune.vllm.running.speed import measure_vllm

    bench = cfg.bench
    top = max(batch_sizes)

    def engines_for(pruned=None, *extra: str) -> dict[str, VLLMRunner]:
        """An engine per `bench.vllm.engines` label, on `model` built for ours (no prefix
        caching), or on `pruned` (a prepared copy) with prefix caching off too: each trial
        repeats the prompts. `extra`: more overrides of the engines' config."""
        out = {}
        for label, settings in engine_specs.items():
            engine_cfg = compose_config(ROOT / "conf", [
                "+bench=default", *overrides, "method=ours", f"batch_size={top}",
                *(f"generation.vllm.{k}={v}" for k, v in settings.items()), *extra,
            ])  # fmt: skip
            base = pruned or prepare_loaded(model, tokenizer, build_method(engine_cfg.method))
            hf = base.runner(SamplingConfig(bench.new_tokens, ignore_eos=True), cfg.seed,
                             engine_cfg.generation)  # fmt: skip
            out[label] = VLLMRunner.for_run(engine_cfg, base, hf, bench.prompt_len,
                                            prefix_caching=False)  # fmt: skip
        return out

    engines = engines_for()
    adapter = next(iter(engines.values())).prepared.adapter
    built = {label: build_method(compose_config(ROOT / "conf", [
        "+bench=default", *overrides, *method_overrides]).method)
        for label, method_overrides in method_specs.items()}  # fmt: skip
    methods, own = {}, {}
    for label, method in built.items():
        if method.edits_weights:
            own[label] = engines_for(prepare_loaded(*load_model(cfg.model, cfg.paths.cache_dir),
                                                    method))  # fmt: skip
        elif label in in_place:
            own[label] = engines_for(prepare_loaded(model, tokenizer, method),
                                     "generation.kept_weights=in_place")  # fmt: skip
        else:
            MethodDriver(method, model, adapter).prepare(tokenizer)
            methods[label] = method
    rows = measure_vllm(
        engines, methods, batch_sizes, Precision.from_config(bench),
        bench.new_tokens, bench.prompt_len, bench.warmup, cfg.seed, log=print, own=own,
        hf_loop=hf_loop,
    )  # fmt: skip
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    how = ", ".join(f"{label}: {'compiled' if e.compiled else 'eager'}{cores(e)}"
                    for label, e in engines.items())  # fmt: skip
    return rows, f"{dtype}; {how}"


def cores(engine) -> str:
    """Where a CPU engine's workers run, if it has more than one."""
    from bwprune.vllm.running.cores import binding

    size = engine.settings.tensor_parallel_size
    if size == 1 or engine.device.type != "cpu":
        return ""
    return f" on cores {binding(size)}"


def prepared(
    specs: Mapping[str, list[str]],
    overrides: list[str],
    model: nn.Module,
    adapter: ModelAdapter,
    tokenizer: PreTrainedTokenizerBase,
) -> dict[str, PruningMethod]:
    """Label -> method built from `overrides` + its own config overrides, prepared on `model`."""
    methods = {}
    for label, method_overrides in specs.items():
        method_cfg = compose_config(
            ROOT / "conf", ["+bench=default", *overrides, *method_overrides]
        )
        methods[label] = build_method(method_cfg.method)
        MethodDriver(methods[label], model, adapter).prepare(tokenizer)
    return methods


if __name__ == "__main__":
    main(sys.argv[1:])
