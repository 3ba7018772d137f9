"""Which dense run a method run is compared with: the one equal to it in everything but the method.

Tables (agreement), the viewer and a run's time-to-answer all pair runs here, so they never pair
differently. Torch-free: it reads config.yaml files only.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from bwprune.runs.identity import ENGINE_KEYS, LATE_OPTIONS
from bwprune.runs.speedup import time_to_answer

# What must match for a dense run to be a method run's reference.
PAIRING = ("benchmark", "model", "batch_size", "seed", "limit", "subset", "generation")


def pairing_key(cfg: dict, benchmark: str, model: str) -> str:
    """What a method run and its dense reference share (`PAIRING`), as one comparable string.
    The engine's settings are not compared (they never change what a run computes), nor options
    added later while at their default (`records.LATE_OPTIONS`), nor `batching`: dense rows do
    not see each other, so a static dense run is every schedule's reference (tested)."""
    picked = {k: cfg.get(k) for k in PAIRING if k not in ("benchmark", "model")}
    gen = picked["generation"]
    if isinstance(gen, dict):  # engine keys, and late options at their default, say nothing
        late = {k: v for (g, k), v in LATE_OPTIONS.items() if g == "generation"}
        picked["generation"] = {
            k: v for k, v in gen.items()
            if k not in (*ENGINE_KEYS, "batching") and not (k in late and v == late[k])
        }  # fmt: skip
    return json.dumps([benchmark, model, picked], sort_keys=True, default=str)


def matching_dense_runs(run_dir: str | Path, cfg: dict) -> list[Path]:
    """The complete, unsharded dense runs next to `run_dir` (`<bench>/<model>/<method>/<run>`)
    that pair with `cfg`, the run's resolved config; in path order, as the tables pick the last."""
    key = pairing_key(cfg, cfg["benchmark"]["name"], cfg["model"]["name"])
    found = []
    for path in sorted((Path(run_dir).parent.parent / "dense").glob("*/run.json")):
        other = yaml.safe_load((path.parent / "config.yaml").read_text())
        if other.get("num_shards", 1) == 1 and key == pairing_key(
            other, other["benchmark"]["name"], other["model"]["name"]
        ):
            found.append(path.parent)
    return found


def time_to_answer_vs_dense(run_dir: str | Path, cfg: dict, metrics: dict) -> float | None:
    """`bwprune.runs.speedup.time_to_answer` against the matching dense run (None: there is none
    yet, or the run has no paired speedup)."""
    found = matching_dense_runs(run_dir, cfg)
    if not found or not metrics.get("speedup"):
        return None
    return time_to_answer(metrics, run_metrics(found[-1]))


def run_metrics(folder: Path) -> dict:
    """A complete run's run.json metrics, with `decode_iterations` counted from timing.jsonl
    for runs recorded before the key existed (time-to-answer needs it of the dense run)."""
    m = json.loads((folder / "run.json").read_text())["metrics"]
    if "decode_iterations" not in m:
        lines = (folder / "timing.jsonl").read_text().splitlines()
        m["decode_iterations"] = sum(len(json.loads(line)["step_ms"]) for line in lines)
    return m
