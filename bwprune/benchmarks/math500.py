"""MATH-500 (Lightman et al., 2023): the PRM800K test split of MATH; gold = the `answer` field."""

from __future__ import annotations

from bwprune.benchmarks.base import MathBenchmark


class MATH500(MathBenchmark):
    id_field = "unique_id"  # e.g. "test/precalculus/807.json"

    def gold(self, row: dict) -> str:
        return row["answer"]  # LaTeX without delimiters, e.g. "\frac{14}{3}" or "90^\circ"
