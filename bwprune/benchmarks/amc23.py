"""AMC23: the 40 AMC 12 2023 problems shipped by Qwen2.5-Math; gold = the `answer` field.

The answers are stored as floats (27.0); the gold is written as the number a model would write
("27"), and compared as a number by math-verify.
"""

from __future__ import annotations

from bwprune.benchmarks.base import MathBenchmark


def number_text(value: float | int | str) -> str:
    """27.0 -> '27', 2.5 -> '2.5': integers lose the '.0' a float answer field carries."""
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


class AMC23(MathBenchmark):
    id_field = "id"
    latex_gold = False

    def gold(self, row: dict) -> str:
        return number_text(row["answer"])
