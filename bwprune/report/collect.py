"""Collect finished runs (`run.json` + `config.yaml`) into one table, one row per run.

Tables and figures are built from these files only, never from W&B, so anyone with the results
folder can rebuild them. Agreement with dense is computed here too: a run's final answers are
compared with those of the dense run that matches it in everything but the method, and so is the
paired accounting of correct answers behind a table's McNemar test (`bwprune.report.significance`).
Which runs enter is the caller's choice (`keys`); `committed_keys` gives the ones `make tables`
uses.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from pathlib import Path

import pandas as pd
import yaml

from bwprune.errors import choices_error
from bwprune.runs.identity import LATE_OPTIONS, settings
from bwprune.runs.pairing import pairing_key, run_metrics
from bwprune.runs.provenance import git
from bwprune.runs.speedup import step_span, time_to_answer, time_to_answer_span
from bwprune.scoring.arithmetic import check_arithmetic

# Method keys that say what is pruned how much, or name the method, not which variant it is: runs
# recorded before conf/method/*.yaml carried `name` are the same variants as those after.
NOT_VARIANT = ("_target_", "name", "sparsity", "calibration", "cache_dir")
RUN_SETS = ("committed", "all")  # report.runs: which runs `make tables` reads (`report_runs`)


def method_variant(method_cfg: dict) -> str:
    """The method's non-default-able arguments as canonical JSON (e.g. memory/aggregate). An
    argument added later (`records.LATE_OPTIONS`) at its default is left out, as from run keys:
    runs recorded before it are the variant they were."""
    late = {key: value for (group, key), value in LATE_OPTIONS.items() if group == "method"}
    variant = {
        k: v
        for k, v in method_cfg.items()
        if k not in NOT_VARIANT and (k not in late or late[k] != v)
    }
    return json.dumps(variant, sort_keys=True)


def committed_keys(runs_dir: str | Path) -> set[str] | None:
    """Keys of the runs whose run.json git tracks under `runs_dir` (runs are git-ignored, and
    those behind published tables are added with `git add -f`); None outside a git work tree."""
    listed = git(runs_dir, "ls-files", "-z", "--", ".")
    if listed is None:
        return None
    return {str(Path(p).parent) for p in listed.split("\0") if Path(p).name == "run.json"}


def report_runs(runs_dir: str | Path, which: str) -> tuple[pd.DataFrame, str | None]:
    """The runs `make tables` and `make figures` use, and a note on the runs left out (or None).

    `which="committed"`: only the runs git tracks, where `runs_dir` is in a git work tree, so an
    ad-hoc run (`make run`, a smoke run, a sweep not yet added) never enters or rewrites the
    committed tables; a folder outside git (a W&B download) is used whole. `"all"`: every run.
    """
    if which not in RUN_SETS:
        raise choices_error("report.runs", which, RUN_SETS)
    keys = committed_keys(runs_dir) if which == "committed" else None
    if keys is None:
        return load_runs(runs_dir), None
    left_out = [p for p in Path(runs_dir).glob("*/*/*/*/run.json")
                if p.parent.relative_to(runs_dir).as_posix() not in keys]  # fmt: skip
    note = (
        f"left out {len(left_out)} run(s) under {runs_dir} that git does not track (add them "
        "with `git add -f`, or pass report.runs=all to include every run)"
        if left_out
        else None
    )
    return load_runs(runs_dir, keys), note


def load_runs(runs_dir: str | Path, keys: Collection[str] | None = None) -> pd.DataFrame:
    """One row per complete run under `runs_dir` (of those in `keys`, unless None): names,
    config, settings, metrics, agreement with dense (a dense run left out is no reference).

    A shard (`num_shards` > 1) is part of a run, not a run: it is left out, and its run appears
    once the shards are merged (`bwprune.runs.shards`). `settings` is the run's identity without the
    seed, `quality` apart (`measured`): quality only adds measurements to the same samples.
    """
    rows, predictions, completions, outcomes = [], {}, {}, {}
    for path in sorted(Path(runs_dir).glob("*/*/*/*/run.json")):
        record = json.loads(path.read_text())
        cfg = yaml.safe_load((path.parent / "config.yaml").read_text())
        if cfg.get("num_shards", 1) > 1 or (keys is not None and record["run_key"] not in keys):
            continue
        ident = settings(cfg)
        measure = ident.pop("quality", None) or {}
        m = record["metrics"]
        rs = m.get("realized_sparsity") or {}
        quality = m.get("quality") or {}
        key = record["run_key"]
        read = _samples(path.parent / "samples.jsonl")
        predictions[key], completions[key], outcomes[key], cut, slipped = read
        rows.append(
            {
                "run_key": key,
                "finished_at": record.get("finished_at"),
                "benchmark": record.get("benchmark"),
                "model": record.get("model"),
                "method": record.get("method"),
                "variant": method_variant(cfg["method"]),
                "settings": json.dumps(ident, sort_keys=True, default=str),
                "measured": json.dumps(measure, sort_keys=True) if measure.get("enabled") else None,
                "pairing": pairing_key(cfg, record.get("benchmark"), record.get("model")),
                "batch_size": cfg["batch_size"],
                "seed": cfg["seed"],
                "limit": cfg.get("limit"),
                "max_new_tokens": (cfg.get("generation") or {}).get("max_new_tokens"),
                "batching": (cfg.get("generation") or {}).get("batching", "static"),
                "backend": (cfg.get("generation") or {}).get("backend", "hf"),
                "batch_invariant": bool((cfg.get("generation") or {}).get("batch_invariant")),
                "n": m.get("n"),
                "problems": m.get("problems", m.get("n")),
                "accuracy": m.get("accuracy"),
                "correct": m.get("correct"),
                "unscorable": m.get("unscorable"),
                "unscorable_reasons": m.get("unscorable_reasons"),
                "cut_off_rate": cut,
                "slipped": slipped,
                "target_sparsity": m["target_sparsity"],  # a matched-cost run's: its chosen ρ
                **_cost_columns(cfg.get("cost"), m.get("cost")),
                "realized_ffn": rs.get("ffn"),
                "realized_ffn_sparse_steps": rs.get("ffn_sparse_steps"),
                "realized_params": rs.get("params"),
                "sparse_step_fraction": rs.get("sparse_step_fraction"),
                "perplexity": m.get("perplexity"),
                "nll_increase": quality.get("nll_increase"),
                "kl": quality.get("kl"),
                "decode_tokens_per_s": m.get("decode_tokens_per_s"),
                "tokens_per_problem": m.get("tokens_per_problem"),
                **_speedup_columns(m.get("speedup")),
                "decode_ms_per_step": m.get("decode_ms_per_step"),
                "device": record["provenance"]["device"],
                "git_sha": record["provenance"].get("git_sha"),
            }
        )
    runs = pd.DataFrame(rows)
    if not runs.empty:
        # Counts stay integers next to perplexity runs' None.
        for count in ("n", "problems", "correct", "unscorable"):
            runs[count] = runs[count].astype("Int64")
        runs["agreement"] = _agreement(runs, predictions)
        paired = _against_dense(runs, outcomes)
        for i, column in enumerate(("paired_problems", "only_method", "only_dense")):
            runs[column] = pd.array([p[i] for p in paired], dtype="Int64")
        runs["completions"] = [completions[key] for key in runs["run_key"]]
        tta = _time_to_answer(runs, Path(runs_dir))
        runs["time_to_answer"] = [t[0] for t in tta]
        runs["tta_low"], runs["tta_high"] = [t[1] for t in tta], [t[2] for t in tta]
    return runs


def dense_runs(runs: pd.DataFrame) -> dict[str, str]:
    """Pairing key -> the dense run of that pairing: every method run's reference
    (`bwprune.runs.pairing`)."""
    return {r.pairing: r.run_key for r in runs.itertuples() if r.method == "dense"}


def _speedup_columns(speedup: dict | None) -> dict:
    """A run's paired speedup over dense (`bwprune.runs.speedup`): per-step median and its span
    (`step_span`: the interval where the run has one, else min-max), the pairs, whether they met
    the target and whether the machine was overloaded, end-to-end median; None where the run was
    not timed (dense, or recorded before)."""
    s = speedup or {}
    step = s.get("step") or {}
    low, high, kind = step_span(step) if step else (None, None, None)
    interval = s.get("interval") or {}
    return {
        "speedup_step": step.get("median"),
        "speedup_step_low": low,
        "speedup_step_high": high,
        "speedup_kind": kind,
        "speedup_pairs": s.get("repeats"),
        "speedup_reached": interval.get("reached"),
        "speedup_overloaded": interval.get("overloaded"),
        "speedup_e2e": (s.get("e2e") or {}).get("median"),
    }


def _cost_columns(cost_cfg: dict | None, search: dict | None) -> dict:
    """A matched-cost run's target (`cost.target`; None for a run at a given ρ), the quantity
    it names, and what its chosen ρ realized on the calibration problems (`metrics.cost`)."""
    cost_cfg = cost_cfg or {}
    if cost_cfg.get("target") is None:
        return {"cost_target": None, "cost_quantity": None, "cost_realized": None}
    realized = (search or {}).get("realized")
    return {"cost_target": cost_cfg["target"], "cost_quantity": cost_cfg.get("quantity"),
            "cost_realized": realized}  # fmt: skip


def _time_to_answer(runs: pd.DataFrame, runs_dir: Path) -> list[tuple]:
    """Time-to-answer speedup against the matching dense run, and its span at the ends of the
    per-step span (`bwprune.runs.speedup.time_to_answer`, `time_to_answer_span`): lengths from
    both runs, time only from this run's own paired measurement."""
    dense = dense_runs(runs)
    out = []
    for r in runs.itertuples():
        ref = dense.get(r.pairing)
        if ref is None or pd.isna(r.speedup_step):
            out.append((None, None, None))
            continue
        mine, theirs = run_metrics(runs_dir / r.run_key), run_metrics(runs_dir / ref)
        span = time_to_answer_span(mine, theirs) or (None, None)
        out.append((time_to_answer(mine, theirs), *span))
    return out


def _samples(samples_path: Path) -> tuple[dict, dict, dict, float | None, float | None]:
    """(index, sample) -> final answer, -> a digest of the completion text (whether two runs
    wrote the same completions, `report.control`, without holding every text in memory) and ->
    whether it was correct (an unscorable sample is not); the fraction of samples cut at the
    token limit (from the rows, so runs recorded before `run.json` carried it have it too) and the
    fraction of those with a completion that write a false equation between numbers
    (`bwprune.scoring.arithmetic`); each None where no sample has what it needs."""
    predictions: dict = {}
    digests: dict = {}
    correct: dict = {}
    cut = slipped = 0
    if not samples_path.exists():
        return predictions, digests, correct, None, None
    for line in samples_path.read_text(encoding="utf-8").splitlines():
        s = json.loads(line)
        key = (s["index"], s.get("sample", 0))
        predictions[key] = s["prediction"]
        correct[key] = bool(s.get("correct"))
        cut += s.get("finish_reason") == "length"
        if "completion" in s:
            digests[key] = hashlib.sha1(s["completion"].encode()).hexdigest()
            slipped += check_arithmetic(s["completion"]).false > 0
    cut_rate = cut / len(predictions) if predictions else None
    return predictions, digests, correct, cut_rate, slipped / len(digests) if digests else None


def _against_dense(runs: pd.DataFrame, outcomes: dict) -> list[tuple]:
    """Per run, (samples it shares with its matching dense run, samples only it answered
    correctly, samples only dense answered correctly): the counts of an exact McNemar test
    (`bwprune.report.significance`), which may be summed over seeds. None each where there is
    no dense run (dense itself included: it is the reference) or no samples."""
    dense = dense_runs(runs)
    out = []
    for r in runs.itertuples():
        ref = dense.get(r.pairing)
        mine, theirs = outcomes[r.run_key], outcomes.get(ref, {})
        common = [k for k in mine if k in theirs]
        if ref is None or ref == r.run_key or not common:
            out.append((None, None, None))
            continue
        only_method = sum(mine[k] and not theirs[k] for k in common)
        only_dense = sum(theirs[k] and not mine[k] for k in common)
        out.append((len(common), only_method, only_dense))
    return out


def _agreement(runs: pd.DataFrame, predictions: dict) -> list[float | None]:
    """Fraction of samples whose answer equals the matching dense run's, over the samples where
    either run gave an answer (None: no dense run, or neither ever answered).

    Two runs that both gave no answer (both cut at the token limit, say) do not agree on one:
    counting them would make agreement measure how often both stop mid-reasoning.
    """
    dense = dense_runs(runs)
    out = []
    for r in runs.itertuples():
        ref = dense.get(r.pairing)
        if ref is None:
            out.append(None)
            continue
        mine, theirs = predictions[r.run_key], predictions[ref]
        common = [k for k in mine if k in theirs and (mine[k], theirs[k]) != (None, None)]
        out.append(sum(mine[k] == theirs[k] for k in common) / len(common) if common else None)
    return out
