"""lm-evaluation-harness plug-in: any lm-eval task under any pruning method, batched.

Importing this package registers the model name `bwprune` with lm-eval's model registry. lm-eval
0.4 discovers models only through its own table or `@register_model` at import time (no entry
points), so use it through the wrapper CLI, which takes lm-eval's arguments unchanged:

    python -m bwprune.lmeval --model bwprune \
        --model_args model=smollm2_135m,method=ours,sparsity=0.5 \
        --include_path tests/lmeval_tasks --tasks gsm8k_local --batch_size 4

or from Python: `import bwprune.lmeval`, then `lm_eval.simple_evaluate(model="bwprune", ...)`.
`--model_args` are Hydra overrides of conf/config.yaml (see `bwprune.lmeval.compose`).
"""

from bwprune.lmeval.model import BWPruneLM

__all__ = ["BWPruneLM"]
