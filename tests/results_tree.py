"""A tiny results tree of real runs (tiny random Llama) for the report tests and the notebooks.

Not a fixture itself: test modules wrap `build_results_tree` in a fixture of the scope they need.
"""

from __future__ import annotations

import json
from pathlib import Path

from bwprune.experiment import run
from bwprune.generation.traces import record_traces
from tests.conftest import CONF_DIR, compose_cfg

# dense at two batch sizes (the agreement references), ours at both, and one ablation variant.
RUNS = (
    ["method=dense", "batch_size=1"],
    ["method=dense", "batch_size=2"],
    ["method=ours", "batch_size=2"],
    ["method=ours", "batch_size=2", "method.memory=false"],
    ["method=ours", "batch_size=1"],
)


# Both traces (results/traces/), small: the per-step sparsity of dense and ours, and re-firing.
TRACE = [
    "model=tiny_llama", "trace.sparsity.methods=[dense,ours]", "trace.sparsity.batch_size=2",
    "trace.sparsity.new_tokens=16", "trace.refire.new_tokens=40", "trace.refire.top_neurons=8",
]  # fmt: skip


def build_results_tree(root: Path) -> tuple[Path, list[str]]:
    """Run RUNS into `root` (a results_dir), write a speed record and the traces;
    (runs_dir, run keys)."""
    keys = []
    for overrides in RUNS:
        cfg = compose_cfg(
            ["model=tiny_llama", "limit=2", "generation.max_new_tokens=24", *overrides], root
        )
        keys.append(run(cfg)["run_key"])
    write_speed_record(root / "speed" / "fixture.json")
    record_traces(CONF_DIR, [f"paths.results_dir={root}", *TRACE])
    return root / "runs", keys


def write_speed_record(path: Path) -> None:
    """A made-up speed record (`bench_speed.py`'s layout, only the keys the figure reads)."""
    rows = [
        {"batch_size": b, "method": m, "speedup_decode": {"median": s}, "ideal_bandwidth": ideal}
        for b in (1, 4)
        for m, s, ideal in (("dense", 1.0, 1.0), ("ours", 1.2, 1.3))
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": "fixture", "rows": rows}, indent=1))
