"""The paper's tables, built from `load_runs` output; each is written as markdown and LaTeX.

Main, batch-size and sparsity tables use each method's default variant on each model (its yaml
defaults, with the model's own values from conf/model_method/); the ablation tables vary one
argument of `ours`; all but the runs table are about generation benchmarks (perplexity runs have
their own numbers). Runs that differ only in how many problems they saw (`limit`, `subset`) or in
generation settings compete for one cell, and the setting with the most problems is used
(`largest_evaluations`); seeds of one setting are averaged, different settings never are
(`bwprune.report.cells`). Every table lists its runs, each with how its samples ended: correct,
wrong, or unscorable by reason (bwprune/scoring).
Realized sparsity follows bwprune/engine/ledger.py (decode steps only): (a) FFN neurons over all
decode steps, (c) all parameters skipped per token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bwprune.report.accuracy import NOTE as ACCURACY_NOTE
from bwprune.report.accuracy import accuracy_cells
from bwprune.report.cells import check_cells, largest_evaluations
from bwprune.report.control import MEASURES as CONTROL_MEASURES
from bwprune.report.control import control_runs, protocol_runs
from bwprune.report.matched import is_matched, matched_frame
from bwprune.report.pareto import CURVE, X, curves, interpolate
from bwprune.report.selection import defaults_only, pareto_runs, row_mask
from bwprune.report.serving import NOTE as SERVING_NOTE
from bwprune.report.serving import serving_frame
from bwprune.report.spans import NOTE as SPAN_NOTE
from bwprune.report.spans import has_intervals, span_cell, with_spans
from bwprune.report.speed_table import SPEED_COLUMNS, precision_note, table_cells
from bwprune.report.stream import MEASURES as STREAM_MEASURES
from bwprune.report.stream import stream_pairs

FOOTNOTE = (
    "n = problems; values are means over seeds; acc = accuracy (pass@1; an unscorable sample "
    "counts as not correct); agree = answers equal to the matching dense run's, over the samples "
    "where either gave one; "
    "KL = token-level KL(dense ‖ method) on the dense model's continuation, teacher-forced; "
    "(a) realized FFN sparsity over decode steps; (b) on pruned steps only; "
    "(c) fraction of all parameters skipped per decode token; cut = fraction of samples cut at "
    "the token limit (max_new_tokens). "
    "Each run used lists its samples: correct, wrong (an answer, not the gold), unscorable by "
    "reason (truncated: cut at the token limit before answering; no_answer: ended without an "
    "answer; unfinished_think: the think block never closed)."
)


SPEEDUP_NOTE = FOOTNOTE + (
    " speedup (step) = dense decode time / method decode time on the same work (the method's "
    "own completions, teacher-forced), timed in the method's run, alternated with it "
    "(bwprune/generation/paired.py); range = slowest to fastest timed trial; time-to-answer = "
    "the same per-step ratio with each run's own number of decode steps, so longer answers "
    "count (bwprune/runs/speedup.py)."
)


@dataclass(frozen=True)
class Table:
    """A table, its title, and the runs its numbers come from."""

    title: str
    frame: pd.DataFrame
    run_keys: list[str]
    note: str = FOOTNOTE
    outcomes: dict[str, str] = field(default_factory=dict)  # run key -> how its samples ended

    def _run_line(self, key: str, code: str) -> str:
        """A run key, wrapped in `code` marks, and how its samples ended."""
        outcome = self.outcomes.get(key)
        return f"{code}{key}{code}" + (f" — {outcome}" if outcome else "")

    def markdown(self) -> str:
        body = (
            # None, not NaN, so tabulate prints a missing cell as "–"
            self.frame.astype(object)
            .where(self.frame.notna(), None)
            .to_markdown(index=False, floatfmt=".3f", missingval="–")
            if not self.frame.empty
            else "(no matching runs)"
        )
        keys = "".join(f"\n- {self._run_line(k, '`')}" for k in sorted(self.run_keys))
        used = f"\n\nRuns used:{keys}" if keys else ""
        return f"## {self.title}\n\n{body}\n\n{self.note}{used}\n"

    def latex(self) -> str:
        """A `table` environment for a paper; the note and the runs are comments above it."""
        keys = "".join(f"% {self._run_line(k, '')}\n" for k in sorted(self.run_keys))
        frame = self.frame if not self.frame.empty else pd.DataFrame({"": ["(no matching runs)"]})
        body = frame.to_latex(index=False, float_format="%.3f", na_rep="--", escape=True)
        return (
            f"% {self.title}: built by `make tables` from the run records.\n% {self.note}\n"
            f"% Runs used:\n{keys}\\begin{{table}}[t]\n\\centering\n"
            f"\\caption{{{_tex(self.title)}}}\n{_math(body)}\\end{{table}}\n"
        )


def _table(title: str, frame: pd.DataFrame, used: pd.DataFrame, note: str = FOOTNOTE) -> Table:
    """A table built from the runs in `used`, which its footnote lists with their outcomes."""
    return Table(title, frame, list(used["run_key"]), note, sample_outcomes(used))


def sample_outcomes(runs: pd.DataFrame) -> dict[str, str]:
    """Run key -> "c correct, w wrong, u unscorable (truncated t, no_answer a)", for generation
    runs: how much of a run's loss is a wrong answer and how much no answer at all."""
    out = {}
    for r in runs[runs["correct"].notna()].itertuples():
        wrong = r.n - r.correct - r.unscorable
        line = f"{r.correct} correct, {wrong} wrong, {r.unscorable} unscorable"
        reasons = r.unscorable_reasons if isinstance(r.unscorable_reasons, dict) else {}
        why = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
        out[r.run_key] = f"{line} ({why})" if why else line
    return out


def _tex(text: str) -> str:
    """Plain text (a caption) made safe for LaTeX."""
    for char in "\\&%$#_{}":
        text = text.replace(char, "\\" + char)
    return _math(text)


def _math(text: str) -> str:
    return text.replace("ρ", "$\\rho$").replace("‖", "$\\|$").replace("Δ", "$\\Delta$")


def _at_target(runs: pd.DataFrame, rho: float = 0.5) -> pd.DataFrame:
    return runs[(runs["method"] == "dense") | (runs["target_sparsity"] == rho)]


def _wide(
    runs: pd.DataFrame, index: list[str], column: str, values: dict[str, str]
) -> pd.DataFrame:
    """`values` (run column -> label) spread over `column`, flat headers such as `acc B=4`;
    a cell averages seeds of one setting only."""
    check_cells(runs, [*index, column])
    table = runs.pivot_table(index=index, columns=column, values=list(values), aggfunc="mean")
    short = {"batch_size": "B", "target_sparsity": "ρ", "benchmark": ""}[column]
    table.columns = [
        f"{values[v]} {short}={c:g}" if short else f"{values[v]} {c}" for v, c in table.columns
    ]
    return table.reset_index()


def main_table(runs: pd.DataFrame, defaults: dict[str, str], batch_size: int = 4) -> Table:
    """Per benchmark: problems, accuracy and KL to dense; then the accuracy mean, and agreement
    and realized sparsity averaged over the benchmarks, per method."""
    sel = _at_target(defaults_only(runs, defaults))
    sel = sel[sel["batch_size"] == batch_size]
    table = _wide(sel, ["model", "method"], "benchmark", {"problems": "n", "accuracy": "acc"})
    acc = [c for c in table.columns if c.startswith("acc ")]
    table["acc mean (shown)"] = table[acc].mean(axis=1, skipna=False)  # only over complete rows
    counts = [c for c in table.columns if c.startswith("n ")]
    table = table[["model", "method", *counts, *acc, "acc mean (shown)"]]
    table[counts] = table[counts].astype("Int64")
    kl = _wide(sel, ["model", "method"], "benchmark", {"kl": "KL"})
    extra = sel.groupby(["model", "method"], as_index=False).agg(
        agree=("agreement", "mean"), cut=("cut_off_rate", "mean"),
        **{"(a) ffn": ("realized_ffn", "mean"), "(c) params": ("realized_params", "mean")},
    )  # fmt: skip
    if not table.empty:
        table = table.merge(kl, on=["model", "method"], how="left").merge(extra)
        table = table.merge(_speedups(sel), on=["model", "method"], how="left")
    note = SPEEDUP_NOTE + (f" {SPAN_NOTE}" if has_intervals(sel) else "")
    return _table(f"Main table (batch {batch_size}, target ρ = 0.5)", table, sel, note)


SLIP_NOTE = (
    "slip = share of samples whose completion writes at least one false equation between numbers "
    "(`13 × 2 = 22`; rounding as written is not false; bwprune/scoring/arithmetic.py)."
)
# One row of the accuracy table per these.
ACCURACY_KEYS = ["benchmark", "model", "batch_size", "method"]


def accuracy_table(runs: pd.DataFrame, defaults: dict[str, str]) -> Table:
    """Every method at target ρ 0.5 at every batch size, one row per benchmark, model, batch
    size and method: accuracy with its interval and its paired difference to dense (McNemar),
    cut-off rate, the share of samples whose reasoning writes a false equation (where a method
    loses its arithmetic, not its reasoning), realized sparsity (a) and (c), KL to dense, paired
    speedup with its span and time-to-answer. The table the paper's claims are read from, in
    accuracy."""
    sel = _at_target(defaults_only(runs, defaults))
    sel = sel[sel["correct"].notna()]
    check_cells(sel, ACCURACY_KEYS)
    table = accuracy_cells(sel, ACCURACY_KEYS)
    if not table.empty:
        extra = sel.groupby(ACCURACY_KEYS, as_index=False).agg(
            cut=("cut_off_rate", "mean"), slip=("slipped", "mean"), KL=("kl", "mean"),
            **{"(a) ffn": ("realized_ffn", "mean"), "(c) params": ("realized_params", "mean")},
        )  # fmt: skip
        table = extra.merge(table, on=ACCURACY_KEYS)
        table = table.merge(_speedups(sel, ACCURACY_KEYS), on=ACCURACY_KEYS, how="left")
        first = table["method"] != "dense"  # dense heads its group, the rest alphabetical
        table = table.assign(_first=first).sort_values([*ACCURACY_KEYS[:3], "_first", "method"])
        table = table.rename(columns={"batch_size": "B"})[
            ["benchmark", "model", "B", "method", "n", "acc", "95 % CI", "Δ dense", "p", "cut",
             "slip", "(a) ffn", "(c) params", "KL", "speedup (step)", "range", "time-to-answer"]
        ]  # fmt: skip
    note = f"{SPEEDUP_NOTE} {ACCURACY_NOTE} {SLIP_NOTE}" + (
        f" {SPAN_NOTE}" if has_intervals(sel) else ""
    )
    return _table("Accuracy (target ρ = 0.5, every batch size)", table, sel, note)


def _speedups(sel: pd.DataFrame, keys: Sequence[str] = ("model", "method")) -> pd.DataFrame:
    """Per group of `keys`: the paired per-step speedup over dense (mean of its runs' medians, and
    the envelope of their spans: `bwprune.report.spans`) and the time-to-answer speedup, lengths
    included."""
    keys = list(keys)
    g = sel.groupby(keys, as_index=False).agg(
        speedup=("speedup_step", "mean"), tta=("time_to_answer", "mean")
    )
    spans = {k: span_cell(part, "speedup_step_low", "speedup_step_high")
             for k, part in sel.groupby(keys)}  # fmt: skip
    g["range"] = [spans[k] for k in g[keys].itertuples(index=False, name=None)]
    return g.rename(columns={"speedup": "speedup (step)", "tta": "time-to-answer"})[
        [*keys, "speedup (step)", "range", "time-to-answer"]
    ]


def batch_table(runs: pd.DataFrame, defaults: dict[str, str]) -> Table:
    """Accuracy, agreement, KL to dense and realized FFN sparsity (a) vs batch size: the
    collapse of batch-shared masks, and the drift of thresholded methods' realized sparsity.

    One row per evaluation (n problems, at most `tokens` new tokens each), so a row never mixes
    batch sizes measured on different problems or lengths; takes all runs, not one per cell."""
    used = _at_target(defaults_only(runs, defaults))
    sel = _evaluations(used)
    values = {"accuracy": "acc", "cut_off_rate": "cut", "agreement": "agree", "kl": "KL",
              "realized_ffn": "(a)"}  # fmt: skip
    table = _wide(sel, ["benchmark", "model", "method", "n", "tokens"], "batch_size", values)
    return _table("Batch size (target ρ = 0.5)", table, used)


def _evaluations(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with the evaluation as columns: `n` problems, `tokens` new tokens at most."""
    return runs.drop(columns="n").rename(columns={"problems": "n", "max_new_tokens": "tokens"})


def sparsity_table(runs: pd.DataFrame, defaults: dict[str, str], batch_size: int = 4) -> Table:
    """Accuracy and realized FFN sparsity (a) vs target sparsity, one row per evaluation."""
    sel = defaults_only(runs, defaults)
    sel = _evaluations(sel[(sel["batch_size"] == batch_size) & (sel["method"] != "dense")])
    values = {"accuracy": "acc", "realized_ffn": "(a)"}
    table = _wide(sel, ["benchmark", "model", "method", "n", "tokens"], "target_sparsity", values)
    return _table(f"Target sparsity (batch {batch_size})", table, sel)


def ablation_table(
    runs: pd.DataFrame, defaults: dict[str, str], arguments: tuple[str, ...]
) -> Table:
    """`ours` runs that differ from its defaults in `arguments` only (memory, aggregate, ...).
    Several arguments make one table when they are one setting: ours' period is t_prune +
    t_explore, and a run at the paper's small-model period changes both."""

    def others(variant: str) -> dict:
        return {k: v for k, v in json.loads(variant).items() if k not in arguments}

    sel = runs[runs["method"] == "ours"]
    default = [defaults.get(f"{model}/ours") for model in sel["model"]]
    same = [d is None or others(v) == others(d) for v, d in zip(sel["variant"], default)]
    sel = sel[row_mask(sel, same)].copy()
    variants = [json.loads(v) for v in sel["variant"]]  # parsed once, read per argument
    for argument in arguments:
        sel[argument] = [str(v.get(argument)) for v in variants]
    columns = {"slipped": "slip", "agreement": "agree", "kl": "KL", "realized_ffn": "(a) ffn",
               "realized_ffn_sparse_steps": "(b) ffn"}  # fmt: skip
    keys = ["benchmark", "model", "batch_size", "target_sparsity", *arguments]
    table = sel.groupby(keys, as_index=False, dropna=False).agg(dict.fromkeys(columns, "mean"))
    table = table.rename(columns=columns).merge(accuracy_cells(sel, keys), on=keys, how="left")
    table = table[[*keys, "n", "acc", "95 % CI", "Δ dense", "p", *columns.values()]]
    title = f"Ablation: {', '.join(arguments)}"
    return _table(title, table, sel, f"{FOOTNOTE} {ACCURACY_NOTE} {SLIP_NOTE}")


# Pareto table columns: load_runs column -> short label.
PARETO_COLUMNS = {"kl": "KL", "nll_increase": "ΔNLL", "agreement": "agree", "accuracy": "acc",
                  "time_to_answer": "TTA"}  # fmt: skip


def pareto_table(runs: pd.DataFrame, defaults: dict[str, str], at: Sequence[float]) -> Table:
    """Each measure read off each method's curve at the common realized costs (c) `at`
    (`bwprune.report.pareto`): methods compared at one cost, where one ρ costs each a different
    amount. A curve that does not reach a value leaves its cell blank (never extrapolated)."""
    sel = pareto_runs(runs, defaults)  # every evaluation size: each is its own curve
    sel = sel[(sel["method"] != "dense") & sel[X].notna()]
    on_curves = {y: curves(sel, y) for y in PARETO_COLUMNS}
    drawn = set().union(*on_curves.values())  # the curves `curves` keeps (swept settings)
    sel = sel[
        row_mask(sel, [key in drawn for key in sel[list(CURVE)].itertuples(index=False, name=None)])
    ]
    rows = []
    for key, span in sel.groupby(list(CURVE))[X].agg(["min", "max"]).iterrows():
        row = {**dict(zip(CURVE, key)), "(c) min": span["min"], "(c) max": span["max"]}
        for y, label in PARETO_COLUMNS.items():
            points = on_curves[y].get(key)
            for value in at:
                row[f"{label} @{value:g}"] = (
                    None if points is None else interpolate(points, y, value)
                )
        rows.append(row)
    frame = pd.DataFrame(rows).rename(
        columns={"problems": "n", "max_new_tokens": "tokens", "batch_size": "B"}
    )
    note = (
        f"Measures at realized cost (c) = {', '.join(f'{v:g}' for v in at)}, parameters skipped "
        "per decode token, read off each method's curve through its runs at several ρ and its "
        "matched-cost runs (matched_cost.md) by linear interpolation; – where the curve does not "
        "reach the value to the shown precision (never extrapolated); (c) min/max: the span of "
        "its runs. ΔNLL = NLL increase over dense. TTA = time-to-answer "
        "speedup over the matching dense run (paired per-step timing scaled by each run's own "
        "decode steps, bwprune/runs/speedup.py; runs timed with `scripts/measure_speedup.py` where "
        "they ran with speed.paired=false). " + FOOTNOTE
    )
    return Table("Pareto: measures at common realized cost (c)", frame, list(sel["run_key"]),
                 note, sample_outcomes(sel))  # fmt: skip


# Ablation tables: file stem -> the arguments its runs vary (the rest at ours' defaults).
ABLATIONS = {
    "memory": ("memory",),
    "aggregate": ("aggregate",),
    "select": ("select",),
    "t_init": ("t_init",),
    "t_explore": ("t_explore",),
    "t_prune": ("t_prune",),
    "period": ("t_prune", "t_explore"),
}

RUNS_COLUMNS = [
    "run_key", "n", "accuracy", "agreement", "kl", "target_sparsity", "cost_target", "realized_ffn",
    "realized_ffn_sparse_steps", "realized_params", "speedup_step", "speedup_step_span",
    "time_to_answer", "time_to_answer_span", "decode_tokens_per_s", "device",
]  # fmt: skip


def matched_table(runs: pd.DataFrame, defaults: dict[str, str]) -> Table:
    """Every matched-cost run of a default variant (`bwprune.report.matched`), one row each."""
    sel = pareto_runs(runs, defaults)
    sel = sel[is_matched(sel)]
    note = (
        "Runs whose ρ was chosen so that a realized cost lands on a target (`cost.target`, "
        "bwprune/generation/cost_target.py): quantity params = (c), parameters skipped per "
        "decode token; "
        "ffn = (a). realized (calib.): what the chosen ρ realized on the calibration problems "
        "(the benchmark's last `cost.problems` not evaluated), within `cost.tolerance` of the "
        "target; (c) and (a): what it realized on the evaluated problems. step = paired per-step "
        "speedup over dense; TTA = time-to-answer speedup over the matching dense run (runs with "
        f"a paired timing only); their spans: {SPAN_NOTE} " + FOOTNOTE + f" {ACCURACY_NOTE}"
    )
    cells = accuracy_cells(sel, ["run_key"]).drop(columns=["n", "acc"])
    frame = matched_frame(with_spans(sel).merge(cells, on="run_key", how="left"))
    return _table("Matched cost: each method at one realized cost", frame, sel, note)


def stream_table(runs: pd.DataFrame) -> Table:
    """Continuous batching next to static batches, run for run (`bwprune.report.stream`)."""
    pairs = stream_pairs(runs)
    columns = {"problems": "n", "batch_size": "B", "label": "method"}
    for col, name in STREAM_MEASURES.items():
        columns.update({f"{col}_static": f"{name} static", f"{col}_continuous": f"{name} cont."})
    frame = pairs[["benchmark", "model", *columns]].rename(columns=columns) if len(pairs) else pairs
    keys = {k for pair in pairs.get("run_keys", []) for k in pair}
    used = runs[runs["run_key"].isin(keys)]
    note = (
        "Each continuously batched run (`generation.batching=continuous`: a finished row's slot "
        "takes the next problem at once) beside the run equal to it in all but the batching "
        "(static batches). ours (policy): its activation-memory policy for streams "
        "(conf/method/ours.yaml `memory_policy`). " + FOOTNOTE
    )
    return _table("Streams: continuous vs static batching", frame, used, note)


def control_table(runs: pd.DataFrame, defaults: dict[str, str]) -> Table:
    """The batch-invariant control next to the batched runs of the same method and evaluation,
    one row per curve (`bwprune.report.control`)."""
    sel = control_runs(runs, defaults)
    index = ["benchmark", "model", "n", "tokens", "target_sparsity", "label"]
    sel = _evaluations(sel)
    table = _wide(sel, index, "batch_size", CONTROL_MEASURES) if len(sel) else sel
    if len(sel):  # measures in CONTROL_MEASURES order, batch sizes ascending within each
        names = CONTROL_MEASURES.values()
        table = table[
            [*index, *(c for n in names for c in table.columns if c.startswith(f"{n} B="))]
        ]
    note = (
        "Per method: its default variant in batches (the papers' protocol: a shared mask, plus "
        "float noise), its per-row variant in batches (float noise only) and the same computed "
        "row by row (`generation.batch_invariant=true`: neither). same = fraction of samples "
        "whose completion is the same text as in the curve's run at its smallest batch size. "
        + FOOTNOTE
    )
    used = sel.drop_duplicates("run_key")  # a batch-1 run may be the point of two curves
    return _table("Batch-invariant control (KL to dense vs batch size)", table, used, note)


def runs_table(runs: pd.DataFrame) -> Table:
    """Every recorded run, one line each, target vs realized sparsity side by side."""
    table = runs.sort_values(["benchmark", "model", "method", "batch_size", "target_sparsity"])
    table = with_spans(table)
    note = f"{FOOTNOTE} Spans of the per-step and time-to-answer speedups: {SPAN_NOTE}"
    return _table("All runs", table[RUNS_COLUMNS], table, note)


def speed_table(name: str, rows: list[dict]) -> Table:
    """A `make bench` record (results/speed/<name>.json) as a table."""
    note = (
        f"Median [min, max] over repeats, methods alternated in one process (`make bench`; "
        f"record: results/speed/{name}.json). Bounds: bwprune/generation/speed.py."
    ) + precision_note(rows)
    frame = pd.DataFrame(table_cells(rows), columns=list(SPEED_COLUMNS))
    return Table(f"Speed: {name}", frame, [], note)


def serving_table(records: pd.DataFrame) -> Table:
    """The load tests (`bwprune.report.serving.load_records`): served methods by request rate."""
    frame = serving_frame(records)
    keys = [] if records.empty else list(records["key"])
    return Table("Serving under load: vLLM's server, Poisson arrivals", frame, keys, SERVING_NOTE)


def all_tables(runs: pd.DataFrame, defaults: dict[str, str]) -> dict[str, Table]:
    """File stem -> table, for `make tables`; all but `runs` and `batch_size` use one run per
    cell; runs in the papers' protocol only (`protocol_runs`), but in `runs`, `stream`
    (continuous beside static), `batch_control` (batch-invariant beside batched) and
    `matched_cost` (runs at a cost target)."""
    every = runs
    runs = protocol_runs(runs)
    generation = runs[runs["perplexity"].isna()]
    cells = largest_evaluations(generation)
    tables = {
        "runs": runs_table(every),
        "stream": stream_table(every),
        "matched_cost": matched_table(every, defaults),
        "batch_control": control_table(every, defaults),
        "main": main_table(cells, defaults),
        "accuracy": accuracy_table(cells, defaults),
        "batch_size": batch_table(generation, defaults),
        "sparsity": sparsity_table(cells, defaults),
    }
    for name, arguments in ABLATIONS.items():
        tables[f"ablation_{name}"] = ablation_table(cells, defaults, arguments)
    return tables


def write_tables(tables: dict[str, Table], out: Path) -> None:
    """`<stem>.md` and `<stem>.tex` for every table."""
    out.mkdir(parents=True, exist_ok=True)
    for stem, table in tables.items():
        (out / f"{stem}.md").write_text(table.markdown())
        (out / f"{stem}.tex").write_text(table.latex())
