"""`make bench`: decode speed of several methods in one process -> results/speed/<key>.{json,md}.

python scripts/bench_speed.py [config overrides, e.g. model=tiny_llama bench.batch_sizes=[1]]

Three measurements, each alternated and repeated in this one process (conf/bench/default.yaml):
the methods on the configured model under every engine (eager, compiled), the per-step overhead
on a thin 28-layer model (eager vs compiled), and live-row compaction on a batch whose rows stop
at very different lengths.
"""

import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from baselines.dense import Dense
from bwprune.config import build_method, compose_config
from bwprune.generation.runner import EngineConfig
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model
from bwprune.provenance import provenance
from bwprune.report.speed_table import compaction_line, markdown_table
from bwprune.speed import measure, measure_compaction

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    cfg = compose_config(ROOT / "conf", ["+bench=default", *overrides])
    bench = cfg.bench
    torch.set_num_threads(bench.threads)
    engines = {k: EngineConfig(**OmegaConf.to_container(v)) for k, v in bench.engines.items()}
    model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
    adapter = adapter_for(model)
    methods = {}
    for label, method_overrides in bench.methods.items():
        method_cfg = compose_config(
            ROOT / "conf", ["+bench=default", *overrides, *method_overrides]
        )
        methods[label] = build_method(method_cfg.method)
        methods[label].prepare(model, adapter, tokenizer)
    rows = measure(
        model, tokenizer, adapter, methods, list(bench.batch_sizes), bench.new_tokens,
        bench.prompt_len, bench.repeats, bench.warmup, cfg.seed, bench.hf_generate, log=print,
        engines=engines,
    )  # fmt: skip
    compaction = measure_compaction(model, tokenizer, adapter, **bench.compaction)
    thin_cfg = compose_config(ROOT / "conf", [f"model={bench.overhead.model}"]).model
    thin, thin_tok = load_model(thin_cfg, cfg.paths.cache_dir)
    overhead = measure(
        thin, thin_tok, adapter_for(thin), {"dense": Dense()}, list(bench.overhead.batch_sizes),
        bench.overhead.new_tokens, bench.prompt_len, bench.repeats, bench.warmup, cfg.seed,
        with_hf_generate=False, log=print, engines=engines,
    )  # fmt: skip
    device = str(next(model.parameters()).device)
    key = f"{cfg.model.name}_{device.split(':')[0]}_{torch.get_num_threads()}t"
    out = Path(cfg.paths.results_dir) / "speed"
    out.mkdir(parents=True, exist_ok=True)
    text = (
        f"{markdown_table(rows)}\nOverhead probe ({bench.overhead.model}):\n\n"
        f"{markdown_table(overhead)}\n{compaction_line(compaction)}\n"
    )
    record = {
        "key": key,
        "bench": OmegaConf.to_container(bench),
        "rows": rows,
        "overhead": overhead,
        "compaction": compaction,
        "provenance": provenance(cfg.seed, device),
    }
    (out / f"{key}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (out / f"{key}.md").write_text(f"# Speed: {key}\n\n{text}")
    print(text)
    print(f"wrote {out / key}.json and .md")


if __name__ == "__main__":
    main(sys.argv[1:])
