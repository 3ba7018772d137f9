"""Minerva Math (Lewkowycz et al., 2022): 272 MIT OCW problems; gold = the solution's last box.

The file has no answer field, so the gold is the last `\\boxed{}` of `solution`, as in
lm-evaluation-harness and Qwen2.5-Math. Two golds are written as numpy (`np.arcsin(...)`); the
prefix is turned into LaTeX. Other number formats (4.5e33, -1./3) are handled by the scorer, which
also drops units after a predicted number, as Minerva's own normalization does.
"""

from __future__ import annotations

import re

from bwprune.benchmarks.base import MathBenchmark
from bwprune.errors import UserError
from bwprune.scoring.answer_span import last_boxed

_NUMPY_FUNCTION = re.compile(r"np\.([a-z]+)")


def minerva_gold(solution: str) -> str:
    """'... =\\boxed{1.6} cm' -> '1.6'; raises `UserError` when the solution has no box."""
    boxed = last_boxed(solution)
    if boxed is None:
        raise UserError(f"Minerva solution without a \\boxed{{}} answer: {solution[-80:]!r}")
    return _NUMPY_FUNCTION.sub(r"\\\1", boxed.strip())


class Minerva(MathBenchmark):
    id_field = "idx"
    gold_fields = ("solution",)
    units_in_answer = True  # physics answers carry units (\mathrm{~cm}, \AA, arcsec)

    def gold(self, row: dict) -> str:
        return minerva_gold(row["solution"])
