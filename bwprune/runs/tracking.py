"""Experiment trackers: W&B as a mirror of the local records, or nothing.

The local run folder is the source of truth; a tracker only mirrors it, and W&B keeps a copy of
the folder's files so `report.source=wandb` can rebuild it (bwprune/report/wandb_source.py). A
tracker failure is logged and never stops a run, and `finish` is always called (multirun jobs
share one process). After every batch the W&B run gets the running metrics of the rows recorded
so far, so a collapsing method shows on its page hours before the run ends.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import urllib.parse
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from bwprune.runs.identity import target_sparsity
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.summary import summarize

log = logging.getLogger(__name__)

# The run folder's files a W&B run carries, under RUN_FILES_DIR/ in its files: W&B writes its own
# config.yaml at the top level, which would clobber ours.
RUN_FILES = ("config.yaml", "run.json", "samples.jsonl", "timing.jsonl")
RUN_FILES_DIR = "bwprune"


# The x-axis of every per-batch curve: sample rows scored so far (the problem count with one sample
# per problem), so curves from runs at different batch sizes line up.
STEP_METRIC = "n"


class Tracker(Protocol):
    """What the experiment loop calls; every method returns normally whatever the backend does."""

    def log_batch(self, rows: list[dict], timing: dict) -> None: ...

    def log_run(self, record: dict, samples: list[dict]) -> None: ...

    def finish(self) -> None: ...


class NullTracker:
    """`logger=none`: records stay local."""

    def log_batch(self, rows: list[dict], timing: dict) -> None:
        pass

    def log_run(self, record: dict, samples: list[dict]) -> None:
        pass

    def finish(self) -> None:
        pass


class WandbTracker:
    """`logger=wandb`: config, per-batch running metrics, final metrics (acc/, sparsity/, speed/
    sections), a samples table and a copy of the run folder's files.

    The W&B run id is derived from the run key and opened with `resume="allow"`, so a resumed run
    continues its curves on the same W&B run instead of starting a new one.
    """

    def __init__(self, cfg: DictConfig, run_key: str, method: str) -> None:
        self.run: Any = None
        recorder = RunRecorder(cfg.paths.runs_dir, run_key)
        self.run_dir = recorder.dir
        # Rows of earlier sessions of a resumed run: the running metrics continue from them.
        self.samples, self.timings = recorder.samples(), recorder.timings()
        self.benchmark, self.target_sparsity = str(cfg.benchmark.name), target_sparsity(cfg)
        mode = cfg.logger.mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") or _logged_in() else "offline"
            if mode == "offline":
                log.info("wandb: no API key found, logging offline (upload later: `wandb sync`)")
        timeout = float(cfg.logger.connect_timeout_s)
        if mode == "online" and not _reachable(_base_url(), timeout):
            # wandb itself retries for ~90 s before giving up; a run should not wait on that.
            mode = "offline"
            log.warning("wandb: %s not reachable within %g s; logging offline instead "
                        "(upload later: `wandb sync`)", _base_url(), timeout)  # fmt: skip
        try:
            import wandb

            self.run = wandb.init(
                project=cfg.logger.project,
                entity=cfg.logger.entity,
                group=cfg.exp_name,
                job_type=method,
                name=run_key,
                id=wandb_run_id(run_key),
                resume="allow",
                tags=list(cfg.tags),
                config=OmegaConf.to_container(cfg, resolve=True),
                mode=mode,
                reinit="finish_previous",
            )
            self.run.define_metric(STEP_METRIC)
            self.run.define_metric("*", step_metric=STEP_METRIC)
        except Exception as e:  # the run must complete with its local records whatever wandb does
            log.warning("wandb.init failed (%s); continuing with local records only", e)

    def log_batch(self, rows: list[dict], timing: dict) -> None:
        """One history entry: the running metrics after this batch, and its live rows."""
        if self.run is None:
            return
        self.samples.extend(rows)
        self.timings.append(timing)
        try:
            m = running_metrics(self.samples, self.timings, self.target_sparsity, self.benchmark)
            self.run.log({**m, "live_rows": len(timing["indices"])})
        except Exception as e:
            log.warning("wandb logging failed (%s); local records are complete", e)

    def log_run(self, record: dict, samples: list[dict]) -> None:
        if self.run is None:
            return
        try:
            import wandb

            self.run.summary.update(summary_metrics(record))
            self._save_run_files()
            if not samples:
                return
            columns = ["index", "prediction", "gold", "correct", "new_tokens", "completion"]
            table = wandb.Table(columns=columns)
            for s in samples:
                table.add_data(*(s[c] for c in columns))
            self.run.summary["samples"] = table  # not `log`: history holds one entry per batch
        except Exception as e:
            log.warning("wandb logging failed (%s); local records are complete", e)

    def _save_run_files(self) -> None:
        """Upload the run folder's files now, as copies in W&B's files folder: a copy (not W&B's
        default symlink) keeps W&B from ever writing into the run folder, and lets `wandb sync`
        upload an offline run even after the results folder has moved."""
        files_dir = Path(self.run.dir)
        for name in RUN_FILES:
            src = self.run_dir / name
            if not src.exists():  # a perplexity run has no samples.jsonl or timing.jsonl
                continue
            dst = files_dir / RUN_FILES_DIR / name
            dst.parent.mkdir(exist_ok=True)
            shutil.copyfile(src, dst)
            self.run.save(str(dst), base_path=str(files_dir), policy="now", glob=False)

    def finish(self) -> None:
        if self.run is not None:
            try:
                self.run.finish()
            except Exception as e:
                log.warning("wandb.finish failed (%s)", e)
            self.run = None


# run.json metric -> W&B summary name; only the metrics a run has are logged.
SUMMARY_NAMES = {
    "target_sparsity": "sparsity/target",
    "decode_tokens_per_s": "speed/decode_tokens_per_s",
    "decode_ms_per_step": "speed/decode_ms_per_step",
    "prefill_s": "speed/prefill_s",
    "tokens_per_s": "speed/eval_tokens_per_s",
    "n": "n",
    "unscorable": "unscorable",
    "mean_new_tokens": "gen/mean_new_tokens",
    "tokens_per_problem": "gen/tokens_per_problem",
    "decode_s_per_problem": "speed/decode_s_per_problem",
}


def summary_metrics(record: dict) -> dict:
    """`acc/<bench>` or `ppl/<bench>`, `sparsity/...`, `speed/...`, `quality/...` of a run."""
    m, bench = record["metrics"], record["benchmark"]
    out = {name: m[key] for key, name in SUMMARY_NAMES.items() if key in m}
    if "accuracy" in m:
        out[f"acc/{bench}"] = m["accuracy"]
    if "perplexity" in m:
        out[f"ppl/{bench}"] = m["perplexity"]
    if m.get("n") and "unscorable" in m:
        out["unscorable_share"] = m["unscorable"] / m["n"]
    for key in ("ffn", "ffn_sparse_steps", "params"):
        if key in (m.get("realized_sparsity") or {}):
            out[f"sparsity/realized_{key}"] = m["realized_sparsity"][key]
    for key, value in (m.get("quality") or {}).items():
        out[f"quality/{key}"] = value
    speedup = m.get("speedup") or {}
    for key in ("step", "e2e"):  # the paired speedup over dense, with its spread and interval
        for stat, value in (speedup.get(key) or {}).items():
            out[f"speed/speedup_{key}_{stat}"] = value
    interval = speedup.get("interval") or {}
    for key in ("half_width", "target", "reached", "overloaded", "load_max", "steal_max"):
        if interval.get(key) is not None:
            out[f"speed/interval_{key}"] = interval[key]
    if interval:
        out["speed/pairs"] = speedup["repeats"]
    for key in ("bandwidth_bound", "ideal", "overhead_fraction"):
        if key in speedup:
            out[f"speed/speedup_{key}"] = speedup[key]
    if m.get("time_to_answer"):
        out["speed/time_to_answer"] = m["time_to_answer"]
    return out


def running_metrics(
    samples: list[dict], timings: list[dict], target_sparsity: float, benchmark: str
) -> dict:
    """The W&B metrics of the rows recorded so far, named as in the final summary.

    The same `summarize` as `run.json`, so each curve ends on the run's result.
    """
    return summary_metrics(
        {"benchmark": benchmark, "metrics": summarize(samples, timings, target_sparsity)}
    )


def wandb_run_id(run_key: str) -> str:
    """A W&B run id (lowercase hex) that is the same every time the run key is."""
    return hashlib.sha256(run_key.encode()).hexdigest()[:32]


def _logged_in() -> bool:
    netrc = os.path.expanduser("~/.netrc")
    return os.path.exists(netrc) and "api.wandb.ai" in open(netrc).read()


def _base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def _reachable(url: str, timeout_s: float) -> bool:
    """Can a TCP connection to the W&B server be opened within `timeout_s`?"""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def make_tracker(cfg: DictConfig, run_key: str, method: str) -> Tracker:
    return WandbTracker(cfg, run_key, method) if cfg.logger.backend == "wandb" else NullTracker()
