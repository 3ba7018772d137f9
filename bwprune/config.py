"""Validation of the composed run config, and the OmegaConf resolvers the YAML files use.

Hydra already rejects unknown config-group options (listing the valid ones); this module checks the
values inside the groups. Method-specific arguments are validated by each method's constructor, so
the schema here covers only the top-level keys, `generation` and `model`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from bwprune.errors import UserError, check_sparsity, choices_error

DTYPES = ("auto", "float32", "bfloat16", "float16")


def package_data_dir() -> str:
    """Folder of the benchmark data shipped inside the package (bwprune/data)."""
    return str(Path(__file__).resolve().parent / "data")


def register_resolvers() -> None:
    """`${bwprune_data_dir:}` in conf/paths/default.yaml, `${by_batching:...}` in method configs;
    idempotent (multirun re-imports)."""
    if not OmegaConf.has_resolver("bwprune_data_dir"):
        OmegaConf.register_new_resolver("bwprune_data_dir", package_data_dir)
    if not OmegaConf.has_resolver("by_batching"):
        OmegaConf.register_new_resolver("by_batching", by_batching)


def by_batching(batching: str, static: Any, continuous: Any) -> Any:
    """`${by_batching:${generation.batching},<static>,<continuous>}`: a method default that
    differs in streams (a resolved config holds the value, so a run's identity is its value)."""
    if batching not in BATCHING:
        raise choices_error("generation.batching", batching, BATCHING)
    return static if batching == "static" else continuous


# Numeric keys, checked for their type before their range: "abc" or 2.5 is a bad value, not a
# traceback from float() or a batch size silently cut to 2. `NULLABLE` keys may also be null.
INTEGERS = ("batch_size", "seed", "limit", "shard", "num_shards", "generation.max_new_tokens",
            "generation.num_samples", "speed.batches", "speed.repeats", "speed.max_repeats",
            "speed.warmup", "speed.max_steps", "cost.problems", "cost.max_trials",
            "cost.max_new_tokens")  # fmt: skip
NUMBERS = ("sparsity", "generation.temperature", "generation.top_p", "cost.target",
           "cost.tolerance", "cost.max_rho", "speed.half_width", "speed.confidence",
           "speed.budget_s")  # fmt: skip
NULLABLE = ("limit", "cost.target", "speed.max_steps")
AUTOMATIC = ("speed.budget_s",)  # may also be "auto": set from the run's size
PAIRED = ("auto", "true", "false")  # speed.paired (YAML gives the last two as booleans)
BATCHING = ("static", "continuous")  # generation.batching
BACKENDS = ("hf", "vllm")  # generation.backend
KEPT_WEIGHTS = ("buffers", "in_place")  # generation.kept_weights


def validate(cfg: DictConfig) -> None:
    """Raise `UserError` naming the first bad top-level, model or generation value (the ranges
    of `cost` values are `bwprune.generation.cost_target`'s, checked when a target is set)."""
    for key in (*INTEGERS, *NUMBERS):
        value, integer = OmegaConf.select(cfg, key), key in INTEGERS
        if _is_number(value, integer) or (key in NULLABLE and value is None):
            continue
        if key in AUTOMATIC and value == "auto":
            continue
        kind = "an integer" if integer else "a number"
        raise UserError(f"{key}={value!r} must be {kind}{' or auto' * (key in AUTOMATIC)}")
    check_sparsity(cfg.sparsity)
    if cfg.batch_size < 1:
        raise UserError(f"batch_size={cfg.batch_size} must be >= 1")
    if cfg.limit is not None and cfg.limit < 1:
        raise UserError(f"limit={cfg.limit} must be >= 1 (or null for the whole benchmark)")
    if cfg.num_shards < 1:
        raise UserError(f"num_shards={cfg.num_shards} must be >= 1 (1: the run unsharded)")
    if not 0 <= cfg.shard < cfg.num_shards:
        raise UserError(f"shard={cfg.shard} must be in [0, num_shards={cfg.num_shards})")
    gen = cfg.generation
    if gen.max_new_tokens < 1:
        raise UserError(f"generation.max_new_tokens={gen.max_new_tokens} must be >= 1")
    if gen.do_sample and not (gen.temperature > 0 and 0 < gen.top_p <= 1):
        raise UserError(
            f"generation.temperature={gen.temperature} must be > 0 and "
            f"generation.top_p={gen.top_p} in (0, 1] when do_sample=true"
        )
    if gen.batching not in BATCHING:
        raise choices_error("generation.batching", gen.batching, BATCHING)
    if gen.backend not in BACKENDS:
        raise choices_error("generation.backend", gen.backend, BACKENDS)
    kept_weights = gen.get("kept_weights", "buffers")
    if kept_weights not in KEPT_WEIGHTS:
        raise choices_error("generation.kept_weights", kept_weights, KEPT_WEIGHTS)
    workers = gen.get("vllm", {}).get("tensor_parallel_size", 1)  # a bad one: vllm/binding/support
    if kept_weights == "in_place" and gen.backend == "vllm" and isinstance(workers, int) \
            and workers > 1:  # fmt: skip
        raise UserError(
            f"generation.kept_weights=in_place runs on one vLLM worker, not "
            f"generation.vllm.tensor_parallel_size={workers}: a rank's share of a global kept set "
            "changes size at every refresh, and each change would re-lay its whole MLP"
        )
    if gen.batching == "continuous" and gen.kv_cache != "static":
        raise UserError(
            f"generation.batching=continuous needs generation.kv_cache=static (got "
            f"{gen.kv_cache!r}): its slots are rows of one preallocated cache"
        )
    speed = cfg.speed
    if str(speed.paired).lower() not in PAIRED:
        raise choices_error("speed.paired", speed.paired, PAIRED)
    if str(speed.paired).lower() == "true" and gen.batching == "continuous":
        raise UserError(
            "speed.paired=true times a static batch again against dense; a continuous run has "
            "none: time streams with `make bench` (speed.paired=auto skips it)"
        )
    if speed.batches < 0 or speed.repeats < 1 or speed.warmup < 0:
        raise UserError(
            f"speed.batches={speed.batches} and speed.warmup={speed.warmup} must be >= 0, "
            f"speed.repeats={speed.repeats} >= 1"
        )
    if speed.max_repeats < speed.repeats or not 0 < speed.confidence < 1:
        raise UserError(
            f"speed.max_repeats={speed.max_repeats} must be >= speed.repeats={speed.repeats}, "
            f"speed.confidence={speed.confidence} between 0 and 1"
        )
    if speed.get("max_steps") is not None and speed.max_steps < 1:
        raise UserError(f"speed.max_steps={speed.max_steps} must be >= 1, or null (whole answers)")
    if cfg.model.dtype not in DTYPES:
        raise choices_error("model.dtype", cfg.model.dtype, DTYPES)
    if cfg.model.init not in ("pretrained", "random"):
        raise choices_error("model.init", cfg.model.init, ("pretrained", "random"))


def _is_number(value: object, integer: bool) -> bool:
    """An int (or, unless `integer`, a float); never a bool, which YAML also gives."""
    kinds = (int,) if integer else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


def build(node: DictConfig) -> Any:
    """`instantiate` a config node (a method, a benchmark), with a constructor's `UserError` (or
    bad-value `ValueError`/`TypeError`) surfaced as one `UserError`, not Hydra's wrapper."""
    try:
        return instantiate(node)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, (UserError, ValueError, TypeError)):
            raise UserError(f"{node.get('_target_')}: {cause}") from None
        raise


def build_method(node: DictConfig) -> Any:
    """A pruning method from its `conf/method/<name>.yaml` node. `name` is the config's (the run
    key's method segment), not a constructor argument, so it is left out of the call."""
    if "name" not in node:
        raise UserError(f"method config {node.get('_target_')!r} lacks `name` (its file's name)")
    args = OmegaConf.to_container(node, resolve=True)
    args.pop("name")
    return build(OmegaConf.create(args))


def compose_config(conf_dir: str | Path, overrides: list[str] | None = None,
                   name: str = "config") -> DictConfig:  # fmt: skip
    """conf/<name>.yaml (a run's: config.yaml) composed outside `@hydra.main` (scripts,
    notebooks): same defaults."""
    from hydra import compose, initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
        return compose(name, overrides=list(overrides or []))
