"""GSM8K (Cobbe et al., 2021): grade-school math word problems, gold = the number after `####`."""

from __future__ import annotations

from bwprune.benchmarks.base import MathBenchmark


def gsm8k_gold(answer: str) -> str:
    """'... #### 1,234' -> '1234'."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


class GSM8K(MathBenchmark):
    question_field = "question"
    latex_gold = False

    def gold(self, row: dict) -> str:
        return gsm8k_gold(row["answer"])
