"""`make figures`: every figure from run records, speed records and traces -> results/figures/."""

import json
import sys
from pathlib import Path

from bwprune.errors import UserError
from bwprune.report import figures
from bwprune.report.control import control_runs
from bwprune.report.pareto import METRICS as PARETO_METRICS
from bwprune.report.selection import default_cells, default_runs, default_variants, pareto_runs
from bwprune.report.serving import load_records
from bwprune.report.wandb_source import report_config, source_runs

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    cfg = report_config(ROOT / "conf", overrides)
    try:
        runs, left_out = source_runs(cfg)
        if not runs.empty:
            defaults = default_variants(ROOT / "conf", runs)
            cells, every_size = default_cells(runs, defaults), default_runs(runs, defaults)
            points = pareto_runs(runs, defaults)  # every size, and the matched-cost runs
    except UserError as e:
        sys.exit(f"error: {e}")
    if left_out:
        print(left_out)
    results = Path(cfg.paths.results_dir)
    out = results / "figures"
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    if not runs.empty:
        for y in ("agreement", "kl", "accuracy"):  # the largest swept evaluation size
            made[f"collapse_{y}"] = figures.collapse(every_size, y)
        made["accuracy_vs_realized_sparsity"] = figures.accuracy_vs_realized_sparsity(cells)
        made["batch_sweep_accuracy"] = figures.batch_sweep_accuracy(cells)
        made["accuracy_vs_realized_cost"] = figures.accuracy_vs_realized_cost(cells)
        for y in PARETO_METRICS:  # each measure against realized (c), a curve per method
            made[f"pareto_{y}"] = figures.pareto(points, y)  # each evaluation its curves
        made["drift"] = figures.drift(cells)
        made["stream_kl"] = figures.stream_fidelity(runs)
        made["collapse_control_kl"] = figures.collapse_control(control_runs(runs, defaults))
    served = load_records(results / "serve")  # load tests: scripts/load_test.py
    if not served.empty:
        made["serving_latency_throughput"] = figures.latency_throughput(served)
        made["serving_fidelity"] = figures.serving_fidelity(served)
    for speed in sorted((results / "speed").glob("*.json")):
        rows = json.loads(speed.read_text()).get("rows")  # none in a `bench.parts` subset
        if rows:
            made[f"speedup_{speed.stem}"] = figures.speedup_vs_batch(rows)
    for path in sorted((results / "traces").glob("*.json")):
        trace = json.loads(path.read_text())
        if trace.get("kind") in figures.TRACE_FIGURES:
            made[path.stem] = figures.TRACE_FIGURES[trace["kind"]](trace)
        else:
            print(f"skipped {path}: not a `make traces` record")
    if not made:
        print(f"no runs, speed records or traces yet under {results}")
    for name, fig in made.items():
        fig.savefig(out / f"{name}.png", dpi=120)
        print(f"wrote {out / name}.png")


if __name__ == "__main__":
    main(sys.argv[1:])
