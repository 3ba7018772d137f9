"""`make tables`: every table from the recorded runs -> results/tables/*.md (and speed tables)."""

import shutil
import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.report.collect import load_runs
from bwprune.report.tables import all_tables, default_variants

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    paths = compose_config(ROOT / "conf", overrides).paths
    runs = load_runs(paths.runs_dir)
    out = Path(paths.results_dir) / "tables"
    out.mkdir(parents=True, exist_ok=True)
    if runs.empty:
        print(f"no runs yet under {paths.runs_dir}")
    else:
        defaults = default_variants(ROOT / "conf", sorted(runs["method"].unique()))
        for name, text in all_tables(runs, defaults).items():
            (out / f"{name}.md").write_text(text)
        print(f"wrote {len(all_tables(runs, defaults))} tables from {len(runs)} runs to {out}")
    for speed in sorted((Path(paths.results_dir) / "speed").glob("*.md")):
        shutil.copy(speed, out / f"speed_{speed.name}")
        print(f"speed table: {out / f'speed_{speed.name}'}")


if __name__ == "__main__":
    main(sys.argv[1:])
