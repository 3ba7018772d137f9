"""Which kernel runs a kept set on this CPU, and what a refresh costs in it (docs/vllm.md).

    python scripts/bench_ffn_kernels.py [config overrides, e.g. sparsity=0.5 model=smollm2_135m]

Times, alternated over random weights of the model's FFN shape (every layer its own), vLLM's
fused-MoE kernel on packed panels (what the vLLM host runs), oneDNN on kept slices packed anew
(the alternative to writing kept sets in place), plain `F.linear` on the slices, and oneDNN on
the whole FFN; then a refresh of the packed kept sets that replaces `bench.vllm.refresh_churn` of
each (one thread).
"""

import sys
from pathlib import Path

import torch

from bwprune.config import compose_config
from bwprune.methods.neuron_scores import kept_count
from bwprune.models.loading import load_model
from bwprune.vllm.running.speed import measure_ffn_kernels, measure_refresh

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    cfg = compose_config(ROOT / "conf", ["+bench=default", *sys.argv[1:]])
    torch.set_num_threads(cfg.bench.threads)
    config = load_model(cfg.model, cfg.paths.cache_dir)[0].config
    d_ff = config.intermediate_size
    rows = measure_ffn_kernels(config.hidden_size, d_ff, kept_count(d_ff, cfg.sparsity),
                               config.num_hidden_layers, [1, 4, 16], repeats=15)  # fmt: skip
    print(
        f"{cfg.model.name}: {config.num_hidden_layers} FFNs {config.hidden_size} -> {d_ff}, "
        f"{kept_count(d_ff, cfg.sparsity)} kept, {torch.get_num_threads()} threads; ms, medians"
    )
    print("| batch | " + " | ".join(k for k in rows[0] if k != "batch_size") + " |")
    for r in rows:
        print(f"| {r['batch_size']} | " + " | ".join(f"{v:.2f}" for k, v in r.items()
                                                     if k != "batch_size") + " |")  # fmt: skip
    refresh = measure_refresh(
        config.hidden_size,
        d_ff,
        kept_count(d_ff, cfg.sparsity),
        config.num_hidden_layers,
        cfg.bench.vllm.refresh_churn,
        repeats=15,
    )
    print(f"refresh of {cfg.bench.vllm.refresh_churn:.0%} of each kept set, one thread: "
          f"{refresh['bookkeeping_ms']:.2f} ms slot bookkeeping + {refresh['writes_ms']:.2f} ms "
          f"writes; {refresh['panels_written']:.1f} of {refresh['panels']} gate|up panels written "
          "per layer")  # fmt: skip
