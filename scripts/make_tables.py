"""`make tables`: every table from the recorded runs -> results/tables/*.md."""

import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.report.collect import load_runs
from bwprune.report.tables import runs_table

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    paths = compose_config(ROOT / "conf", overrides).paths
    runs = load_runs(paths.runs_dir)
    if runs.empty:
        print(f"no runs yet under {paths.runs_dir}")
        return
    out = Path(paths.results_dir) / "tables"
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.md").write_text(runs_table(runs))
    print(f"wrote {out / 'runs.md'} ({len(runs)} runs)")


if __name__ == "__main__":
    main(sys.argv[1:])
