"""`python -m bwprune.lmeval <lm_eval arguments>`: lm-eval's own CLI, with `bwprune` registered.

lm-eval configures only its own logger, so ours gets a handler here (realized sparsity, prompt
cuts). A bad `--model_args` value prints one line `error: ...` and exits with 2, as run.py does.
"""

import logging
import sys

from lm_eval.__main__ import cli_evaluate

import bwprune.lmeval  # noqa: F401  (registers the model name "bwprune")
from bwprune.errors import UserError


def main() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)-8s [bwprune] %(message)s"))
    logger = logging.getLogger("bwprune")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        cli_evaluate()
    except UserError as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
