"""A benchmark's static batches through `vllm.LLM`, in this process, with the HF runner's interface.

`VLLMRunner.generate_tokens` takes the HF runner's left-padded ids and gives back the same
`Completion`s and `BatchTiming` (`bwprune.generation.runner`), so evaluation, scoring, records,
resume, shards, tables and W&B treat a vLLM run like any other. vLLM's engine runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`): its scheduler then takes every request of a batch before
its first step — the static batch the method's protocol and the HF host's equality need. The
method, prepared on the HF model, is installed in vLLM's workers and bound to their forwards
through `bwprune.vllm.running.ranks`: one worker in this process, or one per tensor-parallel rank
(`generation.vllm.tensor_parallel_size`), each a process of its own.
Prompts go in as token ids and completions come back as ids, decoded by the run's tokenizer, so
both backends see and score the same text.

What each method does here (docs/vllm.md): a method that decides inside forwards runs without
prefix caching (a cached prompt is never recomputed, so its activations would never be scored,
and KV computed under one request's pruned FFN could be reused by another), compiled when asked
if its glue lives inside the FFN's opaque op (`bwprune.vllm.binding.ffn_route`; kept sets,
FFN-internal masks), else with `enforce_eager` (vLLM's compiled model would freeze its decisions at
warm-up); a static method's pruned weights are exported and loaded; a method whose pruned model vLLM
cannot load is refused.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from bwprune.engine.ledger import SparsityLedger
from bwprune.engine.protocol import MethodDriver
from bwprune.errors import choices_error
from bwprune.generation.paired import PairedSettings, timed_lengths, weight_bytes
from bwprune.generation.prepared import PreparedModel, prepare_loaded
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import BatchedRunner, BatchTiming, Completion
from bwprune.generation.timing import Precision, alternate_until
from bwprune.methods.base import PruningMethod
from bwprune.methods.host import decides_per_forward
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.models.loading import load_model
from bwprune.runs.speedup import timed_ratios
from bwprune.vllm.binding.ffn_route import SPLITTING_OP
from bwprune.vllm.binding.host import compilable, refuse_tensor_parallel
from bwprune.vllm.binding.padding import Heads, pad_heads, padding
from bwprune.vllm.running import ranks
from bwprune.vllm.running.context import context_length
from bwprune.vllm.running.cores import workers_bound
from bwprune.vllm.running.ray_cpu import ray_for_cpu_workers

UNMIXED = "bwprune.vllm.binding.scheduler.UnmixedScheduler"  # imported by vLLM, never before it

log = logging.getLogger(__name__)
COMPILE = ("auto", "true", "false")
EXECUTORS = ("mp", "ray")  # vLLM's distributed_executor_backend for more than one worker
# vLLM logs its set-up at length (and a harmless traceback: no tokenizer, by design) into a run's
# console; it reads its level once, when first imported, which a run does after this module.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


@dataclass(frozen=True)
class VLLMSettings:
    """How vLLM runs (conf/config.yaml `generation.vllm`): never what it computes."""

    compile: str  # auto (CUDA only) | true | false; never for methods deciding per forward
    kv_cache_gib: float  # KV cache memory (on CPU vLLM otherwise reserves most of the node's RAM)
    max_model_len: int | None  # longest prompt + completion; null: the model's own
    tensor_parallel_size: int = 1  # workers, each a shard of every layer (sums in another order)
    executor: str = "mp"  # how vLLM starts them: processes of its own (mp) or Ray actors

    @classmethod
    def from_config(cls, gen: Mapping) -> VLLMSettings:
        v = gen.vllm
        if str(v.compile).lower() not in COMPILE:
            raise choices_error("generation.vllm.compile", v.compile, COMPILE)
        length = None if v.max_model_len is None else int(v.max_model_len)
        executor = str(v.get("executor", "mp"))
        if executor not in EXECUTORS:
            raise choices_error("generation.vllm.executor", executor, EXECUTORS)
        return cls(str(v.compile).lower(), float(v.kv_cache_gib), length,
                   int(v.get("tensor_parallel_size", 1)), executor)  # fmt: skip


@dataclass(frozen=True)
class EngineMethod:
    """A method installed in every worker of an engine (`bwprune.vllm.running.ranks`) under `key`.
    `local`: its driver, when vLLM's one worker runs in this process (None under tensor
    parallelism: the drivers live in the workers' processes)."""

    key: str
    local: MethodDriver | None


def compilation_config(compiled: bool, glued: bool, device: torch.device) -> dict | None:
    """vLLM's compilation settings: with CUDA graphs, a method's FFN op is a splitting op
    besides the ones vLLM splits at by default (attention, KV-cache writes), and graphs are
    piecewise only, so they are captured around the op, which runs eagerly in between (a full
    graph would replay the FFN as it was captured); otherwise vLLM's defaults. Not yet run on
    a GPU (none with vLLM has been lent to this project)."""
    if not (compiled and glued and device.type == "cuda"):
        return None
    from vllm.config import CompilationConfig

    splits = [*CompilationConfig._attention_ops, "vllm::unified_kv_cache_update",
              "vllm::unified_mla_kv_cache_update", SPLITTING_OP]  # fmt: skip
    return {"splitting_ops": splits, "cudagraph_mode": "PIECEWISE"}


def plugin_architecture(model: torch.nn.Module) -> str:
    """The plugin class vLLM builds `model` with (`bwprune.vllm.binding.plugin.architecture`)."""
    from bwprune.vllm.binding.plugin import architecture
    from bwprune.vllm.binding.widths import STRUCTURE_KEY

    return architecture(type(model).__name__, hasattr(model.config, STRUCTURE_KEY))


def export_model(model: torch.nn.Module, folder: Path, size: int = 1) -> Path:
    """The model's config and weights as an HF folder vLLM loads (no tokenizer: ids in, ids out);
    a model with layers of widths of their own keeps them in its config (TriSP's). With heads
    that vLLM cannot split over `size` workers, they are padded with zero heads until it can
    (`bwprune.vllm.binding.padding`)."""
    plugin_architecture(model)
    if not (folder / "config.json").exists():
        partial_dir = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".part"))
        padded = padding(model.config, type(model).__name__, size)
        if padded is None:
            model.save_pretrained(partial_dir)
        else:
            heads = Heads.of(model.config)
            log.warning("vLLM at size %d: %d attention heads over %d KV heads padded with zero "
                        "heads to %d over %d (the same outputs; more attention work)", size,
                        heads.query, heads.kv, padded.query, padded.kv)  # fmt: skip
            state, config = pad_heads(model.state_dict(), model.config, padded)
            model.save_pretrained(partial_dir, state_dict=state)
            config.save_pretrained(partial_dir)
        partial_dir.replace(folder)  # a folder is whole or absent, also when interrupted
    return folder


def model_folder(cfg: DictConfig, prepared: PreparedModel) -> tuple[Path, bool]:
    """Where vLLM loads the run's model from, and whether that folder is the run's own (pruned
    weights: removed once loaded). Unpruned weights are exported once per model config and
    tensor-parallel size whose heads need padding."""
    root = Path(cfg.paths.cache_dir).expanduser() / "vllm"
    root.mkdir(parents=True, exist_ok=True)
    size = int(cfg.generation.vllm.get("tensor_parallel_size", 1))
    if prepared.method.edits_weights:
        return export_model(prepared.model, Path(tempfile.mkdtemp(dir=root)) / "model", size), True
    model_cfg = json.dumps(OmegaConf.to_container(cfg.model, resolve=True), sort_keys=True)
    digest = hashlib.sha256(model_cfg.encode()).hexdigest()[:12]
    heads = padding(prepared.model.config, type(prepared.model).__name__, size)
    padded = "" if heads is None else f"-heads{heads.query}x{heads.kv}"
    return export_model(prepared.model, root / f"{cfg.model.name}-{digest}{padded}", size), False


class VLLMRunner:
    """Generates a batch's completions under the run's method inside one in-process vLLM engine."""

    def __init__(self, prepared: PreparedModel, hf: BatchedRunner, folder: Path,
                 settings: VLLMSettings, slots: int, prompt_tokens: int, seed: int,
                 load_format: str = "auto", prefix_caching: bool = True,
                 tp_select: str = "global", mlp_rows: bool = True,
                 kept_weights: str = "buffers") -> None:  # fmt: skip
        """vLLM on the model in `folder` (`prepared.model`'s config and weights; with
        `load_format="dummy"` its config alone, random weights: speed checks). `hf`: the run's HF
        runner (tokenizer, sampling, stop ids and completions are shared); `slots`: the largest
        batch; `prompt_tokens`: the longest prompt (a batch's prompts must fit one forward);
        `prefix_caching=False`: off also for a method that allows it (a speed check that repeats
        its prompts, timed against an engine without it); `tp_select`: how tensor-parallel ranks
        choose kept sets (`generation.tp_select`); `mlp_rows=False`: the plugin keeps no copy of
        the MLP weights beside vLLM's packed one, for an engine whose methods never slice it
        (every method but the neuron-set ones: `bwprune.vllm.binding.plugin`); `kept_weights`:
        where the kept sets of an engine with `mlp_rows` live (`generation.kept_weights`:
        in_place holds each MLP once, `bwprune.vllm.binding.one_copy`)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # vLLM leaves a core to its scheduler process unless told the thread count; in this one
        # process it computes with the threads this process (and its HF runner) computes with.
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        from vllm import LLM

        self.hf, self.prepared, self.method = hf, prepared, prepared.method
        self.tokenizer, self.sampling, self.device = hf.tokenizer, hf.sampling, hf.device
        self.settings, self.slots, self.tp_select = settings, slots, tp_select
        self.compiled = self._compiled()
        glued = decides_per_forward(self.method)
        size = settings.tensor_parallel_size
        refuse_tensor_parallel(self.method, prepared.model, size, "the model")
        dtype = str(next(prepared.model.parameters()).dtype).removeprefix("torch.")
        longest = context_length(
            prepared.model.config, next(prepared.model.parameters()).element_size(),
            settings.kv_cache_gib, settings.max_model_len,
            prompt_tokens + self.sampling.max_new_tokens, "generation.vllm.kv_cache_gib", size,
        )  # fmt: skip
        started = time.perf_counter()
        on_cpu = self.device.type == "cpu"
        if size > 1 and settings.executor == "ray" and on_cpu:
            ray_for_cpu_workers(size)
        with workers_bound(size if on_cpu else 1):
            self.llm = LLM(
                model=str(folder), skip_tokenizer_init=True, dtype=dtype, seed=seed,
                enforce_eager=not self.compiled, tensor_parallel_size=size,
                distributed_executor_backend=settings.executor if size > 1 else None,
                enable_prefix_caching=prefix_caching and not glued,
                max_num_seqs=slots, max_model_len=longest, load_format=load_format,
                # prompts run whole, in forwards of their own (`bwprune.vllm.binding.scheduler`)
                scheduler_cls=UNMIXED, enable_chunked_prefill=False,
                max_num_batched_tokens=max(2048, slots * prompt_tokens, longest),
                kv_cache_memory_bytes=int(settings.kv_cache_gib * 2**30),
                hf_overrides={"architectures": [plugin_architecture(prepared.model)]},
                additional_config={"bwprune": {"rows": mlp_rows, "kept_weights": kept_weights}},
                compilation_config=compilation_config(self.compiled, glued, self.device),
            )  # fmt: skip
        log.info("vLLM engine ready in %.1f s (%s, %d worker%s)", time.perf_counter() - started,
                 "compiled" if self.compiled else "eager", size, "s" * (size > 1))  # fmt: skip
        if size > 1 and settings.executor == "ray":
            # at exit Ray shuts down before vLLM's finalizer stops the workers, which then fail to
            # (a traceback per worker): stop them first (atexit runs the latest registered first)
            atexit.register(self.close)
        self.rpc = self.llm.collective_rpc
        self.local = size == 1  # the one worker runs here: its objects are this process's
        self.model_runner = self.rpc(lambda worker: worker.model_runner)[0] if self.local else None
        self.model = self.model_runner.model if self.local else None
        self._installed = 0
        self._requests = itertools.count()  # static batches' request ids
        self.driver = self.driver_for(self.method, prepared.ledger)

    def close(self) -> None:
        """Stop the engine and its workers now, not when it is collected."""
        atexit.unregister(self.close)
        self.llm.llm_engine.engine_core.shutdown()

    @classmethod
    def for_run(cls, cfg: DictConfig, prepared: PreparedModel, hf: BatchedRunner,
                longest_prompt: int, prefix_caching: bool = True,
                mlp_rows: bool = True) -> VLLMRunner:  # fmt: skip
        """The engine of a run: its model (pruned weights exported, and removed once loaded),
        batch size, seed and `generation.vllm` settings, and its `generation.kept_weights`;
        `mlp_rows` as the constructor's."""
        folder, own = model_folder(cfg, prepared)
        try:
            return cls(prepared, hf, folder, VLLMSettings.from_config(cfg.generation),
                       int(cfg.batch_size), longest_prompt, int(cfg.seed),
                       prefix_caching=prefix_caching, mlp_rows=mlp_rows,
                       tp_select=str(cfg.generation.get("tp_select", "global")),
                       kept_weights=str(cfg.generation.get("kept_weights", "buffers")))  # fmt: skip
        finally:
            if own:
                shutil.rmtree(folder.parent, ignore_errors=True)

    def _compiled(self) -> bool:
        """Compile when asked (auto: on CUDA), unless the method decides outside the FFN's op:
        vLLM's compiled model drops guards, so those decisions would be frozen at warm-up."""
        wanted = self.settings.compile == "true" or (
            self.settings.compile == "auto" and self.device.type == "cuda"
        )
        if wanted and not compilable(self.method):
            log.warning("vLLM: %s masks hidden states outside the FFN, which vLLM's compiled "
                        "model would freeze at warm-up (silently dense): running it eager",
                        type(self.method).__name__)  # fmt: skip
            return False
        return wanted

    def driver_for(self, method: PruningMethod, ledger: SparsityLedger,
                   tp_select: str | None = None) -> EngineMethod:  # fmt: skip
        """`method` (prepared already, on the HF model) installed in every worker, counting into
        `ledger` (each worker's copy, under tensor parallelism), its ranks choosing by
        `tp_select` (None: the engine's)."""
        key = f"method-{self._installed}"
        self._installed += 1
        select = tp_select or self.tp_select
        self.rpc(ranks.install, args=(key, method, ledger, self.compiled, select))
        return EngineMethod(key, self.rpc(ranks.driver, args=(key,))[0] if self.local else None)

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.hf.encode(prompts)

    def generate_tokens(self, ids: torch.Tensor, attn: torch.Tensor,
                        progress: Callable[[int, int], None] | None = None,
                        ) -> tuple[list[Completion], BatchTiming]:  # fmt: skip
        """Completions for (B, T) left-padded ids, as `BatchedRunner.generate_tokens`."""
        stop = self.hf.stop_ids.tolist()
        return self.generate_with(self.driver, ids, attn, self.sampling.max_new_tokens, stop,
                                  progress)  # fmt: skip

    def generate_with(self, driver: EngineMethod, ids: torch.Tensor, attn: torch.Tensor,
                      lengths: int | list[int], stop: list[int],
                      progress: Callable[[int, int], None] | None = None,
                      ) -> tuple[list[Completion], BatchTiming]:  # fmt: skip
        """`driver`'s method generates at most `lengths` tokens per row (one for all, or one
        each), ending at a token of `stop`."""
        prompts = [row[mask.bool()].tolist() for row, mask in zip(ids, attn)]
        limits = [lengths] * len(prompts) if isinstance(lengths, int) else lengths
        params = [self.sampling_params(max_tokens=n, stop=stop) for n in limits]
        outputs, generated = self.run(driver, prompts, params, progress)
        sparsity = generated.rows
        completions = []
        for out in outputs:
            c = out.outputs[0]
            completions.append(self.hf.completion(list(c.token_ids), c.finish_reason == "stop",
                                                  sparsity[out.request_id]))  # fmt: skip
        step_s = generated.step_s
        decode_tokens = sum(r["decode_steps"] for r in sparsity.values())
        return completions, BatchTiming(generated.prefill_s, sum(step_s), decode_tokens, step_s,
                                        generated.phases)  # fmt: skip

    def sampling_params(self, max_tokens: int, stop: list[int]):
        """The run's sampling for one request: at most `max_tokens`, ending at a token of `stop`
        and at no other (vLLM's own end-of-sequence rule is off: the run's stop ids include it)."""
        from vllm import SamplingParams

        s = self.sampling
        return SamplingParams(
            temperature=s.temperature if s.do_sample else 0.0, top_p=s.top_p,
            max_tokens=max_tokens, stop_token_ids=stop, ignore_eos=True, detokenize=False,
        )  # fmt: skip

    def run(self, driver: EngineMethod, prompts: list[list[int]], params: list,
            progress: Callable[[int, int], None] | None = None,
            ) -> tuple[list, ranks.Generated]:  # fmt: skip
        """vLLM's outputs (in prompt order) and what the session that drove `driver` through
        them recorded (the first rank's: every rank decides and counts the same)."""
        engine = self.llm.llm_engine
        with self.bound(driver, None):
            ids = [str(next(self._requests)) for _ in prompts]  # counting up, in prompt order
            for request, prompt, param in zip(ids, prompts, params):
                engine.add_request(request, {"prompt_token_ids": prompt}, param)
            done = {out.request_id: out for outs in self._steps(progress) for out in outs
                    if out.finished}  # fmt: skip
            return [done[r] for r in ids], self.rpc(ranks.end)[0]

    def stream(self, prompts: list[torch.Tensor], on_finish,
               progress: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
        """Continuous batching, as `bwprune.generation.stream.StreamRunner.run`: every prompt
        (1-D ids) through `slots` seats, `max_num_seqs` at a time, in order; `on_finish(items,
        completions, timing)` receives requests as they finish, with the time since its last
        call. The run's method decides from the requests in each forward."""
        stop = self.hf.stop_ids.tolist()
        params = self.sampling_params(max_tokens=self.sampling.max_new_tokens, stop=stop)
        engine = self.llm.llm_engine
        with self.bound(self.driver, self.slots):
            for i, p in enumerate(prompts):
                engine.add_request(str(i), {"prompt_token_ids": p.tolist()}, params)
            for outs in self._steps(progress):
                done = [out for out in outs if out.finished]
                if not done:
                    continue
                finished = [out.request_id for out in done]
                summaries, timing = self.rpc(ranks.release, args=(finished,))[0]
                completions = [
                    self.hf.completion(list(out.outputs[0].token_ids),
                                       out.outputs[0].finish_reason == "stop", summary)
                    for out, summary in zip(done, summaries)
                ]  # fmt: skip
                on_finish([int(out.request_id) for out in done], completions, timing)
            self.rpc(ranks.end_stream)

    def _steps(self, progress: Callable[[int, int], None] | None) -> Iterator[list]:
        """vLLM's engine stepped until it holds no request: each step's outputs. `progress(step,
        requests in it)` after each step, counted here, in this process, at any number of
        workers (a callback does not reach workers in processes of their own)."""
        engine, step = self.llm.llm_engine, 0
        while engine.has_unfinished_requests():
            live = engine.get_num_unfinished_requests()
            outs = engine.step()
            if progress is not None:
                progress(step, live)
            step += 1
            yield outs

    @contextmanager
    def bound(self, driver: EngineMethod, slots: int | None) -> Iterator[None]:
        """`driver`'s method bound to the workers' forwards (`ranks.begin`) for the block;
        unbound on the way out, also on errors."""
        self.rpc(ranks.begin, args=(driver.key, slots))
        try:
            yield
        finally:
            self.rpc(ranks.close)


class VLLMPairedTiming:
    """The paired timing of a run in vLLM: dense vLLM redoes the method's work, alternated.

    Both sides run the same requests to the same lengths (each request's completion length under
    the method, stop tokens ignored), so they run the same forwards over the same batch shapes;
    the method side regenerates its own completions, the dense side its own tokens. Step times
    are `Session.times`'; the entry is the HF backend's (`bwprune.generation.paired`).
    """

    def __init__(self, runner: VLLMRunner, settings: PairedSettings,
                 dense: VLLMRunner | None = None) -> None:  # fmt: skip
        """`dense`: an engine on the model as loaded, for a method that edits weights (the
        run's engine holds the pruned ones); else dense runs on the run's engine."""
        self.runner, self.settings = runner, settings
        if dense is not None:
            self.dense = dense.driver
        else:
            ledger = SparsityLedger(runner.prepared.adapter, runner.device)
            self.dense = runner.driver_for(PruningMethod(), ledger)
        self.dense_runner = dense or runner
        self.weight_bytes = weight_bytes((dense or runner).prepared.model)

    def measure(self, ids: torch.Tensor, attn: torch.Tensor, completions: list[Completion],
                precision: Precision | None = None,
                progress: Callable[[dict], None] | None = None) -> dict:  # fmt: skip
        """The batch's `paired` entry, as `bwprune.generation.paired.PairedTiming.measure`'s."""
        start = time.perf_counter()
        steps = self.settings.max_steps
        lengths = timed_lengths(completions, steps)
        sides = {"method": (self.runner, self.runner.driver),
                 "dense": (self.dense_runner, self.dense)}  # fmt: skip
        trials = {side: partial(self._trial, *s, ids, attn, lengths) for side, s in sides.items()}
        precision = precision or self.settings.precision
        results, stop = alternate_until(
            trials, precision, self.settings.warmup, timed_ratios, progress
        )
        return {**results, "precision": stop, "weight_bytes": self.weight_bytes,
                "max_steps": steps, "overhead_s": time.perf_counter() - start}  # fmt: skip

    @staticmethod
    def _trial(runner: VLLMRunner, driver: EngineMethod, ids, attn, lengths: list[int]) -> dict:
        _, timing = runner.generate_with(driver, ids, attn, lengths, stop=[])
        return {"prefill_s": timing.prefill_s, "decode_s": timing.decode_s}


def vllm_engines(cfg: DictConfig, prepared: PreparedModel, hf: BatchedRunner, batches: list,
                 timed: bool) -> tuple[VLLMRunner, VLLMPairedTiming | None]:  # fmt: skip
    """A run's engine, sized so each batch's prompts fit one forward (the static batch), and its
    paired timing when `timed`: dense on the same engine, or, for a method that edits weights or
    kept sets held in place (whose engine's dense MLP computes from the kernel's panels, not
    vLLM's pack), on a second engine with the model loaded again."""
    prompts = [p for b in batches for p in batch_prompts(hf.tokenizer, cfg.model, b)]
    longest = max(len(hf.encode([p])[0][0]) for p in prompts)
    # one method per engine here: only a neuron-set method needs the MLP's rows kept beside it
    rows = isinstance(prepared.method, NeuronSetMethod)
    engine = VLLMRunner.for_run(cfg, prepared, hf, longest, mlp_rows=rows)
    if not timed:
        return engine, None
    dense = None
    in_place = rows and cfg.generation.get("kept_weights", "buffers") == "in_place"
    if prepared.method.edits_weights or in_place:
        loaded = prepare_loaded(*load_model(cfg.model, cfg.paths.cache_dir), PruningMethod())
        loaded_hf = loaded.runner(hf.sampling, int(cfg.seed), cfg.generation)
        dense = VLLMRunner.for_run(cfg, loaded, loaded_hf, longest, mlp_rows=False)
    return engine, VLLMPairedTiming(engine, PairedSettings.from_config(cfg.speed), dense)
