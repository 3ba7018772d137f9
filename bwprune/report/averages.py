"""The cross-benchmark average: one accuracy per configuration over the paper's five benchmarks.

Built from `load_runs` output. An average is given only where every benchmark has a run, so a
missing benchmark shows as a gap rather than as a mean over fewer, easier ones.
"""

from __future__ import annotations

import pandas as pd

PAPER_BENCHMARKS = ("gsm8k", "math500", "minerva", "amc23", "gpqa_diamond")
CONFIG_COLUMNS = ("model", "method", "target_sparsity", "batch_size", "seed")


def benchmark_average(
    runs: pd.DataFrame, benchmarks: tuple[str, ...] = PAPER_BENCHMARKS
) -> pd.DataFrame:
    """One row per configuration: its accuracy on each benchmark and their mean (`average`).

    Raises `ValueError` when a configuration has two runs of one benchmark (e.g. two `limit`s):
    which one belongs in the average is a choice the caller must make by filtering `runs`.
    """
    keys = list(CONFIG_COLUMNS)
    chosen = runs[runs["benchmark"].isin(benchmarks)]
    duplicated = chosen.duplicated([*keys, "benchmark"], keep=False)
    if duplicated.any():
        raise ValueError(
            "several runs of one benchmark for one configuration; filter `runs` first: "
            f"{sorted(chosen.loc[duplicated, 'run_key'])}"
        )
    table = chosen.pivot(index=keys, columns="benchmark", values="accuracy")
    table = table.reindex(columns=list(benchmarks))
    table["average"] = table.mean(axis=1, skipna=False)
    return table.reset_index().rename_axis(columns=None)
