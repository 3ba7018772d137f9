"""Entry point: `python run.py [overrides]`, `python run.py -m key=a,b` for sweeps.

Composes conf/run.yaml (conf/config.yaml, a person's own runs under results/local/) and hands it
to `bwprune.experiment.run`; prints a short summary, or one `error:` line (`bwprune.cli`).

Torch and transformers load inside `main`, once the values are checked: a typo, `--cfg job` or
`--help` answers in a second or two, not after the model stack has loaded.
"""

import hydra
from omegaconf import DictConfig

from bwprune.cli import INTERRUPTED, fail, interrupted, summary
from bwprune.config import register_resolvers, validate
from bwprune.errors import UserError

register_resolvers()  # at import: launchers may import this module in worker processes


@hydra.main(version_base="1.3", config_path="conf", config_name="run")
def main(cfg: DictConfig) -> None:
    try:
        validate(cfg)  # torch-free; `run` checks again, for callers of the library
        from transformers.utils import logging as hf_logging

        from bwprune.experiment import run

        hf_logging.disable_progress_bar()  # one progress bar: ours, over batches
        record = run(cfg)
    except UserError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail(interrupted(cfg), INTERRUPTED)
    print(summary(record, cfg.paths.runs_dir))


if __name__ == "__main__":
    main()
