"""The paper's figures, built from `load_runs` output (and speed records); each returns a Figure.

Notebooks and `make figures` only call these. Methods are drawn in a fixed order and colour so a
method looks the same in every figure.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from bwprune.report import pareto as pv
from bwprune.report.accuracy import accuracy_columns
from bwprune.report.cells import fullest
from bwprune.report.stream import stream_pairs

METHOD_ORDER = ("dense", "ours", "teal", "cats", "griffin", "wanda", "wanda_unstructured", "trisp")
# Round ratios a log axis may label (`_ratio_axis`).
RATIO_TICKS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0,
               2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0)  # fmt: skip


def _methods(frame: pd.DataFrame) -> list[str]:
    present = set(frame["method"])
    return [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))


def _panels(frame: pd.DataFrame, width: float = 4.5) -> tuple[Figure, list, list[str]]:
    benchmarks = sorted(frame["benchmark"].unique())
    fig = Figure(figsize=((width + 1.5) * max(1, len(benchmarks)), 3.6), layout="constrained")
    return fig, list(fig.subplots(1, max(1, len(benchmarks)), squeeze=False)[0]), benchmarks


def metric_vs(runs: pd.DataFrame, x: str, y: str, xlabel: str, ylabel: str) -> Figure:
    """`y` against `x`, one line per method, one panel per benchmark that has `y` (mean over
    seeds). Each model and evaluation size (problems) gets its own line style, so a line never
    joins points measured on different problems. Runs without `y` (perplexity runs for accuracy,
    runs without quality for KL) are left out, and an empty panel says so."""
    runs = runs[runs[y].notna()]
    fig, axes, benchmarks = _panels(runs)
    if not benchmarks:
        axes[0].text(0.5, 0.5, f"no runs with {y}", ha="center", va="center")
    colours = {m: f"C{i}" for i, m in enumerate(_methods(runs))}
    for ax, bench in zip(axes, benchmarks):
        sub = runs[runs["benchmark"] == bench]
        series = sorted(set(zip(sub["model"], sub["problems"])))
        several_models = len({m for m, _ in series}) > 1
        for (model, n), style in zip(series, ("o-", "s--", "^:", "d-.", "v-", "x--")):
            part = sub[(sub["model"] == model) & (sub["problems"] == n)]
            prefix = f"{model} " if several_models else ""
            suffix = f", n={n}" if len(series) > 1 else ""
            for method in _methods(part):
                line = part[part["method"] == method].groupby(x)[y].mean().sort_index()
                label = f"{prefix}{method}{suffix}"
                ax.plot(line.index, line.values, style, color=colours[method], label=label)
        ax.set(title=bench, xlabel=xlabel, ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def largest_sweep(runs: pd.DataFrame, x: str) -> pd.DataFrame:
    """Per benchmark and model, the runs of the fullest evaluation (`cells.fullest`: most
    problems, then the longest generations) that was measured at more than one `x`: one clean
    curve per method, where every evaluation at once would crowd the panel (the batch table keeps
    them all)."""
    evaluation = ["benchmark", "model", "problems", "max_new_tokens"]
    evaluation = [k for k in evaluation if k in runs]
    runs = runs[runs.groupby(evaluation, dropna=False)[x].transform("nunique") > 1]
    return fullest(runs, ["benchmark", "model"])


def collapse(runs: pd.DataFrame, y: str = "agreement", rho: float = 0.5) -> Figure:
    """Agreement with dense, KL or accuracy vs batch size at target ρ (dense included): what
    batch-shared masks lose as B grows. Benchmarks run at a single batch size are left out."""
    at_rho = runs[(runs["method"] == "dense") | (runs["target_sparsity"] == rho)]
    sweep = largest_sweep(at_rho[at_rho[y].notna()], "batch_size")  # the panels metric_vs draws
    fig = metric_vs(sweep, "batch_size", y, "batch size", f"{y} (target ρ = {rho:g})")
    for ax, (bench, one) in zip(fig.axes, sweep.groupby("benchmark")):  # panels sorted alike
        problems = one["problems"].unique()
        if len(problems) == 1:  # one evaluation size: say which
            ax.set_title(f"{bench}, {problems[0]} problems")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(sweep["batch_size"].unique()))
        ax.get_xaxis().set_major_formatter("{x:g}")
    return fig


def accuracy_vs_realized_sparsity(runs: pd.DataFrame, batch_size: int = 4) -> Figure:
    """Accuracy against realized FFN sparsity (a) at one batch size: what each method pays for
    what it skips. One batch size, since a line through several would join points that differ in
    the batch as well as in ρ."""
    return accuracy_with_intervals(
        runs[runs["batch_size"] == batch_size], "realized_ffn", "realized FFN sparsity (a)",
        f"Accuracy vs realized FFN sparsity (batch {batch_size})",
    )  # fmt: skip


def accuracy_with_intervals(
    runs: pd.DataFrame,
    x: str,
    xlabel: str,
    title: str,
    keys: tuple[str, ...] = ("benchmark", "model", "problems"),
) -> Figure:
    """Accuracy against `x` with each point's 95 % Wilson interval (seeds pooled,
    `bwprune.report.accuracy`), one line per method, one panel per group of `keys` (by default
    benchmark, model and evaluation size) measured at more than one `x`; dense as a band (its
    interval at each of its `x`, or across the panel where it has one), the level a method keeps
    or loses. The accuracy the paper's claims are made in, where a difference smaller than the
    intervals is not one. Where a panel's points were measured on different numbers of problems
    (`keys` without "problems"), the title names the usual n and each other point says its own."""
    runs = runs[runs["correct"].notna() & runs[x].notna()]
    keys = [k for k in keys if k in runs]
    pruned = runs[runs["method"] != "dense"]
    swept = pruned.groupby(keys)[x].transform("nunique") > 1
    panels = sorted(set(pruned[swept][keys].itertuples(index=False, name=None)))
    fig = Figure(figsize=(6.0 * max(1, len(panels)), 3.8), layout="constrained")
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False)[0]
    if not panels:
        axes[0].text(0.5, 0.5, f"no method measured at more than one {xlabel}", ha="center")
    colours = {m: f"C{i}" for i, m in enumerate(_methods(runs))}
    for ax, panel in zip(axes, panels):
        part = runs[(runs[keys] == pd.Series(panel, index=keys)).all(axis=1)]
        cells = accuracy_columns(part.assign(_x=part[x].round(4)), ["method", "_x"])
        usual = cells["n"].mode().max()  # in the title; a point measured on other n says its own
        for method in _methods(cells):
            line = cells[cells["method"] == method].sort_values("_x")
            if method == "dense":
                if len(line) == 1:
                    ax.axhspan(line["low"].iloc[0], line["high"].iloc[0], color="0.85",
                               label=f"dense {line['acc'].iloc[0]:.2f} (95 % CI)")  # fmt: skip
                else:
                    ax.fill_between(line["_x"], line["low"], line["high"], color="0.85",
                                    label="dense (95 % CI)")  # fmt: skip
                continue
            # a Wilson bound at 0 or n correct can miss the rate by a rounding: never below 0
            error = [
                (line["acc"] - line["low"]).clip(lower=0),
                (line["high"] - line["acc"]).clip(lower=0),
            ]
            ax.errorbar(line["_x"], line["acc"], yerr=error, fmt="o-", capsize=3,
                        color=colours[method], label=method)  # fmt: skip
            for n, at, acc in zip(line["n"], line["_x"], line["acc"]):
                if n != usual:
                    ax.annotate(f"n={n}", (at, acc), xytext=(5, 3), textcoords="offset points",
                                fontsize=7, color=colours[method])  # fmt: skip
        named = dict(zip(keys, panel))
        tokens = f", ≤{named['max_new_tokens']:g} tokens" if "max_new_tokens" in named else ""
        ax.set(title=f"{named['benchmark']}, {named['model']}{tokens}, {usual} problems",
               xlabel=xlabel, ylabel="accuracy")  # fmt: skip
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title)
    return fig


def batch_sweep_accuracy(cells: pd.DataFrame, rho: float = 0.5) -> Figure:
    """The collapse in accuracy: each method at target ρ against batch size, with intervals.

    `cells`: a run per table cell (`cells.largest_evaluations`), so each point is the main
    table's. Batch 1 costs most per problem and is often measured on fewer problems than 4 and
    16 (the accuracy plan: 50 against 100); one line per method with the odd n beside its point
    keeps them together, where a panel per evaluation size would part them."""
    at_rho = cells[(cells["method"] == "dense") | (cells["target_sparsity"] == rho)]
    fig = accuracy_with_intervals(at_rho, "batch_size", "batch size",
                                  f"Accuracy vs batch size (target ρ = {rho:g})",
                                  ("benchmark", "model", "max_new_tokens"))  # fmt: skip
    for ax in fig.axes:
        ax.set_xscale("log", base=2)
        ax.get_xaxis().set_major_formatter("{x:g}")
    return fig


def accuracy_vs_realized_cost(runs: pd.DataFrame, batch_size: int = 4) -> Figure:
    """Each method's accuracy across its ρ against the cost it realized (c), at one batch size."""
    return accuracy_with_intervals(
        runs[runs["batch_size"] == batch_size], "realized_params",
        "realized cost (c): parameters skipped per decode token",
        f"Accuracy vs realized cost (batch {batch_size})",
    )  # fmt: skip


def pareto(runs: pd.DataFrame, y: str) -> Figure:
    """`y` (a `pareto.METRICS` key) against realized cost (c): one curve per method through its
    runs at several ρ (each point labelled with its ρ; a matched-cost run's framed by a square,
    with the ρ its search chose), dense as the star at (c) = 0; one panel per batch size, one
    row of panels per benchmark, model and evaluation (problems, tokens)."""
    found = pv.curves(runs, y)
    rows = sorted({key[:4] for key in found}, key=str)  # (benchmark, model, problems, tokens)
    sizes = sorted({key[4] for key in found})  # batch sizes
    fig = Figure(figsize=(3.6 * max(1, len(sizes)) + 1.6, 3.4 * max(1, len(rows))),
                 layout="constrained")  # fmt: skip
    axes = fig.subplots(max(1, len(rows)), max(1, len(sizes)), squeeze=False)
    if not found:
        axes[0][0].text(0.5, 0.5, f"no runs with {y} and realized (c)", ha="center", va="center")
    colours = {m: f"C{i}" for i, m in enumerate(_methods(runs))}
    for (*evaluation, size, method), curve in found.items():
        ax = axes[rows.index(tuple(evaluation))][sizes.index(size)]
        x, values = curve[pv.X], curve[y]
        if method == "dense":
            ax.plot(x, values, "*", color="k", markersize=10, label="dense")
            continue
        ax.plot(x, values, "o-", color=colours[method], label=method)
        matched = curve["cost_target"].notna()  # a cost target's point: the ρ its search chose
        if matched.any():
            ax.plot(x[matched], values[matched], "s", color=colours[method], markersize=7,
                    fillstyle="none", label="_matched")  # fmt: skip
        for rho, target, px, py in zip(curve["target_sparsity"], matched, x, values):
            ax.annotate(f"{rho:g} (matched)" if target else f"{rho:g}", (px, py), xytext=(3, 3),
                        textcoords="offset points", fontsize=6, color=colours[method])  # fmt: skip
    for r, (bench, model, problems, tokens) in enumerate(rows):
        for c, size in enumerate(sizes):
            ax = axes[r][c]
            if y in pv.DENSE and ax.has_data():  # dense is its own reference
                ax.plot([0.0], [pv.DENSE[y]], "*", color="k", markersize=10, label="dense")
            if not ax.has_data():
                ax.text(0.5, 0.5, f"no runs with {y}", ha="center", va="center")
            ax.set(title=f"{bench}, {model}\n{problems} problems, {tokens} tokens, batch {size}",
                   xlabel=pv.X_LABEL, ylabel=pv.METRICS[y])  # fmt: skip
            ax.title.set_fontsize(9)
            ax.grid(alpha=0.3)
            if y in pv.RATIOS and ax.has_data():
                _ratio_axis(ax)
    handles = {h.get_label(): h for ax in fig.axes for h in ax.get_lines()}
    if handles:
        order = [m for m in _methods(runs) if m in handles]
        fig.legend([handles[m] for m in order], order, loc="outside right upper", fontsize=8)
    return fig


def _ratio_axis(ax: Axes, most: int = 8) -> None:
    """A log y-axis for a ratio over dense. On a linear one, a method whose answers end after a
    few tokens (unstructured Wanda: 5-9x to the answer at batch 1) flattens every other curve
    into the band around 1 where the comparison is; on a log one each keeps its shape, and
    faster and slower than dense are drawn alike. Labels are round ratios (`RATIO_TICKS`),
    1 always among them, the others thinned outward from it to about `most` in all."""
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    gap = np.log(high / low) / most  # the least distance between two labels
    ticks = [1.0]
    above = [t for t in RATIO_TICKS if 1 < t <= high]
    below = [t for t in reversed(RATIO_TICKS) if low <= t < 1]
    for side in (above, below):
        last = 1.0
        for tick in side:
            if abs(np.log(tick / last)) >= gap:
                ticks.append(tick)
                last = tick
    ax.yaxis.set_major_locator(FixedLocator(sorted(ticks)))
    ax.yaxis.set_major_formatter("{x:g}")
    ax.yaxis.set_minor_locator(NullLocator())


def stream_fidelity(runs: pd.DataFrame) -> Figure:
    """KL to dense (top) and realized cost (c) (bottom) of each method in static batches and
    continuously batched, bar beside bar; one column per batch size (`report.stream`), at the
    largest evaluation (most problems) of each batch size."""
    pairs = stream_pairs(runs)
    if len(pairs):
        pairs = fullest(pairs, ["benchmark", "model", "batch_size"])
    sizes = sorted(set(pairs["batch_size"])) if len(pairs) else []
    fig = Figure(figsize=(4.2 * max(1, len(sizes)) + 0.5, 6.2), layout="constrained")
    axes = fig.subplots(2, max(1, len(sizes)), squeeze=False)
    if not sizes:
        axes[0][0].text(0.5, 0.5, "no continuous run with a static twin", ha="center")
    for c, size in enumerate(sizes):
        one = pairs[pairs["batch_size"] == size]
        rows = (("kl", "KL to dense"), (pv.X, "parameters skipped per\ndecode token (c)"))
        for r, (col, name) in enumerate(rows):
            ax, x = axes[r][c], range(len(one))
            ax.bar([i - 0.2 for i in x], one[f"{col}_static"], 0.4, label="static batches")
            ax.bar([i + 0.2 for i in x], one[f"{col}_continuous"], 0.4, label="continuous")
            ax.set_xticks(list(x), list(one["label"]), rotation=30, ha="right", fontsize=8)
            ax.set(ylabel=name, title=f"batch {size}, {one['problems'].iloc[0]} problems")
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return fig


def _served(records: pd.DataFrame, x: str, xlabel: str, rows: tuple, rates: bool) -> Figure:
    """Load-test records (`bwprune.report.serving.load_records`): each of `rows` (column, label)
    against `x`, a curve per method through the median of its tests at each offered rate (each
    test a faint point where a rate has several), one column of panels per benchmark, model and
    seats; `rates`: each curve point labelled with its offered rate."""
    settings = sorted({tuple(r) for r in records[["benchmark", "model", "batch_size"]].values})
    fig = Figure(figsize=(4.6 * max(1, len(settings)) + 0.5, 6.0), layout="constrained")
    axes = fig.subplots(len(rows), max(1, len(settings)), squeeze=False)
    for c, (benchmark, model, seats) in enumerate(settings):
        one = records[(records["benchmark"] == benchmark) & (records["model"] == model)
                      & (records["batch_size"] == seats)]  # fmt: skip
        for r, (col, name) in enumerate(rows):
            ax = axes[r][c]
            for method in _methods(one):
                m = one[one["method"] == method].astype({col: float})
                line = m.groupby("rate")[[c for c in dict.fromkeys((x, col)) if c != "rate"]]
                line = line.median().sort_index()
                xs = line.index if x == "rate" else line[x]
                drawn = ax.plot(xs, line[col], marker="o", label=method)
                if len(m) > len(line):
                    ax.scatter(m[x], m[col], s=10, alpha=0.35, color=drawn[0].get_color())
                for rate, px, py in zip(line.index, xs, line[col]) if rates else ():
                    ax.annotate(f"{rate:g}/s", (px, py), fontsize=6, xytext=(3, 3),
                                textcoords="offset points")  # fmt: skip
            ax.set(xlabel=xlabel, ylabel=name, title=f"{benchmark}, {model}, {seats} seats")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return fig


def latency_throughput(records: pd.DataFrame) -> Figure:
    """Served methods under load: time per output token (p50) and end-to-end latency (p99)
    against achieved output tokens/s, one point per offered request rate."""
    rows = (("tpot_p50", "time per output token,\np50 (ms)"),
            ("e2e_p99", "end-to-end latency,\np99 (s)"))  # fmt: skip
    return _served(records, "output_throughput", "achieved output tokens/s", rows, rates=True)


def serving_fidelity(records: pd.DataFrame) -> Figure:
    """Served methods under load: answer agreement with dense served at the same rate and the
    dense model's NLL per token of the completions, against the offered rate."""
    rows = (("agreement", "answers equal to dense's"),
            ("nll", "dense NLL per token\nof the completions"))  # fmt: skip
    return _served(records, "rate", "offered requests/s (Poisson)", rows, rates=False)


def drift(runs: pd.DataFrame) -> Figure:
    """Realized vs target sparsity, a panel per batch size: thresholds drift, top-k does not.

    A row per benchmark and model: a threshold's realized sparsity depends on the text and the
    model's activations as much as on the batch, so a mean over both would draw no run's drift.
    """
    runs = runs[runs["method"] != "dense"]
    rows = sorted(set(zip(runs["benchmark"], runs["model"]))) or [("no runs", "")]
    sizes = sorted(runs["batch_size"].unique()) or [1]
    colours = {m: f"C{i}" for i, m in enumerate(_methods(runs))}  # a method's in every panel
    fig = Figure(figsize=(4.0 * len(sizes), 3.6 * len(rows)), layout="constrained")
    grid = fig.subplots(len(rows), len(sizes), squeeze=False)
    for axes, (benchmark, model) in zip(grid, rows):
        for ax, size in zip(axes, sizes):
            sub = runs[(runs["benchmark"] == benchmark) & (runs["model"] == model)
                       & (runs["batch_size"] == size)]  # fmt: skip
            if sub.empty:
                ax.set_axis_off()
                continue
            for method in _methods(sub):
                line = sub[sub["method"] == method].groupby("target_sparsity")
                line = line["realized_ffn_sparse_steps"].mean().sort_index()
                ax.plot(line.index, line.values, "o-", color=colours[method], label=method)
            ax.plot([0, 1], [0, 1], "k:", lw=1, label="realized = target")
            ax.set(title=f"{benchmark}, {model}, batch {size}", xlabel="target ρ",
                   ylabel="realized on pruned steps (b)", xlim=(0, 0.8), ylim=(0, 0.8))  # fmt: skip
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return fig


def speedup_vs_batch(speed_rows: list[dict]) -> Figure:
    """Decode speedup vs batch size per method and engine (compiled rows, `method@engine`, share
    the method's colour, dashed), with the method's schedule-aware bandwidth ideal (dotted)."""
    frame = pd.DataFrame([r for r in speed_rows if "speedup_decode" in r])
    frame["speedup"] = [r["median"] for r in frame["speedup_decode"]]
    frame["base"] = frame["method"].str.partition("@")[0]
    fig = Figure(figsize=(7.0, 3.8), layout="constrained")
    ax = fig.subplots()
    ax.axhline(1.0, color="0.6", lw=1, label="dense (each engine)")
    bases = [m for m in _methods(pd.DataFrame({"method": frame["base"]})) if m != "dense"]
    for i, base in enumerate(bases):
        color = f"C{i}"
        sub = frame[frame["base"] == base]
        for method in sorted(set(sub["method"]), key=len):
            rows = sub[sub["method"] == method].sort_values("batch_size")
            style = "o-" if method == base else "s--"
            ax.plot(rows["batch_size"], rows["speedup"], style, color=color, label=method)
        rows = sub[sub["method"] == base].sort_values("batch_size")
        ax.plot(rows["batch_size"], rows["ideal_bandwidth"], ":", color=color, lw=1,
                label=f"{base}: bandwidth ideal")  # fmt: skip
    ax.set(
        xlabel="batch size", ylabel="decode speedup vs dense", xscale="log", xticks=[1, 4, 8, 16]
    )
    ax.get_xaxis().set_major_formatter("{x:g}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def sparsity_over_steps(trace: dict) -> Figure:
    """Realized FFN sparsity of every decode step, one line per method (a `make traces` record).

    A scheduled top-k method shows its dense exploration steps and then exactly ρ; a threshold
    method wanders with the batch's activations.
    """
    fig = Figure(figsize=(7.0, 3.6), layout="constrained")
    ax = fig.subplots()
    ax.axhline(trace["target_sparsity"], color="0.6", ls=":", lw=1, label="target ρ")
    for method in _methods(pd.DataFrame({"method": list(trace["per_step"])})):
        ax.plot(trace["per_step"][method], lw=1.2, label=method)
    ax.set(
        title=f"{trace['model']} on {trace['benchmark']}, batch {trace['batch_size']}",
        xlabel="decode step", ylabel="realized FFN sparsity", ylim=(-0.02, 1.0),
    )  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    return fig


def refiring(trace: dict) -> Figure:
    """One layer's most active neurons over decode steps: they fall silent and fire again.

    Heat map of |act(gate)·up| (rows: neurons, most active on top; colour capped at the 99th
    percentile so quiet stretches stay visible); the title carries re-fire period and rate.
    """
    import numpy as np

    magnitudes = np.asarray(trace["magnitudes"])
    fig = Figure(figsize=(9.0, 4.2), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(magnitudes, aspect="auto", cmap="magma", interpolation="nearest",
                      vmax=float(np.quantile(magnitudes, 0.99)))  # fmt: skip
    period = "–" if trace["period"] is None else f"{trace['period']:g}"
    ax.set(
        title=f"{trace['model']}, layer {trace['layer']}: re-fire period {period} tokens "
        f"(median), rate {trace['rate']:.0%} of the top {trace['top_neurons']} neurons",
        xlabel="decode step", ylabel="neuron (by mean magnitude)",
    )  # fmt: skip
    fig.colorbar(image, ax=ax, label="|act(gate) · up|")
    return fig


TRACE_FIGURES = {"sparsity_steps": sparsity_over_steps, "refire": refiring}


def collapse_control(control: pd.DataFrame) -> Figure:
    """KL to dense (top) and completions identical to batch 1 (bottom) vs batch size, one line
    per curve of `report.control` (shared mask, per row, per row batch-invariant; seeds
    averaged); one column per method and evaluation: the collapse apart from float noise."""
    evaluations = list(dict.fromkeys(control["evaluation"]))  # in the frame's (sorted) order
    fig = Figure(figsize=(4.6 * max(1, len(evaluations)) + 0.5, 6.4), layout="constrained")
    axes = fig.subplots(2, max(1, len(evaluations)), squeeze=False)
    if not evaluations:
        axes[0][0].text(0.5, 0.5, "no batch-invariant runs", ha="center", va="center")
    rows = (("kl", "KL to dense"), ("identical", "completions identical\nto the smallest batch"))
    for c, key in enumerate(evaluations):
        one = control[control["evaluation"] == key]
        for r, (col, name) in enumerate(rows):
            ax = axes[r][c]
            styles = itertools.cycle(("o-", "s--", "^:", "d-.", "v-", "x--"))
            for (curve, points), style in zip(one.groupby("label"), styles):
                line = points.groupby("batch_size")[col].mean()
                ax.plot(line.index, line.values, style, label=curve)
            ax.set(xlabel="batch size", ylabel=name)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(one["batch_size"].unique()))
            ax.get_xaxis().set_major_formatter("{x:g}")
            ax.grid(alpha=0.3)
        first = one.iloc[0]
        title = (f"{first['benchmark']}, {first['model']}, {first['method']} ρ "
                 f"{first['target_sparsity']:g}\n{first['problems']} problems, "
                 f"{first['max_new_tokens']} tokens")  # fmt: skip
        axes[0][c].set_title(title, fontsize=9)
        axes[0][c].legend(fontsize=7)
    return fig
