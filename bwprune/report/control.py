"""The batch-invariant control: what a batch-shared mask does to a method, apart from float noise.

A method that is not batch-coupled (TEAL or CATS per token, `shared_mask=false`) still moves with
the batch size when rows are computed together: batched matmuls round differently (~1e-6),
near-threshold activations flip, and the flips compound over a generation. Computed alone
(`generation.batch_invariant=true`), a row gives the same bits at every batch size. So three
curves per method separate the two causes of the collapse:

- the method's default variant, batched (the papers' protocol): the shared mask and the noise;
- its per-row variant, batched: the noise only;
- its per-row variant, batch-invariant: neither, flat by construction (the control).

Every other table and figure uses the papers' protocol only (`protocol_runs`). Pure pandas on
`load_runs` output.
"""

from __future__ import annotations

import json

import pandas as pd

from bwprune.report.matched import nominal
from bwprune.report.stream import static_runs

# Shown with each curve's evaluation: what a reader needs to tell two panels apart.
SHOWN = ("benchmark", "model", "method", "problems", "max_new_tokens", "target_sparsity")
# Shown per batch size: column -> label.
MEASURES = {"kl": "KL", "identical": "same", "realized_ffn": "(a)"}
INVARIANT = ", batch-invariant"  # the label suffix of a batch-invariant curve


def invariant(runs: pd.DataFrame) -> pd.Series:
    """Which runs computed each row alone (`generation.batch_invariant`; older runs did not)."""
    if "batch_invariant" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["batch_invariant"].fillna(False).astype(bool)


def computed_together(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs in static batches whose rows are computed together, at a given ρ or a matched
    cost. Streams (`report.stream`) and the batch-invariant control (here) have views of their
    own."""
    runs = static_runs(runs)
    return runs[~invariant(runs)]


def protocol_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs in the papers' protocol: `computed_together`, at the ρ they were given (a
    matched-cost run is a point of the Pareto view only, `report.matched`)."""
    return nominal(computed_together(runs))


def label(method: str, variant: str, default: str | None, batch_invariant: bool) -> str:
    """`teal`, `teal shared_mask=false`, `teal shared_mask=false, batch-invariant`: the method,
    the arguments in which its variant differs from its default, and how rows were computed."""
    mine, base = json.loads(variant), json.loads(default) if default else {}
    changed = " ".join(
        f"{k}={json.dumps(v)}" for k, v in sorted(mine.items()) if base.get(k, v) != v
    )
    return f"{method} {changed}".strip() + (INVARIANT if batch_invariant else "")


def evaluation(run: pd.Series) -> str:
    """What a run's curves share: its settings and quality settings without the batch size, the
    batch-invariant flag and its method's variant arguments (those make the curves). Curves
    drawn together were computed alike in everything else (calibration, limit, lengths)."""
    ident = json.loads(run["settings"])
    ident.pop("batch_size", None)
    ident.get("generation", {}).pop("batch_invariant", None)
    variant = json.loads(run["variant"])
    method = {k: v for k, v in ident.pop("method", {}).items() if k not in variant}
    keys = [run["benchmark"], run["model"], run["method"], method, ident, run["measured"]]
    return json.dumps(keys, sort_keys=True, default=str)


def control_runs(runs: pd.DataFrame, defaults: dict[str, str]) -> pd.DataFrame:
    """Static generation runs at every `evaluation` where a method has a batch-invariant run,
    with `evaluation`, `label` (`label`) and `identical`: the fraction of samples whose
    completion is the same text as in the run of the same curve and seed at the smallest batch
    size (1.0 there). `defaults`: `<model>/<method>` -> default variant
    (`selection.default_variants`)."""
    runs = nominal(static_runs(runs[runs["perplexity"].isna()]))
    flagged = invariant(runs)
    if runs.empty or not flagged.any():
        return runs.iloc[0:0].assign(evaluation=[], label=[], identical=[])
    runs = runs.assign(evaluation=[evaluation(r) for _, r in runs.iterrows()])
    sel = runs[runs["evaluation"].isin(set(runs.loc[flagged, "evaluation"]))].copy()
    sel["label"] = [
        label(r.method, r.variant, defaults.get(f"{r.model}/{r.method}"), flag)
        for r, flag in zip(sel.itertuples(), invariant(sel))
    ]
    sel = _batch_one_in_both(sel)
    sel["identical"] = _identical_to_smallest(sel)
    return sel.sort_values([*SHOWN, "evaluation", "label", "batch_size", "seed"]).reset_index(
        drop=True
    )


def _batch_one_in_both(sel: pd.DataFrame) -> pd.DataFrame:
    """At batch 1 a row is alone whatever the flag (the runner takes the same path): a batch-1
    run is the batch-1 point of both curves of its variant, batched and batch-invariant, where
    only one of the two was run at batch 1."""
    base = sel["label"].str.removesuffix(INVARIANT).rename("base")
    copies = []
    for _, curves in sel.groupby(["evaluation", base]):
        labels = set(curves["label"])
        ones = curves[curves["batch_size"] == 1]
        if len(labels) == 2 and len(set(ones["label"])) == 1:
            other = (labels - set(ones["label"])).pop()
            copies.append(ones.assign(label=other))
    return pd.concat([sel, *copies], ignore_index=True)


def _identical_to_smallest(sel: pd.DataFrame) -> list[float | None]:
    """Per run, the fraction of its samples whose completion digest equals the one of the same
    sample in the run of its curve (evaluation and label) and seed at the smallest batch size."""
    smallest = {}
    for _, run in sel.sort_values("batch_size", kind="stable").iterrows():
        smallest.setdefault((run["evaluation"], run["label"], run["seed"]), run["completions"])
    out = []
    for _, run in sel.iterrows():
        first, mine = smallest[(run["evaluation"], run["label"], run["seed"])], run["completions"]
        common = [k for k in mine if k in first]
        out.append(sum(mine[k] == first[k] for k in common) / len(common) if common else None)
    return out
