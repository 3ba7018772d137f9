"""Run records on disk: one folder per resolved config, written as results are produced.

Layout of a run folder (see docs/records.md):
  config.yaml    the resolved config, written first
  samples.jsonl  one line per (example, sample), appended and flushed after every batch
  timing.jsonl   one line per generated batch (prefill/decode seconds, per-step times)
  run.json       written last: metrics + provenance; its presence marks the run complete
  cost.json      a matched-cost run's search (`bwprune.generation.cost_target`), before any batch
  .lock          while a process owns the folder (`bwprune.runs.run_lock`)
Metrics are a pure function of samples.jsonl and timing.jsonl (`bwprune.runs.summary`), so an
interrupted run resumes where it stopped and a rescored run needs no model. The rows are made by
`bwprune.generation.samples`; the folder's name is the run's key (`bwprune.runs.identity`). This
module imports no torch (tables and rescoring use it without a model) and knows nothing of any
method.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bwprune.errors import UserError
from bwprune.runs.run_lock import hold

log = logging.getLogger(__name__)


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
        """This process's hold on the folder (`bwprune.runs.run_lock`), waiting while another
        process holds it. A run that stops before recording anything leaves no folder behind."""
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
