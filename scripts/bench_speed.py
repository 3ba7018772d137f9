"""`make bench`: decode speed of several methods in one process -> results/speed/<key>.{json,md}.

python scripts/bench_speed.py [config overrides, e.g. model=tiny_llama bench.batch_sizes=[1]]
"""

import json
import sys
from pathlib import Path

import torch

from bwprune.config import build_method, compose_config
from bwprune.models.adapters import adapter_for
from bwprune.models.loading import load_model
from bwprune.records import provenance
from bwprune.report.speed_table import markdown_table
from bwprune.speed import measure

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    cfg = compose_config(ROOT / "conf", ["+bench=default", *overrides])
    bench = cfg.bench
    torch.set_num_threads(bench.threads)
    model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
    adapter = adapter_for(model)
    methods = {}
    for label, method_overrides in bench.methods.items():
        method_cfg = compose_config(
            ROOT / "conf", ["+bench=default", *overrides, *method_overrides]
        )
        method_cfg = method_cfg.method
        methods[label] = build_method(method_cfg)
        methods[label].prepare(model, adapter, tokenizer)
    rows = measure(
        model, tokenizer, adapter, methods, list(bench.batch_sizes), bench.new_tokens,
        bench.prompt_len, bench.repeats, bench.warmup, cfg.seed, bench.hf_generate, log=print,
    )  # fmt: skip
    device = str(next(model.parameters()).device)
    key = f"{cfg.model.name}_{device.split(':')[0]}_{torch.get_num_threads()}t"
    out = Path(cfg.paths.results_dir) / "speed"
    out.mkdir(parents=True, exist_ok=True)
    table = markdown_table(rows)
    record = {
        "key": key,
        "bench": dict(bench),
        "rows": rows,
        "provenance": provenance(cfg.seed, device),
    }
    (out / f"{key}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    (out / f"{key}.md").write_text(f"# Speed: {key}\n\n{table}")
    print(table)
    print(f"wrote {out / key}.json and .md")


if __name__ == "__main__":
    main(sys.argv[1:])
