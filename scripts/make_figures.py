"""`make figures`: every figure from the recorded runs -> results/figures/*.png."""

import sys
from pathlib import Path

from bwprune.config import compose_config
from bwprune.report.collect import load_runs
from bwprune.report.figures import accuracy_vs_realized_sparsity

ROOT = Path(__file__).resolve().parent.parent


def main(overrides: list[str]) -> None:
    paths = compose_config(ROOT / "conf", overrides).paths
    runs = load_runs(paths.runs_dir)
    if runs.empty:
        print(f"no runs yet under {paths.runs_dir}")
        return
    out = Path(paths.results_dir) / "figures"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "accuracy_vs_realized_sparsity.png"
    accuracy_vs_realized_sparsity(runs).savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
