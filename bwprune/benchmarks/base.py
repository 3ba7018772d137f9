"""A benchmark: examples read from a local JSONL file, a prompt per example, and a scorer.

Benchmarks never touch models or tensors; the chat template is applied by the experiment using the
model's config, because the same question is rendered differently for each model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bwprune.errors import UserError
from bwprune.scoring.math_answers import Score


@dataclass(frozen=True)
class Example:
    index: int  # position in the benchmark file: the stable id used by records and resume
    question: str  # the user message, instruction included
    gold: str


def read_jsonl(path: str | Path, required: tuple[str, ...]) -> list[dict]:
    """Rows of a JSONL file; a missing file or field raises a `UserError` naming file and line."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"benchmark data file {str(path)!r} does not exist")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            missing = [k for k in required if k not in row]
            if missing:
                raise UserError(
                    f"{path}:{lineno}: missing field(s) {missing}; need {list(required)}"
                )
            rows.append(row)
    return rows


class Benchmark:
    """Subclasses implement `examples()` and `score()`; `kind` says how the runner evaluates it."""

    kind = "generate"

    def __init__(self, name: str, data_file: str, prompt: str) -> None:
        self.name = name
        self.data_file = data_file
        self.prompt = prompt

    def examples(self) -> list[Example]:
        raise NotImplementedError

    def score(self, completion: str, gold: str) -> Score:
        raise NotImplementedError
