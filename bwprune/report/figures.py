"""Figures built from `load_runs` output; each function returns a matplotlib Figure."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure


def accuracy_vs_realized_sparsity(runs: pd.DataFrame) -> Figure:
    """Accuracy against realized FFN sparsity (a), one marker series per method, per benchmark."""
    benchmarks = sorted(runs["benchmark"].unique())
    fig = Figure(figsize=(4.5 * len(benchmarks), 3.6), layout="constrained")
    axes = fig.subplots(1, len(benchmarks), squeeze=False)[0]
    for ax, bench in zip(axes, benchmarks):
        sub = runs[runs["benchmark"] == bench]
        for method, group in sub.groupby("method"):
            group = group.sort_values("realized_ffn")
            ax.plot(group["realized_ffn"], group["accuracy"], "o-", label=method)
        ax.set(title=bench, xlabel="realized FFN sparsity (a)", ylabel="accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig
