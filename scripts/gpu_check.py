"""One prepared GPU speed check at 7B shape, random weights: dense, ours, TEAL, each eager and
compiled (torch.compile with CUDA graphs), then one long generation eager vs compiled.

    python scripts/gpu_check.py [--model ds_r1_qwen_7b] [--batch-sizes 1 4 16] [--out DIR]

Needs only torch and transformers (tested against the APIs of torch 2.11 / transformers 5.17, and
PyYAML, which transformers brings): no Hydra, no project install, no network. The model is built
from `conf/model/<name>.yaml`'s `arch` with random weights in bf16 on CUDA; accuracy means nothing
here, only speed. Prints the tables last and writes them with the raw rows to --out.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the GPU machine has no project install: import from the checkout

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from baselines.dense import Dense  # noqa: E402
from bwprune.generation.runner import EngineConfig  # noqa: E402
from bwprune.methods.ours import BWAP  # noqa: E402
from bwprune.models.adapters import adapter_for  # noqa: E402
from bwprune.models.byte_tokenizer import byte_tokenizer  # noqa: E402
from bwprune.report.speed_table import markdown_table  # noqa: E402
from bwprune.speed import measure  # noqa: E402


def build_methods(model, adapter, tokenizer, sparsity: float) -> dict:
    methods = {
        "dense": Dense(),
        "ours": BWAP(sparsity),
        "ours_frozen": BWAP(sparsity, t_init=0, t_explore=0),
    }
    try:
        from baselines.teal import TEAL

        methods["teal"] = TEAL(sparsity, calibration=dict(
            text_file=str(ROOT / "bwprune/data/wikitext2/valid.txt"),
            num_sequences=8, seq_len=256, seed=0,
        ), cache_dir="/tmp/bwprune-cache")  # fmt: skip
    except ImportError:
        print("baselines.teal not available: TEAL skipped")
    for method in methods.values():
        method.prepare(model, adapter, tokenizer)
    return methods


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="ds_r1_qwen_7b")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--long-tokens", type=int, default=4096, help="0: no long generation")
    parser.add_argument("--long-batch", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=str(ROOT / "results" / "speed"))
    args = parser.parse_args()

    arch = yaml.safe_load((ROOT / "conf" / "model" / f"{args.model}.yaml").read_text())["arch"]
    config = AutoConfig.for_model(arch.pop("model_type"), **arch)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    tokenizer = byte_tokenizer()
    adapter = adapter_for(model)
    methods = build_methods(model, adapter, tokenizer, args.sparsity)
    engines = {"eager": EngineConfig(), "compiled": EngineConfig(compile=True)}
    rows = measure(
        model, tokenizer, adapter, methods, args.batch_sizes, args.new_tokens,
        repeats=args.repeats, log=print, engines=engines, with_hf_generate=False,
    )  # fmt: skip
    long_rows = []
    if args.long_tokens:  # a reasoning-length answer, one run each: compiling lands in its e2e,
        # not in its median step time
        long_methods = {k: methods[k] for k in ("dense", "ours")}
        long_rows = measure(
            model, tokenizer, adapter, long_methods, [args.long_batch], args.long_tokens,
            repeats=1, warmup=0, log=print, engines=engines, with_hf_generate=False,
        )  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    key = f"{args.model}_random_{where}".replace(" ", "_")
    record = {"args": vars(args), "rows": rows, "long": long_rows}
    (out / f"{key}.json").write_text(json.dumps(record, indent=2))
    table = markdown_table(rows)
    if long_rows:
        table += f"\nLong generation ({args.long_tokens} tokens, batch {args.long_batch}):\n\n"
        table += markdown_table(long_rows)
    (out / f"{key}.md").write_text(f"# Speed: {key} (random weights, bf16)\n\n{table}")
    print(table)


if __name__ == "__main__":
    main()
