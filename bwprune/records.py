"""Run records on disk: one folder per resolved config, written as results are produced.

Layout of a run folder (see README "Results"):
  config.yaml    the resolved config, written first
  samples.jsonl  one line per (example, sample), appended and flushed after every batch
  timing.jsonl   one line per generated batch (prefill/decode seconds, per-step times)
  run.json       written last: metrics + provenance; its presence marks the run complete
Metrics are a pure function of samples.jsonl and timing.jsonl (`summarize`), so an interrupted run
resumes where it stopped and a rescored run needs no model. This module never imports torch at
import time and knows nothing of any method.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import statistics
import subprocess
from collections import Counter
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bwprune.config import package_data_dir
from bwprune.methods.ledger import combine

# Keys that never change what a run computes: they are left out of the run's identity.
# `sparsity` and `calibration` matter only through the method config that interpolates them.
NON_IDENTITY_KEYS = (
    "logger", "paths", "tags", "exp_name", "progress", "sparsity", "calibration", "hydra",
)  # fmt: skip
VERSIONED_PACKAGES = ("torch", "transformers", "math-verify", "hydra-core", "bwprune")
# Options added after runs were recorded: in a run's identity only when set away from their
# default, so adding one does not re-key (and so re-run) every recorded run.
LATE_OPTIONS = {("quality", "traces"): False}


def method_name(cfg: DictConfig) -> str:
    """A method's option name is its module's name: `baselines.teal.TEAL` -> `teal`."""
    return str(cfg.method._target_).rsplit(".", 2)[-2]


def target_sparsity(cfg: DictConfig) -> float:
    """The method's own target ρ (0 for methods without one, e.g. dense)."""
    return float(cfg.method.get("sparsity", 0.0))


def identity(cfg: DictConfig) -> dict:
    """The resolved config without the keys that cannot change the outputs."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    for (group, key), default in LATE_OPTIONS.items():
        if resolved.get(group, {}).get(key, default) == default:
            resolved.get(group, {}).pop(key, None)
    return _drop_cache_dirs({k: v for k, v in resolved.items() if k not in NON_IDENTITY_KEYS})


def _drop_cache_dirs(node):
    """Portable identity: where a cache lives never changes results (a method may carry
    `cache_dir`), and data shipped in the package is named relative to it, so the same config
    has the same key in every checkout."""
    if isinstance(node, dict):
        return {k: _drop_cache_dirs(v) for k, v in node.items() if k != "cache_dir"}
    if isinstance(node, list):
        return [_drop_cache_dirs(v) for v in node]
    if isinstance(node, str) and node.startswith(package_data_dir()):
        return "bwprune/data" + node[len(package_data_dir()) :]
    return node


def run_key(cfg: DictConfig) -> str:
    """`<benchmark>/<model>/<method>/rho=<ρ>_bs=<B>_seed=<s>_<hash8>`, unique per identity.

    ρ is the method's own `sparsity` (0 for methods without one, e.g. dense), so a dense run is the
    same run whatever top-level `sparsity` says.
    """
    ident = identity(cfg)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:8]
    rho = target_sparsity(cfg)
    leaf = f"rho={rho:g}_bs={cfg.batch_size}_seed={cfg.seed}_{digest}"
    return f"{cfg.benchmark.name}/{cfg.model.name}/{method_name(cfg)}/{leaf}"


def provenance(seed: int, device: str) -> dict:
    """Where a run's numbers came from: code version, package versions, machine."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    versions = {}
    for pkg in VERSIONED_PACKAGES:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    status = git("status", "--porcelain", "--untracked-files=no")
    import torch  # deferred: this module is also used by tools that never load a model

    return {
        "git_sha": git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "versions": versions,
        "python": platform.python_version(),
        "device": device,
        "device_name": torch.cuda.get_device_name()
        if device.startswith("cuda")
        else platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "hostname": platform.node(),
        "seed": seed,
    }


class RunRecorder:
    """Owns one run folder: appends samples and timings as they come, writes run.json last."""

    def __init__(self, root: str | Path, key: str) -> None:
        self.key = key
        self.dir = Path(root) / key
        self.samples_path = self.dir / "samples.jsonl"
        self.timing_path = self.dir / "timing.jsonl"
        self.run_path = self.dir / "run.json"

    def is_complete(self) -> bool:
        return self.run_path.exists()

    def record(self) -> dict:
        """The complete run's `run.json`."""
        return json.loads(self.run_path.read_text())

    def start(self, cfg: DictConfig) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in (self.samples_path, self.timing_path):
            if path.exists():  # drop a line a crash cut short, so appends start on a clean line
                rows = _read_jsonl(path)
                path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        (self.dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    def samples(self) -> list[dict]:
        return _read_jsonl(self.samples_path)

    def timings(self) -> list[dict]:
        return _read_jsonl(self.timing_path)

    @staticmethod
    def row_key(sample: dict) -> tuple[int, int]:
        """(problem index, sample number); rows written before `sample` existed are sample 0."""
        return sample["index"], sample.get("sample", 0)

    def done_keys(self) -> set[tuple[int, int]]:
        return {self.row_key(s) for s in self.samples()}

    def append(self, samples: Iterable[dict], timing: dict) -> None:
        """Write one batch; both files are flushed before generation goes on."""
        _append_jsonl(self.samples_path, samples)
        _append_jsonl(self.timing_path, [timing])

    def write(self, samples: list[dict], timings: list[dict]) -> None:
        """Both files at once, for records assembled from others (merged shards)."""
        for path, rows in ((self.samples_path, samples), (self.timing_path, timings)):
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    def finish(self, metrics: dict, prov: dict, extra: dict | None = None) -> dict:
        record = {
            "run_key": self.key,
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "metrics": metrics,
            "provenance": prov,
            **(extra or {}),
        }
        tmp = self.run_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(self.run_path)
        return record


def pass_at_1(samples: list[dict]) -> float:
    """Mean over problems of the fraction of their samples that are correct (unscorable = wrong).

    With one sample per problem this is plain accuracy; with n it is the unbiased pass@1 estimate
    (shared/research/baselines.md §6.5).
    """
    per_problem: dict[int, list[bool]] = {}
    for s in samples:
        per_problem.setdefault(s["index"], []).append(s["correct"] is True)
    if not per_problem:
        return 0.0
    return sum(sum(c) / len(c) for c in per_problem.values()) / len(per_problem)


def summarize(samples: list[dict], timings: list[dict], target_sparsity: float) -> dict:
    """`run.json` metrics from the per-sample and per-batch records.

    `n`, `correct`, `unscorable` count sample rows; `accuracy` is pass@1 over `problems`.
    """
    n = len(samples)
    correct = sum(1 for s in samples if s["correct"] is True)
    decode_s = sum(t["decode_s"] for t in timings)
    steps_ms = [ms for t in timings for ms in t["step_ms"]]
    problems = len({s["index"] for s in samples})
    return {
        "n": n,
        "problems": problems,
        "samples_per_problem": n / problems if problems else 0.0,
        "accuracy": pass_at_1(samples),
        "correct": correct,
        "unscorable": sum(1 for s in samples if s["correct"] is None),
        "unscorable_reasons": dict(
            Counter(s["score_reason"] for s in samples if s["correct"] is None)
        ),
        "target_sparsity": target_sparsity,
        "realized_sparsity": combine(s["sparsity"] for s in samples),
        "mean_new_tokens": sum(s["new_tokens"] for s in samples) / n if n else 0.0,
        "decode_tokens_per_s": sum(t["decode_tokens"] for t in timings) / decode_s
        if decode_s
        else 0.0,
        "decode_ms_per_step": statistics.median(steps_ms) if steps_ms else 0.0,
        "prefill_s": sum(t["prefill_s"] for t in timings),
        "decode_s": decode_s,
        "quality": _combine_quality([s.get("quality") for s in samples]),
    }


def _combine_quality(rows: list[dict | None]) -> dict:
    from bwprune.quality import combine_quality  # deferred: it needs torch

    return combine_quality(rows)


def _append_jsonl(path: Path, rows: Iterable[dict]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        f.flush()


def _read_jsonl(path: Path) -> list[dict]:
    """Complete lines only: a line cut short by a crash is dropped (and regenerated on resume)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows
