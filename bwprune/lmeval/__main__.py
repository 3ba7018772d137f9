"""`python -m bwprune.lmeval <lm_eval arguments>`: lm-eval's own CLI, with `bwprune` registered.

lm-eval configures only its own logger, so ours gets a handler here (realized sparsity, prompt
cuts). A bad `--model_args` value prints one line `error: ...` and exits with 2, as run.py does,
and before lm-eval indexes its task registry (which takes longer than building our config).
"""

import argparse
import logging
import sys

from lm_eval._cli import HarnessCLI
from lm_eval.utils import setup_logging

import bwprune.lmeval  # noqa: F401  (registers the model name "bwprune")
from bwprune.errors import UserError
from bwprune.lmeval.compose import compose_with_method


def check_model_args(args: argparse.Namespace) -> None:
    """Our model's arguments composed and its method built (no model loads) as `BWPruneLM` will,
    so that a bad value fails at once rather than after lm-eval's task set-up."""
    if getattr(args, "model", None) == "bwprune":
        compose_with_method(args.model_args or {}, getattr(args, "batch_size", None))


def main() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)-8s [bwprune] %(message)s"))
    logger = logging.getLogger("bwprune")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    setup_logging()  # lm-eval's `cli_evaluate`, with our check between parsing and running
    cli = HarnessCLI()
    args = cli.parse_args()
    try:
        check_model_args(args)
        cli.execute(args)
    except UserError as e:
        sys.stderr.write(f"error: {e}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
