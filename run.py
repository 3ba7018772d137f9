"""Entry point: `python run.py [overrides]`, `python run.py -m key=a,b` for sweeps.

Composes conf/run.yaml (conf/config.yaml, a person's own runs under results/local/) and hands it
to `bwprune.experiment.run`; prints a short summary, or one `error:` line (`bwprune.cli`).
"""

import hydra
from omegaconf import DictConfig
from transformers.utils import logging as hf_logging

from bwprune.cli import INTERRUPTED, fail, interrupted, summary
from bwprune.config import register_resolvers
from bwprune.errors import UserError
from bwprune.experiment import run

register_resolvers()  # at import: launchers may import this module in worker processes


@hydra.main(version_base="1.3", config_path="conf", config_name="run")
def main(cfg: DictConfig) -> None:
    hf_logging.disable_progress_bar()  # one progress bar: ours, over batches
    try:
        record = run(cfg)
    except UserError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail(interrupted(cfg), INTERRUPTED)
    print(summary(record, cfg.paths.runs_dir))


if __name__ == "__main__":
    main()
