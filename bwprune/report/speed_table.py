"""The speed table's cells (`bwprune.generation.speed` measures, this module only formats).

Plain strings, so the markdown written by `make bench` and the LaTeX of `make tables` show the same
numbers; no torch and no pandas, so the report and the GPU check can both import it.
"""

from __future__ import annotations

from bwprune.runs.interference import overloaded

SPEED_COLUMNS = (
    "batch", "method", "decode ms/step", "decode tok/s", "prefill ms", "e2e s", "speedup e2e",
    "speedup decode", "sparse steps", "bound (sparse step)", "ideal (bandwidth)",
    "ideal (measured r)",
)  # fmt: skip


def table_cells(rows: list[dict]) -> list[list[str]]:
    """The speed table's cells, one list per row in `SPEED_COLUMNS` order: medians with
    [min, max] (speedups recorded with an interval: [its low, its high]), speedups vs dense next
    to their bounds. Plain strings, so the markdown here and
    the LaTeX of `make tables` show the same numbers."""

    def fmt(v, scale=1.0, digits=2):
        if v is None:
            return "–"
        if isinstance(v, dict):  # a speedup's interval where it has one, else its range
            ends = ("low", "high") if "low" in v else ("min", "max")
            lo, mid, hi = (f"{v[k] * scale:.{digits}f}" for k in (ends[0], "median", ends[1]))
            return f"{mid} [{lo}, {hi}]"
        return f"{v * scale:.{digits}f}"

    def cells(r: dict) -> list[str]:
        return [
            str(r["batch_size"]), r["method"], fmt(r.get("step_ms"), digits=1),
            fmt(r.get("tokens_per_s"), digits=1), fmt(r.get("prefill_s"), 1e3, 1),
            fmt(r["e2e_s"]), fmt(r["speedup_e2e"]), fmt(r.get("speedup_decode")),
            fmt(r.get("sparse_fraction")), fmt(r.get("bandwidth_bound")),
            fmt(r.get("ideal_bandwidth")), fmt(r.get("ideal_measured_r")),
        ]  # fmt: skip

    return [cells(r) for r in rows]


def markdown_table(rows: list[dict]) -> str:
    """The speed table as markdown (`table_cells`), with what its speedups' brackets mean where
    they are intervals (`precision_note`)."""
    lines = ["| " + " | ".join(SPEED_COLUMNS) + " |", "|" + "---|" * len(SPEED_COLUMNS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_cells(rows)]
    note = precision_note(rows).strip()
    return "\n".join(lines) + "\n" + (f"\n{note}\n" if note else "")


PHASE_COLUMNS = (
    "batch", "method", "dense step ms", "sparse step ms", "refresh step ms", "refresh ms",
    "fill ms", "refreshes", "kept overlap", "decode speedup / ideal (measured r)",
)  # fmt: skip


def phase_table(rows: list[dict]) -> str:
    """Where the decode time of the rows that ran kept sets goes (`PhaseLog.summary`, medians
    over repeats): each kind of step, the host's time per refresh and per fill (a
    generation's first kept sets, every slot afresh), how many kept neurons stayed
    per refresh, and the decode speedup against its schedule-aware ideal (and, where a row ran
    on tensor-parallel shards, the ms its forwards spent gathering them); "" when no row ran a
    kept set."""
    rows = [r for r in rows if r.get("phases", {}).get("sparse_step_ms") is not None]
    if not rows:
        return ""

    def fmt(v, digits=1):
        return "–" if v is None else f"{v:.{digits}f}"

    sharded = any("gather_ms" in r["phases"] for r in rows)
    columns = PHASE_COLUMNS + (("all-gather ms per observing forward",) if sharded else ())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        p, ideal = r["phases"], r.get("ideal_measured_r")
        of_ideal = None if not ideal else r["speedup_decode"]["median"] / ideal
        cells = [str(r["batch_size"]), r["method"], fmt(p.get("dense_step_ms")),
                 fmt(p.get("sparse_step_ms")), fmt(p.get("refresh_step_ms")),
                 fmt(p.get("refresh_ms"), 2), fmt(p.get("fill_ms"), 2),
                 str(round(p.get("refreshes", 0))),
                 fmt(p.get("overlap"), 3), fmt(of_ideal, 2)]  # fmt: skip
        if sharded:
            cells.append(fmt(p.get("gather_ms"), 2))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compaction_line(c: dict) -> str:
    """One sentence for `bwprune.generation.speed.measure_compaction`'s record."""
    with_, without, ratio = (c[k]["median"] for k in
                             ("decode_s_compaction", "decode_s_without", "ratio"))  # fmt: skip
    return (
        f"Live-row compaction: {c['batch']} rows, {c['batch'] - 1} stop after {c['short']} tokens, "
        f"one runs to {c['long']}: decode {with_:.2f} s with, {without:.2f} s without "
        f"(ratio {ratio:.2f} {_bracket(c['ratio'])}, median of {c['repeats']})."
    )


def stream_line(c: dict) -> str:
    """One sentence for `bwprune.generation.speed.measure_streaming`'s record."""
    r, e2e = c["ratio"], c["ratio_e2e"]
    return (
        f"Continuous batching: {c['items']} answers in {c['batch']} slots, {c['capped']} run to "
        f"{c['long']} tokens, the others stop after {c['short'][0]}-{c['short'][1]}: decode "
        f"{c['tokens_per_s_continuous']['median']:.1f} tok/s continuous vs "
        f"{c['tokens_per_s_static']['median']:.1f} static batches (ratio {r['median']:.2f} "
        f"{_bracket(r)}; with prefill {e2e['median']:.2f}), median of {c['repeats']}."
    )


def precision_note(rows: list[dict]) -> str:
    """What the speedups' brackets mean, for a record whose rows carry `precision`
    (`bwprune.generation.timing.alternate_until`): the interval, the repeats per batch size,
    whether the target was reached and whether other work loaded the machine; "" for a record
    timed before intervals (its brackets are min-max)."""
    stops = {r["batch_size"]: r["precision"] for r in rows if "precision" in r}
    if not stops:
        return ""
    first = next(iter(stops.values()))
    parts = []
    for batch, p in stops.items():
        shared = overloaded(p["interference"]["load"], p["interference"]["cores"])
        flags = ("" if p["reached"] else ", target not reached") + (
            ", load above the cores" if shared else ""
        )
        parts.append(f"batch {batch}: {p['pairs']} repeats{flags}")
    return (
        f" Speedups: median [{100 * first['confidence']:g}% interval of the median], repeats "
        f"added until each is within ±{100 * first['target']:g}% ({'; '.join(parts)})."
    )


def _bracket(ratio: dict) -> str:
    """`[low, high] (interval of the median)` where the ratio has one, else `[min, max]` (records
    made before intervals)."""
    if "low" in ratio:
        return f"[{ratio['low']:.2f}, {ratio['high']:.2f}] (interval of the median)"
    return f"[{ratio['min']:.2f}, {ratio['max']:.2f}]"
