"""What `run.py` prints and how it exits: a summary per run, or the one `error:` line the README
promises for anything the user can fix (exit 2), Ctrl-C included (exit 130, with what was kept).

The library raises and returns; only a command line decides what a person reads, so printing
lives here. `ResultsDirCheck` is a Hydra callback because Hydra writes its own logs under
`paths.results_dir` before any of bwprune's code runs; `LogFile` is Hydra's log file handler.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from bwprune.runs.identity import run_key
from bwprune.runs.recorder import RunRecorder
from bwprune.runs.speedup import step_span

BAD_INPUT, INTERRUPTED = 2, 130  # 130 = 128 + SIGINT, what a shell reports for Ctrl-C
PROBE_BYTES = 1 << 15  # written (and removed) before a run: more than Hydra saves before a job


def fail(message: str, status: int = BAD_INPUT) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def summary(record: dict, runs_dir: str) -> str:
    """The run's key, its headline numbers and its folder; for a run that was complete already,
    a line saying the numbers are the stored ones, so they are not mistaken for a new run's."""
    m = record["metrics"]
    rs = m.get("realized_sparsity") or {"ffn": 0.0, "params": 0.0}
    sparsity = f"  realized sparsity ffn {rs['ffn']:.3f} params {rs['params']:.3f}"
    if "perplexity" in m:
        line = f"  perplexity {m['perplexity']:.3f} ({m['n_tokens']} tokens){sparsity}"
    else:
        line = (
            f"  accuracy {m['accuracy']:.3f} ({m['correct']}/{m['n']}, {m['unscorable']} "
            f"unscorable, cut off {m.get('cut_off_rate', 0.0):.1%}){sparsity}  "
            f"decode {m['decode_tokens_per_s']:.1f} tok/s ({m['decode_ms_per_step']:.1f} ms/step)"
        )
    cost = m.get("cost")
    if cost:  # a matched-cost run: what its search chose, and on what
        line += (
            f"\n  matched cost: ρ {cost['rho']:g} realized {cost['quantity']} "
            f"{cost['realized']:.3f} (target {cost['target']:g} ± {cost['tolerance']:g}) on "
            f"{len(cost['calibration']['indices'])} calibration problems"
        )
    if m.get("speedup"):
        line += "\n" + speedup_line(m["speedup"], m.get("time_to_answer"))
    folder = f"{runs_dir}/{record['run_key']}"
    stored = (
        f"\n  stored: numbers of the run that finished at {record['finished_at']}; nothing was "
        f"generated now (delete {folder} to run it again)"
        if record.get("stored")
        else ""
    )
    return f"{record['run_key']}\n{line}\n  results: {folder}{stored}"


def speedup_line(s: dict, time_to_answer: float | None = None) -> str:
    """The paired speedup with its interval (min-max for runs timed before intervals), how the
    pairs met the target precision and what loaded the machine, the bound and ideal beside it,
    and what timing cost."""

    def x(spread: dict | None) -> str:
        if spread is None:  # no timed trial had any of this time (rows stopped at once)
            return "n/a"
        low, high, _ = step_span(spread)
        return f"{spread['median']:.2f}x [{low:.2f}, {high:.2f}]"

    waits = f"; time-to-answer {time_to_answer:.2f}x" if time_to_answer else ""
    return (
        f"  speedup vs dense (paired, {plural(s['batches'], 'batch')}, {_precision(s)}): "
        f"step {x(s['step'])}, end-to-end {x(s['e2e'])}; bandwidth bound "
        f"{s['bandwidth_bound']:.2f}x, schedule ideal {s['ideal']:.2f}x{waits}; timing took "
        f"{s['overhead_s']:.0f} s (+{100 * s['overhead_fraction']:.0f}% of generation)"
    )


def _precision(s: dict) -> str:
    """`6 trials` (min-max, timed before intervals) or `14 pairs, 95% interval ±2.1%, target ±3%
    reached`, with the load when other work shared the machine."""
    i = s.get("interval")
    if i is None:
        return f"{s['repeats']} trials"
    width = "none" if i["half_width"] is None else f"±{100 * i['half_width']:.1f}%"
    reached = "reached" if i["reached"] else "not reached"
    load = f"; load {i['load_max']:.1f} above the cores" if i["overloaded"] else ""
    return (
        f"{s['repeats']} pairs, {100 * i['confidence']:.0f}% interval {width}, target "
        f"±{100 * i['target']:g}% {reached}{load}"
    )


def interrupted(cfg: DictConfig) -> str:
    """What a Ctrl-C kept of the run (its folder keeps every batch recorded), and how to go on."""
    recorder = RunRecorder(cfg.paths.runs_dir, run_key(cfg))
    batches = recorder.timings()  # the committed batches: what a resumed run keeps
    if not batches:
        if recorder.cost_search() is not None:
            return (
                f"interrupted before any batch was recorded; the cost search is kept in "
                f"{recorder.cost_path}; run the same command again to resume from there"
            )
        return "interrupted before any batch was recorded; nothing was kept"
    samples = sum(len(t["indices"]) for t in batches)
    return (
        f"interrupted; kept {plural(len(batches), 'batch')} ({plural(samples, 'sample')}) in "
        f"{recorder.dir}; run the same command again to resume from there"
    )


def plural(n: int, noun: str) -> str:
    """`1 batch`, `2 batches`, `1 sample`, `0 samples`."""
    return f"{n} {noun}{'' if n == 1 else 'es' if noun.endswith(('s', 'ch')) else 's'}"


def results_dir_problem(results_dir: Any) -> str | None:
    """Why `paths.results_dir` cannot hold results, or None when it can (created if missing)."""
    if results_dir in (None, ""):
        return "paths.results_dir is not set; give a folder, e.g. paths.results_dir=results"
    path = Path(str(results_dir)).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"paths.results_dir={str(results_dir)!r} cannot be created: {e.strerror}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"paths.results_dir={str(results_dir)!r} is not writable"
    try:  # a full disk: Hydra's own config saving there would fail with its traceback
        with tempfile.TemporaryFile(dir=path) as probe:
            probe.write(bytes(PROBE_BYTES))
            probe.flush()
    except OSError as e:
        return (
            f"paths.results_dir={str(results_dir)!r} cannot be written: {e.strerror}; every batch "
            "recorded is kept, run the same command again once there is space"
        )
    return None


class LogFile(logging.FileHandler):
    """Hydra's log file (conf/config.yaml `hydra.job_logging`). Its lines also go to the console,
    so a write that fails (a full disk) is skipped, not printed as a traceback per log line: the
    run's own records report the full disk, in one line."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not isinstance(sys.exc_info()[1], OSError):
            super().handleError(record)


class ResultsDirCheck(Callback):
    """Registered in conf/config.yaml (`hydra.callbacks`): checks `paths.results_dir` before
    Hydra creates its run folder there, which would otherwise fail with Hydra's traceback."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config)

    @staticmethod
    def _check(config: DictConfig) -> None:
        problem = results_dir_problem(config.paths.results_dir)
        if problem:
            fail(problem)
