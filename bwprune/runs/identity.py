"""A run's identity and key: which settings change what a run computes, hashed into its folder.

Two configs that compute the same thing share a key (and so a folder: a rerun resumes or skips),
and a setting added later re-keys no recorded run (`LATE_OPTIONS`, `SWITCHED_BLOCKS`). This
module imports no torch and knows nothing of any method.
"""

from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from bwprune.config import package_data_dir

# Keys that never change what a run computes: they are left out of the run's identity.
# `sparsity` and `calibration` matter only through the method config that interpolates them.
NON_IDENTITY_KEYS = (
    "logger", "paths", "tags", "exp_name", "progress", "sparsity", "calibration", "hydra", "speed",
)  # fmt: skip
# How the decode loop runs, never what it computes (tested token for token): not identity.
ENGINE_KEYS = ("kv_cache", "compile", "compile_backend", "compaction", "vllm")
# Options added after runs were recorded: in a run's identity only when set away from the value
# the runs recorded before them behaved as, so adding one does not re-key (and so re-run) every
# recorded run. These are facts about old runs, not the options' defaults (which live in the yaml
# only): were they read from the yaml, a later change of default would give new runs the keys of
# old runs that computed something else.
LATE_OPTIONS = {
    ("quality", "traces"): False,
    ("generation", "batch_invariant"): False,
    ("generation", "batching"): "static",
    ("generation", "backend"): "hf",  # vLLM as a generation host
    ("generation", "tp_select"): "global",  # tensor-parallel vLLM's selection
    ("generation", "kept_weights"): "buffers",  # the HF loop's kept sets in place (one copy)
    ("method", "attn_square"): False,  # trisp's FLAP-style squared attention scores
    ("method", "memory_policy"): "max",  # ours under continuous batching (and its ablations)
    ("method", "memory_decay"): 0.9,
    ("method", "memory_window"): 4,
    ("method", "on_enter"): "prompt",
}
# Method classes renamed after runs were recorded: a run's identity names the class as it was
# recorded, so a rename re-keys nothing.
RENAMED_TARGETS = {"bwprune.methods.ours.Ours": "bwprune.methods.ours.BWAP"}
CURRENT_TARGETS = {old: new for new, old in RENAMED_TARGETS.items()}
# Blocks that change nothing while their switch is null: out of a run's identity then, so adding
# one re-keys no recorded run.
SWITCHED_BLOCKS = {"cost": "target"}


def current_target(target: str) -> str:
    """A recorded method class's name in this checkout (re-running an old run's config)."""
    return CURRENT_TARGETS.get(target, target)


def method_name(cfg: DictConfig) -> str:
    """The method's config choice (`conf/method/<name>.yaml` carries its own `name`)."""
    return str(cfg.method.name)


def target_sparsity(cfg: DictConfig) -> float:
    """The method's own target ρ (0 for methods without one, e.g. dense)."""
    return float(cfg.method.get("sparsity", 0.0))


def identity(cfg: DictConfig) -> dict:
    """The resolved config without the keys that cannot change the outputs (the method's `name`
    is in the run key itself, its arguments and `_target_` are what the hash must see; the
    engine settings change speed only)."""
    return _identity(OmegaConf.to_container(cfg, resolve=True), package_data_dir())


def settings(recorded: dict) -> dict:
    """A recorded run's identity (read back from its config.yaml) without the seed: what it
    computed, so tables can tell the runs one cell may average from those it must not mix.
    Shipped data is named relative to the data folder of the checkout that made the run."""
    data_dir = recorded.get("paths", {}).get("data_dir") or package_data_dir()
    ident = _identity(recorded, data_dir)
    ident.pop("seed", None)
    return ident


def _identity(resolved: dict, data_dir: str) -> dict:
    kept = {k: v for k, v in resolved.items() if k not in NON_IDENTITY_KEYS}
    for (group, key), default in LATE_OPTIONS.items():
        if kept.get(group, {}).get(key, default) == default:
            kept[group] = {k: v for k, v in kept[group].items() if k != key}
    for block, switch in SWITCHED_BLOCKS.items():
        if kept.get(block, {}).get(switch) is None:
            kept.pop(block, None)
    target = kept.get("method", {}).get("_target_")
    if target in RENAMED_TARGETS:
        kept["method"] = {**kept["method"], "_target_": RENAMED_TARGETS[target]}
    for group, dropped in (("method", ("name",)), ("generation", ENGINE_KEYS)):
        if group in kept:
            kept[group] = {k: v for k, v in kept[group].items() if k not in dropped}
    return _portable(kept, data_dir)


def _portable(node, data_dir: str):
    """Portable identity: where a cache lives never changes results (a method may carry
    `cache_dir`), and data shipped in the package is named relative to it, so the same config
    has the same key in every checkout."""
    if isinstance(node, dict):
        return {k: _portable(v, data_dir) for k, v in node.items() if k != "cache_dir"}
    if isinstance(node, list):
        return [_portable(v, data_dir) for v in node]
    if isinstance(node, str) and node.startswith(data_dir):
        return "bwprune/data" + node[len(data_dir) :]
    return node


def run_key(cfg: DictConfig) -> str:
    """`<benchmark>/<model>/<method>/rho=<ρ>_bs=<B>_seed=<s>_<hash8>`, unique per identity.

    ρ is the method's own `sparsity` (0 for methods without one, e.g. dense), so a dense run is the
    same run whatever top-level `sparsity` says. A matched-cost run names its target instead
    (`params=0.3_...`): its ρ is chosen by the run.
    """
    ident = identity(cfg)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:8]
    cost = cfg.get("cost")
    target = (f"{cost.quantity}={cost.target:g}" if cost is not None and cost.target is not None
              else f"rho={target_sparsity(cfg):g}")  # fmt: skip
    leaf = f"{target}_bs={cfg.batch_size}_seed={cfg.seed}_{digest}"
    return f"{cfg.benchmark.name}/{cfg.model.name}/{method_name(cfg)}/{leaf}"
