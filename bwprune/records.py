"""Run records on disk: one folder per resolved config, written as results are produced.

Layout of a run folder (see README "Results"):
  config.yaml    the resolved config, written first
  samples.jsonl  one line per (example, sample), appended and flushed after every batch
  timing.jsonl   one line per generated batch (prefill/decode seconds, per-step times)
  run.json       written last: metrics + provenance; its presence marks the run complete
  cost.json      a matched-cost run's search (`bwprune.cost_target`), written before any batch
  .lock          while a process owns the folder (`bwprune.run_lock`)
Metrics are a pure function of samples.jsonl and timing.jsonl (`bwprune.summary`), so an
interrupted run resumes where it stopped and a rescored run needs no model. The row schemas of
both files are here (`sample_row`, `timing_row`), and so are the run's identity and key. This
module imports no torch (tables and rescoring use it without a model) and knows nothing of any
method.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from bwprune.config import package_data_dir
from bwprune.errors import UserError
from bwprune.run_lock import hold

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # types only: importing them would pull torch into the report's imports
    from bwprune.benchmarks.base import Example
    from bwprune.generation.runner import BatchTiming, Completion
    from bwprune.scoring.common import Score

# Keys that never change what a run computes: they are left out of the run's identity.
# `sparsity` and `calibration` matter only through the method config that interpolates them.
NON_IDENTITY_KEYS = (
    "logger", "paths", "tags", "exp_name", "progress", "sparsity", "calibration", "hydra", "speed",
)  # fmt: skip
# How the decode loop runs, never what it computes (tested token for token): not identity.
ENGINE_KEYS = ("kv_cache", "compile", "compile_backend", "compaction")
# Options added after runs were recorded: in a run's identity only when set away from their
# default, so adding one does not re-key (and so re-run) every recorded run.
LATE_OPTIONS = {
    ("quality", "traces"): False,
    ("generation", "batch_invariant"): False,
    ("generation", "batching"): "static",
    ("method", "attn_square"): False,  # trisp's FLAP-style squared attention scores
    ("method", "memory_policy"): "max",  # ours under continuous batching (and its ablations)
    ("method", "memory_decay"): 0.9,
    ("method", "memory_window"): 4,
    ("method", "on_enter"): "prompt",
}
# Method classes renamed after runs were recorded: a run's identity names the class as it was
# recorded, so a rename re-keys nothing.
RENAMED_TARGETS = {"bwprune.methods.ours.Ours": "bwprune.methods.ours.BWAP"}
# Blocks that change nothing while their switch is null: out of a run's identity then, so adding
# one re-keys no recorded run.
SWITCHED_BLOCKS = {"cost": "target"}


def method_name(cfg: DictConfig) -> str:
    """The method's config choice (`conf/method/<name>.yaml` carries its own `name`)."""
    return str(cfg.method.name)


def target_sparsity(cfg: DictConfig) -> float:
    """The method's own target ρ (0 for methods without one, e.g. dense)."""
    return float(cfg.method.get("sparsity", 0.0))


def identity(cfg: DictConfig) -> dict:
    """The resolved config without the keys that cannot change the outputs (the method's `name`
    is in the run key itself, its arguments and `_target_` are what the hash must see; the
    engine settings change speed only)."""
    return _identity(OmegaConf.to_container(cfg, resolve=True), package_data_dir())


def settings(recorded: dict) -> dict:
    """A recorded run's identity (read back from its config.yaml) without the seed: what it
    computed, so tables can tell the runs one cell may average from those it must not mix.
    Shipped data is named relative to the data folder of the checkout that made the run."""
    data_dir = recorded.get("paths", {}).get("data_dir") or package_data_dir()
    ident = _identity(recorded, data_dir)
    ident.pop("seed", None)
    return ident


def _identity(resolved: dict, data_dir: str) -> dict:
    kept = {k: v for k, v in resolved.items() if k not in NON_IDENTITY_KEYS}
    for (group, key), default in LATE_OPTIONS.items():
        if kept.get(group, {}).get(key, default) == default:
            kept[group] = {k: v for k, v in kept[group].items() if k != key}
    for block, switch in SWITCHED_BLOCKS.items():
        if kept.get(block, {}).get(switch) is None:
            kept.pop(block, None)
    target = kept.get("method", {}).get("_target_")
    if target in RENAMED_TARGETS:
        kept["method"] = {**kept["method"], "_target_": RENAMED_TARGETS[target]}
    for group, dropped in (("method", ("name",)), ("generation", ENGINE_KEYS)):
        if group in kept:
            kept[group] = {k: v for k, v in kept[group].items() if k not in dropped}
    return _portable(kept, data_dir)


def _portable(node, data_dir: str):
    """Portable identity: where a cache lives never changes results (a method may carry
    `cache_dir`), and data shipped in the package is named relative to it, so the same config
    has the same key in every checkout."""
    if isinstance(node, dict):
        return {k: _portable(v, data_dir) for k, v in node.items() if k != "cache_dir"}
    if isinstance(node, list):
        return [_portable(v, data_dir) for v in node]
    if isinstance(node, str) and node.startswith(data_dir):
        return "bwprune/data" + node[len(data_dir) :]
    return node


def run_key(cfg: DictConfig) -> str:
    """`<benchmark>/<model>/<method>/rho=<ρ>_bs=<B>_seed=<s>_<hash8>`, unique per identity.

    ρ is the method's own `sparsity` (0 for methods without one, e.g. dense), so a dense run is the
    same run whatever top-level `sparsity` says. A matched-cost run names its target instead
    (`params=0.3_...`): its ρ is chosen by the run.
    """
    ident = identity(cfg)
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:8]
    cost = cfg.get("cost")
    target = (f"{cost.quantity}={cost.target:g}" if cost is not None and cost.target is not None
              else f"rho={target_sparsity(cfg):g}")  # fmt: skip
    leaf = f"{target}_bs={cfg.batch_size}_seed={cfg.seed}_{digest}"
    return f"{cfg.benchmark.name}/{cfg.model.name}/{method_name(cfg)}/{leaf}"


class RunRecorder:
    """Owns one run folder: appends batches as they come, writes run.json last.

    A batch is committed by its line in timing.jsonl, written after its samples: samples without
    it (a crash or a full disk between the two writes) are dropped when the run resumes, and
    their batch is generated again, so every batch on record has both its samples and its timing.
    Reading keeps the first row of a (problem, sample) pair or of a batch, should one be repeated.
    """

    def __init__(self, root: str | Path, key: str) -> None:
        self.key = key
        self.dir = Path(root) / key
        self.samples_path = self.dir / "samples.jsonl"
        self.timing_path = self.dir / "timing.jsonl"
        self.run_path = self.dir / "run.json"
        self.cost_path = self.dir / "cost.json"

    def is_complete(self) -> bool:
        return self.run_path.exists()

    def record(self) -> dict:
        """The complete run's `run.json`."""
        return json.loads(self.run_path.read_text())

    @contextmanager
    def owned(self) -> Iterator[None]:
        """This process's hold on the folder (`bwprune.run_lock`), waiting while another process
        holds it. A run that stops before recording anything leaves no folder behind."""
        results = (self.samples_path, self.timing_path, self.run_path, self.cost_path)
        with hold(self.dir):
            try:
                yield
            except BaseException:
                if not any(p.exists() for p in results):
                    (self.dir / "config.yaml").unlink(missing_ok=True)
                raise

    def start(self, cfg: DictConfig) -> None:
        """Begin, or resume from the committed batches only (see the class), and write the
        config; files are rewritten whole, so appends start on a clean line."""
        self.dir.mkdir(parents=True, exist_ok=True)
        samples, timings = self.samples(), self.timings()
        have = {self.row_key(s) for s in samples}
        committed: set = set()
        for t in timings:  # whole batches, each pair in one only: a repeated pair is redone
            keys = set(batch_keys(t))
            if keys <= have and not keys & committed:
                committed |= keys
        timings = [t for t in timings if set(batch_keys(t)) <= committed]
        samples = [s for s in samples if self.row_key(s) in committed]
        for path, rows in ((self.samples_path, samples), (self.timing_path, timings)):
            if path.exists() and path.read_bytes() != _jsonl(rows).encode():
                self._replace(path, _jsonl(rows))
        with self._writing():
            (self.dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    def cost_search(self) -> dict | None:
        """The run's matched-cost search (cost.json), or None: kept apart from the batches and
        written whole, so a resumed run reuses a finished search instead of repeating it."""
        return json.loads(self.cost_path.read_text()) if self.cost_path.exists() else None

    def save_cost_search(self, search: dict) -> None:
        self._write_whole(self.cost_path, search)

    def samples(self) -> list[dict]:
        return _first_of_each(_read_jsonl(self.samples_path), self.row_key)

    def timings(self) -> list[dict]:
        return _first_of_each(_read_jsonl(self.timing_path), lambda t: tuple(batch_keys(t)))

    @staticmethod
    def row_key(sample: dict) -> tuple[int, int]:
        """(problem index, sample number); rows written before `sample` existed are sample 0."""
        return sample["index"], sample.get("sample", 0)

    def done_keys(self) -> set[tuple[int, int]]:
        return {self.row_key(s) for s in self.samples()}

    def rows(self) -> tuple[list[dict], list[dict]]:
        """Samples and timings, checked to agree: each sample in exactly one batch's timing,
        each batch's samples all there. Metrics are computed from these only, so run.json never
        summarizes a record that disagrees with itself."""
        samples, timings = self.samples(), self.timings()
        batched = Counter(k for t in timings for k in batch_keys(t))
        have = {self.row_key(s) for s in samples}
        faults = {
            "sampled but in no batch's timing": have - set(batched),
            "in a batch's timing but not sampled": set(batched) - have,
            "in two batches": {k for k, n in batched.items() if n > 1},
        }
        found = "; ".join(f"{what}: {sorted(keys)[:4]}" for what, keys in faults.items() if keys)
        if found:
            raise UserError(
                f"{self.dir} is inconsistent, (problem, sample) pairs {found}; nothing was "
                "changed. Move its run.json aside and run the same command again: only the "
                "batches of those pairs are generated again, every other batch is kept"
            )
        return samples, timings

    def replace_samples(self, samples: list[dict]) -> None:
        """samples.jsonl rewritten whole (rescoring): the old file stays until the new is."""
        self._replace(self.samples_path, _jsonl(samples))

    def append(self, samples: Iterable[dict], timing: dict) -> None:
        """Write one batch, committed by its timing line (see the class); both are flushed."""
        with self._writing():
            _append_jsonl(self.samples_path, samples)
            _append_jsonl(self.timing_path, [timing])

    def write(self, samples: list[dict], timings: list[dict]) -> None:
        """Both files at once, for records assembled from others (merged shards)."""
        _write_jsonl(self.samples_path, samples)
        _write_jsonl(self.timing_path, timings)

    def finish(self, metrics: dict, prov: dict, extra: dict | None = None) -> dict:
        record = {
            "run_key": self.key,
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "metrics": metrics,
            "provenance": prov,
            **(extra or {}),
        }
        self._write_whole(self.run_path, record)
        return record

    def _write_whole(self, path: Path, data: dict) -> None:
        self._replace(path, json.dumps(data, indent=2) + "\n")

    def _replace(self, path: Path, text: str) -> None:
        """`text` written aside and renamed into place: the file is the old one or the new one,
        whole, even when the disk fills on the way (then the part written aside is removed)."""
        tmp = path.with_name(path.name + ".tmp")
        with self._writing():
            try:
                tmp.write_text(text, encoding="utf-8")
                tmp.replace(path)
            finally:
                tmp.unlink(missing_ok=True)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A failed write (a full disk, a lost mount) as one line: what is kept, how to go on."""
        try:
            yield
        except OSError as e:
            raise UserError(
                f"cannot write to {self.dir}: {e.strerror}; every batch recorded before is kept, "
                "run the same command again to resume"
            ) from None


def batch_keys(timing: dict) -> list[tuple[int, int]]:
    """The (problem, sample) pairs a timing row's batch held (rows before `samples`: sample 0)."""
    return list(zip(timing["indices"], timing.get("samples") or [0] * len(timing["indices"])))


def sample_row(
    example: Example,
    sample: int,
    completion: Completion,
    score: Score,
    think_open: bool,
    quality: dict | None = None,
) -> dict:
    """One line of samples.jsonl: the problem, the completion, its score and what it cost."""
    return {
        "index": example.index,
        "sample": sample,
        "id": example.id,
        "prompt": example.question,
        "think_open": think_open,
        "completion": completion.text,
        "prediction": score.prediction,
        "gold": example.gold,
        "correct": score.correct,
        "score_reason": score.reason,
        "new_tokens": completion.new_tokens,
        "finish_reason": completion.finish_reason,
        "sparsity": completion.sparsity,
        "quality": quality,  # teacher-forced fidelity to dense (bwprune/quality.py), or None
    }


def timing_row(batch: list[tuple[Example, int]], timing: BatchTiming) -> dict:
    """One line of timing.jsonl: which (problem, sample) pairs a batch held and its times."""
    return {
        "indices": [e.index for e, _ in batch],
        "samples": [k for _, k in batch],
        "prefill_s": timing.prefill_s,
        "decode_s": timing.decode_s,
        "decode_tokens": timing.decode_tokens,
        "step_ms": [round(1e3 * s, 4) for s in timing.step_s],
    }


def _append_jsonl(path: Path, rows: Iterable[dict]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(_jsonl(rows))
        f.flush()


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text(_jsonl(rows), encoding="utf-8")


def _jsonl(rows: Iterable[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def _first_of_each(rows: list[dict], key: Callable[[dict], Hashable]) -> list[dict]:
    """`rows` without repeats of a key, the first kept: a record never counts a row twice."""
    kept: dict = {}
    for row in rows:
        kept.setdefault(key(row), row)
    return list(kept.values())


def _read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file. A last line that does not decode (bytes or JSON) is a write
    cut short (a crash, a full disk): it is dropped with one log line, and its batch, uncommitted,
    is generated again on resume. A bad line with rows after it is no torn write: reading stops
    with the file, the line and what to do, and nothing is changed."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows = []
    for number, line in enumerate(lines[: last + 1], start=1):
        row = _decoded(line)
        if isinstance(row, dict):
            rows.append(row)
        elif number == last + 1:
            log.warning("%s: dropped its last line, cut short by an interrupted write (%d bytes); "
                        "its batch is generated again on resume", path, len(line))  # fmt: skip
        elif line.strip():
            raise UserError(
                f"{path} line {number} is not a JSON row ({row}), and complete rows follow it, "
                "so it is no interrupted write; nothing was changed. Repair that line (a "
                "committed run: `git checkout` the file), or remove it: the batch it belonged to "
                "is then generated again on resume, every other batch is kept"
            )
    return rows


def _decoded(line: bytes) -> dict | str:
    """One line's row, or why it is none."""
    try:
        row = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8"
    except json.JSONDecodeError as e:
        return f"invalid JSON: {e.msg} at column {e.colno}"
    return row if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"
