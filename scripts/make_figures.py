"""`make figures`: every figure from the recorded runs and speed records -> results/figures/."""

import json
import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.report import figures
from bwprune.report.collect import load_runs

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    paths = compose_config(ROOT / "conf", overrides).paths
    out = Path(paths.results_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    made = {}
    runs = load_runs(paths.runs_dir)
    if not runs.empty:
        made["collapse_agreement"] = figures.collapse(runs, "agreement")
        made["collapse_accuracy"] = figures.collapse(runs, "accuracy")
        made["accuracy_vs_realized_sparsity"] = figures.accuracy_vs_realized_sparsity(runs)
        made["drift"] = figures.drift(runs)
    for speed in sorted((Path(paths.results_dir) / "speed").glob("*.json")):
        rows = json.loads(speed.read_text())["rows"]
        made[f"speedup_{speed.stem}"] = figures.speedup_vs_batch(rows)
    if not made:
        print(f"no runs yet under {paths.runs_dir}")
    for name, fig in made.items():
        fig.savefig(out / f"{name}.png", dpi=120)
        print(f"wrote {out / name}.png")


if __name__ == "__main__":
    main(sys.argv[1:])
