"""From lm-eval's `--model_args` to a validated run config and a loaded, prepared model.

`--model_args` are Hydra overrides of conf/config.yaml, with run.py's names and syntax
(`model=smollm2_135m,method=ours,sparsity=0.5,method.t_init=4`), composed and validated as run.py
does, so a bad value fails with the same `UserError`. Keys that lm-eval itself controls here
(batching, example selection, decoding) are refused with the lm-eval option to use instead, so
that no value is silently ignored. Nothing in this module imports lm-eval.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.errors import HydraException
from omegaconf import DictConfig

from bwprune.config import build_method, compose_config, validate
from bwprune.errors import UserError

if TYPE_CHECKING:  # the type only: composing imports no torch
    from bwprune.methods.base import PruningMethod

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# Config keys whose role lm-eval takes over, and the lm-eval option that sets it instead.
LM_EVAL_OWNS = {
    "batch_size": "--batch_size",
    "benchmark": "--tasks",
    "limit": "--limit",
    "subset": "--samples",
    "shard": "--samples",
    "num_shards": "--samples",
    "generation": "--gen_kwargs (or the task's generation_kwargs)",
    "logger": "--wandb_args",
}
# ... except this one: the default `max_gen_toks` for tasks that do not set it.
MODEL_ARGS_ALLOWED = ("generation.max_new_tokens",)


def hydra_override(key: str, value: Any) -> str:
    """`key=value` in Hydra's syntax from a value lm-eval has already parsed (0.5, True, [0, 5])."""
    if value is None or isinstance(value, (bool, list, dict)):
        return f"{key}={json.dumps(value)}"
    return f"{key}={value}"


def _one_line(message: str) -> str:
    """Hydra's multi-line composition errors as one line (the search path left out)."""
    message = message.split("\nConfig search path:")[0].strip()
    message = re.sub(r":\n\t", ": ", message).replace("\n\t", ", ")
    return re.sub(r"\.?\n+", "; ", message)


def compose_from_model_args(
    model_args: Mapping[str, Any], batch_size: int | str | None = None
) -> DictConfig:
    """The validated run config for lm-eval's `model_args` and `--batch_size`.

    `batch_size=None` keeps the config's default; `auto` is refused, because for batch-coupled
    methods the batch composition changes the outputs, so it must be a chosen number.
    """
    for key in model_args:
        name = key.lstrip("+~")
        option = LM_EVAL_OWNS.get(name.split(".")[0])
        if option and name not in MODEL_ARGS_ALLOWED:
            raise UserError(f"model_args {name}=... is lm-eval's to set here; use {option}")
    overrides = []
    if batch_size is not None:
        if not str(batch_size).isdigit():
            raise UserError(
                f"batch_size={batch_size!r} must be an integer: batch-coupled methods give "
                "different outputs for different batch compositions"
            )
        overrides.append(f"batch_size={batch_size}")
    overrides += [hydra_override(k, v) for k, v in model_args.items()]
    try:
        cfg = compose_config(CONF_DIR, overrides)
    except HydraException as e:
        raise UserError(_one_line(str(e))) from None
    validate(cfg)
    if cfg.cost.target is not None:  # its search generates a run.py benchmark's problems
        raise UserError(
            f"model_args cost.target={cfg.cost.target} is run.py's: a matched-cost run searches "
            "ρ on a benchmark's problems; pass the ρ it chose here (sparsity=<metrics.cost.rho>)"
        )
    return cfg


def compose_with_method(
    model_args: Mapping[str, Any], batch_size: int | str | None = None
) -> tuple[DictConfig, PruningMethod]:
    """`compose_from_model_args` and the method it names, built: bad method arguments fail here,
    before any model loads (the CLI calls it before lm-eval sets up its tasks, the model again)."""
    cfg = compose_from_model_args(model_args, batch_size)
    return cfg, build_method(cfg.method)
