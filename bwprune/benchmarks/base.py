"""A benchmark: examples read from a local data file, a prompt per example, and a scorer.

Benchmarks never touch models or tensors; the chat template is applied by the experiment using the
model's config, because the same question is rendered differently for each model.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from bwprune.errors import UserError
from bwprune.scoring.common import Score
from bwprune.scoring.math_answers import score_math


@dataclass(frozen=True)
class Example:
    index: int  # position in the benchmark file: the stable key used by records and resume
    id: str  # the dataset's own id (`unique_id`, `idx`, ...; the index where it has none)
    question: str  # the user message, instruction included
    gold: str


def read_jsonl(path: str | Path, required: tuple[str, ...]) -> list[dict]:
    """Rows of a JSONL file; a missing file or field raises a `UserError` naming file and line."""
    path = _existing(path)
    with path.open(encoding="utf-8") as f:
        lines = [(n, line) for n, line in enumerate(f, 1) if line.strip()]
    rows = []
    for lineno, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        rows.append(_checked(row, required, f"{path}:{lineno}"))
    return rows


def read_csv(path: str | Path, required: tuple[str, ...]) -> list[dict]:
    """Rows of a CSV file with a header line (fields may span lines), checked like `read_jsonl`."""
    path = _existing(path)
    with path.open(encoding="utf-8", newline="") as f:
        return [
            _checked(r, required, f"{path} row {n}") for n, r in enumerate(csv.DictReader(f), 1)
        ]


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise UserError(f"benchmark data file {str(path)!r} does not exist")
    return path


def _checked(row: dict, required: tuple[str, ...], where: str) -> dict:
    missing = [k for k in required if k not in row]
    if missing:
        raise UserError(f"{where}: missing field(s) {missing}; need {list(required)}")
    return row


class Benchmark:
    """Subclasses implement `examples()` and `score()`; `kind` says how the runner evaluates it.

    `score` is a pure function of (completion, gold, finish_reason, think_open), so finished runs
    can be rescored; `finish_reason` says whether generation stopped on its own ("stop") or at the
    token limit ("length"), `think_open` whether the prompt itself opened a `<think>` block.
    """

    kind = "generate"

    def __init__(self, name: str, data_file: str | None, prompt: str) -> None:
        self.name = name
        self.data_file = data_file
        self.prompt = prompt

    def examples(self) -> list[Example]:
        raise NotImplementedError

    def score(
        self, completion: str, gold: str, finish_reason: str, think_open: bool = False
    ) -> Score:
        raise NotImplementedError


class MathBenchmark(Benchmark):
    """A JSONL file of problems with one final math answer each, scored with math-verify.

    Subclasses name their fields and say how the gold answer is read from a row; the prompt has
    one `{question}` slot.
    """

    question_field = "problem"
    id_field: str | None = None  # None: the dataset has no id; the line index serves
    gold_fields: tuple[str, ...] = ("answer",)
    latex_gold = True  # gold is LaTeX (read as a box's content), else a plain number
    units_in_answer = False  # the benchmark's convention drops units after a number (Minerva)

    def gold(self, row: dict) -> str:
        raise NotImplementedError

    def examples(self) -> list[Example]:
        id_fields = (self.id_field,) if self.id_field else ()
        rows = read_jsonl(self.data_file, (self.question_field, *self.gold_fields, *id_fields))
        return [
            Example(
                index=i,
                id=str(r[self.id_field]) if self.id_field else str(i),
                question=self.prompt.format(question=r[self.question_field]),
                gold=self.gold(r),
            )
            for i, r in enumerate(rows)
        ]

    def score(
        self, completion: str, gold: str, finish_reason: str, think_open: bool = False
    ) -> Score:
        return score_math(
            completion,
            gold,
            finish_reason,
            latex_gold=self.latex_gold,
            units_in_answer=self.units_in_answer,
            think_open=think_open,
        )
