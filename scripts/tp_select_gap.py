"""What tp_select=per_rank costs against global (bwprune/methods/sharded.py), on real activations.

python scripts/tp_select_gap.py [run.py overrides, e.g. limit=8 batch_size=4]
Generates the first `limit` problems with `ours` and records every memory vector its top-k is taken
from; for each layer and tensor-parallel size R prints the mean over those selections of the
fraction of the global top-k that per_rank misses and the fraction of its score mass lost.
Per_rank is simulated on the unsharded vector (`per_rank_gap`): same sets, no processes needed.
"""

import sys
from pathlib import Path

import torch
from omegaconf import DictConfig

from bwprune.benchmarks.selection import select_examples, work_items
from bwprune.config import build, build_method, compose_config, validate
from bwprune.errors import UserError
from bwprune.generation.prepared import prepare_model
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import SamplingConfig
from bwprune.methods.sharded import per_rank_gap

ROOT = Path(__file__).resolve().parent.parent
WORLD_SIZES = (2, 4)  # tensor-parallel sizes simulated


def recorded_memories(cfg: DictConfig) -> tuple[list[list[torch.Tensor]], list[int]]:
    """Per layer, every memory vector `ours` selected from while generating the run's batches;
    and each layer's k."""
    method = build_method(cfg.method)
    prepared = prepare_model(cfg, method)
    seen = [[] for _ in range(len(prepared.adapter.layers))]
    select = method._select  # private, read only: the vector Eq. 4 is taken from

    def recording(layer, memory):
        seen[layer].append(memory.clone())
        return select(layer, memory)

    method._select = recording
    runner = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    items = work_items(select_examples(build(cfg.benchmark).examples(), cfg), 1)
    for i in range(0, len(items), cfg.batch_size):
        runner.generate(batch_prompts(prepared.tokenizer, cfg.model, items[i : i + cfg.batch_size]))
    return seen, method.k


if __name__ == "__main__":
    try:
        cfg = compose_config(ROOT / "conf", ["method=ours", "progress=false", *sys.argv[1:]])
        validate(cfg)
        seen, ks = recorded_memories(cfg)
    except UserError as e:
        sys.exit(f"error: {e}")
    print(f"{cfg.model.name}, rho={cfg.sparsity}, {len(seen[0])} selections per layer")
    print("| layer | " + " | ".join(f"missed R={r} | mass lost R={r}" for r in WORLD_SIZES) + " |")
    for layer, memories in enumerate(seen):
        cells = []
        for r in WORLD_SIZES:
            gaps = [per_rank_gap(m, ks[layer], r) for m in memories]
            cells += [f"{sum(g[0] for g in gaps) / len(gaps):.3f}",
                      f"{sum(g[1] for g in gaps) / len(gaps):.4f}"]  # fmt: skip
        print(f"| {layer} | " + " | ".join(cells) + " |")
