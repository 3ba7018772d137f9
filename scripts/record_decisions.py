"""What a neuron-set method decided, forward by forward, to compare two checkouts or two engines.

    python scripts/record_decisions.py record OUT.pt [overrides]   # e.g. generation.backend=vllm
    python scripts/record_decisions.py compare A.pt B.pt

`record` generates one batch of the benchmark's selected problems (`limit`, `subset`,
`batch_size`, `generation.max_new_tokens`) and saves the completions' tokens and realized
sparsity and, at every forward, the kept set of every layer. Run it under another checkout (a
`git worktree` of an older commit, with PYTHONPATH pointing at it) to record what that code
decided. `compare` prints, as one JSON line, whether the completions are equal and how many
(forward, layer) kept sets differ (as sets: their order is where a host puts them). Used to
check that a change to how kept sets are stored leaves the decisions and completions of `ours` as
they were (docs/engine.md, results/LOG.md).
"""

import json
import sys
from pathlib import Path

import torch

from bwprune.benchmarks.selection import select_examples
from bwprune.config import build, build_method, compose_config
from bwprune.generation.prepared import prepare_loaded
from bwprune.generation.prompts import batch_prompts
from bwprune.generation.runner import SamplingConfig
from bwprune.models.loading import load_model

ROOT = Path(__file__).resolve().parent.parent


def record(out: Path, overrides: list[str]) -> None:
    cfg = compose_config(ROOT / "conf", overrides)
    model, tokenizer = load_model(cfg.model, cfg.paths.cache_dir)
    method = build_method(cfg.method)
    prepared = prepare_loaded(model, tokenizer, method)
    examples = select_examples(build(cfg.benchmark).examples(), cfg)[: int(cfg.batch_size)]
    prompts = batch_prompts(tokenizer, cfg.model, [(e, 0) for e in examples])
    seen, end_step = [], method.end_step

    def logged(ctx):
        out = end_step(ctx)
        kept = [None if k is None else k.clone() for k in method.kept]
        seen.append((ctx.phase.value, ctx.step, kept))
        return out

    method.end_step = logged
    hf = prepared.runner(SamplingConfig.from_config(cfg.generation), cfg.seed, cfg.generation)
    ids, attn = hf.encode(prompts)
    runner = hf
    if cfg.generation.backend == "vllm":
        from bwprune.vllm.running.runner import VLLMRunner

        runner = VLLMRunner.for_run(cfg, prepared, hf, ids.shape[1])
    completions, _ = runner.generate_tokens(ids, attn)
    torch.save({"tokens": [c.token_ids for c in completions],
                "sparsity": [c.sparsity for c in completions], "seen": seen}, out)  # fmt: skip


def compare(a: Path, b: Path) -> dict:
    first, second = (torch.load(p, weights_only=False) for p in (a, b))
    forwards = [(x[0], x[1]) for x in first["seen"]] == [(x[0], x[1]) for x in second["seen"]]
    differing = sum(
        (x is None) != (y is None) or (x is not None and not torch.equal(x.sort()[0], y.sort()[0]))
        for (_, _, one), (_, _, two) in zip(first["seen"], second["seen"])
        for x, y in zip(one, two)
    )
    return {
        "completions_equal": first["tokens"] == second["tokens"],
        "same_forwards": forwards, "forwards": len(first["seen"]),
        "kept_sets": sum(len(k) for _, _, k in first["seen"]), "differing": differing,
    }  # fmt: skip


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "record":
        record(Path(args[1]), args[2:])
    elif len(args) == 3 and args[0] == "compare":
        print(json.dumps(compare(Path(args[1]), Path(args[2]))))
    else:
        sys.exit(__doc__)
