"""`make tables`: every table from the recorded runs -> results/tables/*.md and *.tex."""

import json
import sys
from pathlib import Path

from bwprune.errors import UserError
from bwprune.report.selection import default_variants
from bwprune.report.serving import load_records
from bwprune.report.tables import (
    all_tables,
    pareto_table,
    serving_table,
    speed_table,
    write_tables,
)
from bwprune.report.wandb_source import report_config, source_runs

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    cfg = report_config(ROOT / "conf", overrides)
    try:
        runs, left_out = source_runs(cfg)
        tables = {}
        if not runs.empty:
            defaults = default_variants(ROOT / "conf", runs)
            tables = all_tables(runs, defaults)
            # measures at common realized costs (c): conf/report/default.yaml `pareto_at`
            tables["pareto"] = pareto_table(runs, defaults, list(cfg.report.pareto_at))
    except UserError as e:
        sys.exit(f"error: {e}")
    if left_out:
        print(left_out)
    if runs.empty:
        print("no runs to tabulate")
    results = Path(cfg.paths.results_dir)
    for speed in sorted((results / "speed").glob("*.json")):
        rows = json.loads(speed.read_text()).get("rows")  # none in a `bench.parts` subset
        if rows:
            tables[f"speed_{speed.stem}"] = speed_table(speed.stem, rows)
    served = load_records(results / "serve")  # load tests: scripts/load_test.py
    if not served.empty:
        tables["serving"] = serving_table(served)
    write_tables(tables, results / "tables")
    print(f"wrote {len(tables)} tables (.md, .tex) from {len(runs)} runs to {results / 'tables'}")


if __name__ == "__main__":
    main(sys.argv[1:])
