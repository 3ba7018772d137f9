"""Entry point: `python run.py [overrides]`, `python run.py -m key=a,b` for sweeps.

Composes conf/config.yaml and hands it to `bwprune.experiment.run`; prints a short summary.
"""

import logging
import sys

import hydra
from omegaconf import DictConfig
from transformers.utils import logging as hf_logging

from bwprune.config import register_resolvers
from bwprune.errors import UserError
from bwprune.experiment import run

log = logging.getLogger("bwprune")
register_resolvers()  # at import: launchers may import this module in worker processes


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hf_logging.disable_progress_bar()  # one progress bar: ours, over batches
    try:
        record = run(cfg)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    m = record["metrics"]
    rs = m.get("realized_sparsity") or {"ffn": 0.0, "params": 0.0}
    sparsity = f"  realized sparsity ffn {rs['ffn']:.3f} params {rs['params']:.3f}"
    if "perplexity" in m:
        line = f"  perplexity {m['perplexity']:.3f} ({m['n_tokens']} tokens){sparsity}"
    else:
        line = (
            f"  accuracy {m['accuracy']:.3f} ({m['correct']}/{m['n']}, {m['unscorable']} "
            f"unscorable){sparsity}  decode {m['decode_tokens_per_s']:.1f} tok/s "
            f"({m['decode_ms_per_step']:.1f} ms/step)"
        )
    print(f"{record['run_key']}\n{line}\n  results: {cfg.paths.runs_dir}/{record['run_key']}")


if __name__ == "__main__":
    main()
