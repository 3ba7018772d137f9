"""Which recorded runs a view shows: each method's default variant (from the yaml files, the only
source of defaults), at the ρ it was given or at a matched cost, one run per cell or every
evaluation size. Tables, figures and notebooks select through here, so a figure and a table of
the same runs cannot disagree on what they show.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from bwprune.report.cells import largest_evaluations
from bwprune.report.collect import method_variant
from bwprune.report.control import computed_together
from bwprune.report.matched import nominal


def default_variants(conf_dir: str | Path, runs: pd.DataFrame) -> dict[str, str]:
    """The default variant of each `<model>/<method>` pair in `runs` (keyed as in run keys), from
    the yaml files (the only source of defaults). Composed with the model, because a model may set
    its own method values (conf/model_method/: Qwen3-1.7B's mask period for `ours`)."""
    from omegaconf import OmegaConf

    from bwprune.config import compose_config

    out = {}
    for model, method in sorted(set(zip(runs["model"], runs["method"]))):
        cfg = compose_config(conf_dir, [f"model={model}", f"method={method}"])
        out[f"{model}/{method}"] = method_variant(OmegaConf.to_container(cfg.method, resolve=True))
    return out


def pareto_runs(runs: pd.DataFrame, defaults: dict[str, str]) -> pd.DataFrame:
    """Generation runs of each method's default variant in static batches computed together,
    every evaluation size, at a given ρ or a matched cost: every point of the Pareto view
    (`bwprune.report.pareto`), where a run's cost, not its ρ, places it."""
    return defaults_only(computed_together(runs[runs["perplexity"].isna()]), defaults)


def default_runs(runs: pd.DataFrame, defaults: dict[str, str]) -> pd.DataFrame:
    """`pareto_runs` at the ρ they were given: the papers' protocol, every evaluation size (the
    collapse); streams, the batch-invariant control and matched runs have their own views."""
    return nominal(pareto_runs(runs, defaults))


def default_cells(runs: pd.DataFrame, defaults: dict[str, str]) -> pd.DataFrame:
    """The same, one run per cell (the most problems): the other figures."""
    return largest_evaluations(default_runs(runs, defaults))


def defaults_only(runs: pd.DataFrame, defaults: dict[str, str]) -> pd.DataFrame:
    pairs = zip(runs["model"], runs["method"], runs["variant"])
    return runs[
        row_mask(runs, [defaults.get(f"{model}/{method}") == v for model, method, v in pairs])
    ]


def row_mask(runs: pd.DataFrame, keep: list[bool]) -> pd.Series:
    """A row mask; a bare list would select no columns when it is empty (no runs of a kind)."""
    return pd.Series(keep, index=runs.index, dtype=bool)
