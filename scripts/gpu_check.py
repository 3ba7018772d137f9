"""One prepared GPU speed check at 7-8B shape with random weights: dense, ours (scheduled and with
its mask frozen) and TEAL, each eager and compiled (torch.compile, on CUDA with CUDA graphs), then
one reasoning-length generation eager vs compiled, then — where vLLM is installed (`pip install
vllm`, the CUDA build) — dense in our loop vs dense and ours inside vLLM, eager and compiled (CUDA
graphs captured around the methods' FFN op).

    python3 scripts/gpu_check.py --out DIR      # settings: conf/gpu_check.yaml; flags override

Sized for one command on a lent GPU (at most 10 minutes): it measures the first batch size, then the
long generation, then the other batch sizes, and starts a part only while the time budget lasts
(`budget_s`); the record is rewritten under --out after every part, so a stopped command still
returns what it measured; the parts it skipped, and any that failed with their errors, are named
in it.

Needs only torch and transformers (checked on CPU with torch 2.11 and transformers 5.17, the lent
machine's versions) and PyYAML, which transformers brings: no Hydra, no project install, no network.
The vLLM part needs vLLM (and the OmegaConf it brings) and is recorded as failed where it is absent.
The configs are therefore read as plain YAML: each method is built from conf/method/<name>.yaml's
own values, as run.py would build it, with sparsity, calibration and cache folder set here. The
model is conf/model/<name>.yaml's `arch` with random weights (bf16 on CUDA): only speed means
anything here.
"""

import argparse
import importlib
import json
import sys
import time
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import transformers
import yaml
from torch._dynamo.utils import counters

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the GPU machine has no project install: import from the checkout

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from bwprune.engine.protocol import MethodDriver  # noqa: E402
from bwprune.generation.runner import EngineConfig  # noqa: E402
from bwprune.generation.speed import measure, within_budget  # noqa: E402
from bwprune.generation.timing import Precision  # noqa: E402
from bwprune.models.adapters import adapter_for  # noqa: E402
from bwprune.models.byte_tokenizer import byte_tokenizer  # noqa: E402
from bwprune.report.speed_table import markdown_table  # noqa: E402

CONF = ROOT / "conf"
# method keys set by us (memory_policy: its static-batch value, as every batch here is static)
SET_HERE = ("name", "_target_", "sparsity", "calibration", "cache_dir", "memory_policy")


def read_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def plain_values(cfg: dict, where: Path) -> dict:
    """The keys of a config file that need no interpolation. A method's `${...}` keys are the ones
    this script sets itself (SET_HERE); any other would silently fall back to a Python default,
    so it is refused."""
    values = {}
    for key, value in cfg.items():
        if isinstance(value, str) and "${" in value:
            if key not in SET_HERE:
                raise SystemExit(f"{where}: {key}={value!r} needs Hydra; gpu_check cannot build it")
            continue
        values[key] = value
    return values


def calibration(settings: dict) -> dict:
    """conf/calibration/<settings[config]>.yaml, its text inside this checkout, other keys
    overridden by `settings`."""
    overrides = dict(settings)
    path = CONF / "calibration" / f"{overrides.pop('config')}.yaml"
    cfg = read_yaml(path)
    text = cfg.pop("text_file").replace("${paths.data_dir}", str(ROOT / "bwprune" / "data"))
    return {**plain_values(cfg, path), "text_file": text, **overrides}


def build_method(spec: dict, sparsity: float, settings: dict):
    """`spec` = {method: <conf/method name>, **overrides} -> the method, as its config builds it:
    the file's own values, then ours for the keys it interpolates (SET_HERE), then `spec`."""
    spec = dict(spec)
    path = CONF / "method" / f"{spec.pop('method')}.yaml"
    cfg = read_yaml(path)
    module, _, cls = cfg["_target_"].rpartition(".")
    ours = {"sparsity": sparsity, "calibration": calibration(settings["calibration"]),
            "cache_dir": settings["cache_dir"], "memory_policy": "max"}  # fmt: skip
    kwargs = {k: v for k, v in plain_values(cfg, path).items() if k not in SET_HERE}
    kwargs.update({k: v for k, v in ours.items() if k in cfg}, **spec)
    return getattr(importlib.import_module(module), cls)(**kwargs)


def parse_args() -> argparse.Namespace:
    settings = read_yaml(CONF / "gpu_check.yaml")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for key in ("model", "sparsity", "new_tokens", "prompt_len", "repeats", "warmup",
                "long_tokens", "long_batch", "budget_s", "backend", "cache_dir",
                "vllm_kv_cache_gib"):  # fmt: skip
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(settings[key]))
    for key in ("batch_sizes", "long_methods", "vllm_batch_sizes", "vllm_methods", "vllm_engines"):
        kind = type(settings[key][0])
        count = "*" if key.startswith("vllm") else "+"  # no vLLM batch size: no vLLM part
        parser.add_argument(f"--{key.replace('_', '-')}", type=kind, nargs=count)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=str(ROOT / "results" / "speed"))
    args = parser.parse_args()
    for key, value in vars(args).items():
        if value is not None:
            settings[key] = value
    return argparse.Namespace(**settings)


def build_model(args: argparse.Namespace):
    arch = dict(read_yaml(CONF / "model" / f"{args.model}.yaml")["arch"])
    config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    return model, byte_tokenizer(), adapter_for(model)


def fixed_repeats(args, repeats: int) -> Precision:
    """A lent GPU's minutes fix the count of repeats, not the width of the interval."""
    return Precision(repeats, repeats, args.half_width, args.confidence, args.budget_s)


def vllm_rows(args, model, tokenizer, adapter, methods: dict, compiled: bool, log) -> list[dict]:
    """`methods` in vLLM on this random model against dense in our loop
    (`bwprune.vllm.running.speed`), in vLLM's eager or compiled engine (on CUDA: CUDA graphs,
    captured around the methods' FFN op, `bwprune.vllm.binding.ffn_route`). On CUDA vLLM draws its
    own random weights of the same shape (a dummy load: no 15 GB written); on CPU it loads these (it
    packs a dummy load's weights for oneDNN before the plugin can keep them for slicing)."""
    import tempfile

    from bwprune.engine.ledger import SparsityLedger
    from bwprune.generation.prepared import PreparedModel
    from bwprune.generation.runner import BatchedRunner, SamplingConfig
    from bwprune.vllm.binding.plugin import register
    from bwprune.vllm.running.runner import VLLMRunner, VLLMSettings
    from bwprune.vllm.running.speed import measure_vllm

    register()  # no project install here: the entry point is not there to do it
    folder = Path(tempfile.mkdtemp())
    device = next(model.parameters()).device
    dummy = device.type == "cuda"
    (model.config if dummy else model).save_pretrained(folder)
    base = PreparedModel(model, tokenizer, adapter, methods[list(methods)[-1]],
                         SparsityLedger(adapter, device))  # fmt: skip
    hf = BatchedRunner(model, tokenizer, methods["dense"], adapter,
                       SamplingConfig(args.new_tokens, ignore_eos=True))  # fmt: skip
    settings = VLLMSettings("true" if compiled else "false", args.vllm_kv_cache_gib, None)
    engine = VLLMRunner(base, hf, folder, settings, max(args.vllm_batch_sizes), args.prompt_len,
                        seed=0, load_format="dummy" if dummy else "auto")  # fmt: skip
    return measure_vllm({"vllm_compiled" if compiled else "vllm": engine}, methods,
                        args.vllm_batch_sizes, fixed_repeats(args, args.repeats),
                        args.new_tokens, args.prompt_len, args.warmup, 0, log)  # fmt: skip


def attempt(run: Callable[[], list[dict]]) -> list[dict] | Exception:
    """A part's rows, or the error it raised (its traceback printed): one failing part (a compile
    error, say) must not cost the parts after it their one chance on a lent GPU."""
    try:
        return run()
    except Exception as error:  # recorded and printed, not swallowed
        traceback.print_exc()
        return error


def compilations() -> dict[str, int]:
    """Graphs dynamo has compiled and graphs inductor ran without CUDA graphs, so far in this
    process: a compiled part whose skips rose ran kernels without capture (torch logs why, e.g. an
    in-place write into a tensor that is not a static address), so its steps keep launch costs."""
    return {"graphs": counters["stats"]["unique_graphs"],
            "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}  # fmt: skip


def is_long(part: str) -> bool:
    return part.startswith("long")


def eager_vs_compiled(parts: list[dict]) -> str:
    """Each method eager vs compiled, from parts measured apart: the median decode step, the
    long generation's wall time, compilation included (a user pays it once per run), and the
    FFN sparsity of its sparse steps both ways — CUDA graphs replaying the hooks' in-place
    accounting are checked only here (greedy tokens of bf16 eager and compiled may part, so the
    two agree closely, not exactly)."""
    pairs: dict[tuple[str, str], dict[str, dict]] = {}
    for part in parts:
        for row in part["rows"]:
            where = "long" if is_long(part["name"]) else f"batch {row['batch_size']}"
            method, _, engine = row["method"].partition("@")
            pairs.setdefault((where, method), {})[engine or "eager"] = row
    lines = [
        "| part | method | ms/step eager | ms/step compiled | ratio "
        "| end to end s, eager / compiled (long: with compilation) "
        "| FFN sparsity of sparse steps, eager / compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    for (where, method), pair in pairs.items():
        if pair.keys() == {"eager", "compiled"}:
            (e, c) = (pair[k]["step_ms"]["median"] for k in ("eager", "compiled"))
            wall = " / ".join(f"{pair[k]['e2e_s']['median']:.2f}" for k in ("eager", "compiled"))
            ffn = " / ".join(
                f"{pair[k].get('ffn_sparse_steps', 0):.3f}" for k in ("eager", "compiled")
            )
            lines.append(
                f"| {where} | {method} | {e:.2f} | {c:.2f} | {e / c:.2f}× | {wall} | {ffn} |"
            )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


class Record:
    """The check's record, rewritten whole after every part: <out>/<key>.json and .md."""

    def __init__(self, args: argparse.Namespace) -> None:
        where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        self.key = f"{args.model}_random_{where}".replace(" ", "_")
        self.out = Path(args.out)
        versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        self.data = {"args": vars(args), **versions, "parts": [], "skipped": [], "failed": []}

    def add(self, name: str, rows: list[dict] | Exception | None, seconds: float,
            compiled: dict[str, int]) -> None:  # fmt: skip
        """A part's outcome; `compiled`: what `compilations()` rose by while it ran."""
        if rows is None:
            self.data["skipped"].append(name)
        elif isinstance(rows, Exception):
            self.data["failed"].append({"name": name, "error": f"{type(rows).__name__}: {rows}"})
        else:
            part = {"name": name, "seconds": seconds, "compiled": compiled, "rows": rows}
            self.data["parts"].append(part)
        # the batch parts' rows, as a `make bench` record holds them: `make tables` and
        # `make figures` render a committed record like one
        short = (p["rows"] for p in self.data["parts"] if not is_long(p["name"]))
        self.data["rows"] = [row for rows in short for row in rows]
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{self.key}.json").write_text(json.dumps(self.data, indent=2))
        (self.out / f"{self.key}.md").write_text(self.markdown())

    def markdown(self) -> str:
        d = self.data
        text = (f"# Speed: {self.key} (random weights)\n\n"
                f"`scripts/gpu_check.py`, torch {d['torch']}, transformers {d['transformers']}; "
                f"settings: {json.dumps(d['args'])}\n")  # fmt: skip
        for part in d["parts"]:
            table, c = markdown_table(part["rows"]), part["compiled"]
            graphs = (f"; {c['graphs']} graphs compiled, {c['cudagraph_skips']} without CUDA "
                      f"graphs" if any(c.values()) else "")  # fmt: skip
            text += f"\n## {part['name']} ({part['seconds']:.0f} s{graphs})\n\n{table}"
        if both := eager_vs_compiled(d["parts"]):
            text += f"\n## Eager vs compiled\n\n{both}"
        if d["skipped"]:
            skipped = ", ".join(d["skipped"])
            text += f"\nSkipped (time budget of {d['args']['budget_s']} s): {skipped}\n"
        for failure in d["failed"]:
            text += f"\nFailed: {failure['name']}: {failure['error']}\n"
        return text


def main() -> None:
    start = time.perf_counter()
    args = parse_args()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - start:5.0f} s] {message}", flush=True)

    model, tokenizer, adapter = build_model(args)
    log(f"{args.model}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    methods = {label: build_method(spec, args.sparsity, vars(args))
               for label, spec in args.methods.items()}  # fmt: skip
    for method in methods.values():
        MethodDriver(method, model, adapter).prepare(tokenizer)
    log(f"prepared {', '.join(methods)}")
    engines = {"eager": EngineConfig(backend=args.backend),
               "compiled": EngineConfig(compile=True, backend=args.backend)}  # fmt: skip
    timing = dict(prompt_len=args.prompt_len, log=log, with_hf_generate=False)

    def batch(size: int, engine: str) -> list[dict]:
        repeats = fixed_repeats(args, args.repeats)
        return measure(model, tokenizer, adapter, methods, [size], repeats, args.new_tokens,
                       warmup=args.warmup, engines={engine: engines[engine]}, **timing)  # fmt: skip

    def long() -> list[dict]:  # one run each, no warm-up: the compiled run pays its compilation
        chosen = {k: methods[k] for k in dict.fromkeys(["dense", *args.long_methods])}
        return measure(model, tokenizer, adapter, chosen, [args.long_batch], fixed_repeats(args, 1),
                       args.long_tokens, warmup=0, engines=engines, **timing)  # fmt: skip

    def in_vllm(compiled: bool) -> list[dict]:
        chosen = {k: methods[k] for k in args.vllm_methods}
        return vllm_rows(args, model, tokenizer, adapter, chosen, compiled, log)

    # Eager and compiled are parts of their own (speedups are against dense on the same engine),
    # so the first record comes before any compilation and the budget is weighed finely.
    first, *others = args.batch_sizes
    parts = [(f"batch {first}, {e}", partial(batch, first, e)) for e in engines]
    if args.long_tokens:
        parts.append((f"long: {args.long_tokens} tokens at batch {args.long_batch}", long))
    parts += [(f"batch {b}, {e}", partial(batch, b, e)) for b in others for e in engines]
    if args.vllm_batch_sizes:
        parts += [(f"vllm {e}: batch {args.vllm_batch_sizes}", partial(in_vllm, e == "compiled"))
                  for e in args.vllm_engines]  # fmt: skip
    record = Record(args)
    parts = [(name, partial(attempt, run)) for name, run in parts]
    seen = compilations()
    for name, rows, seconds in within_budget(parts, start + args.budget_s):
        now = compilations()
        compiled, seen = {k: now[k] - seen[k] for k in now}, now
        failed = " (failed)" if isinstance(rows, Exception) else ""
        log(f"{name}: skipped, the budget would not hold it" if rows is None
            else f"{name}: {seconds:.0f} s{failed}, compiled {compiled}")  # fmt: skip
        record.add(name, rows, seconds, compiled)
    print(record.markdown())


if __name__ == "__main__":
    main()
