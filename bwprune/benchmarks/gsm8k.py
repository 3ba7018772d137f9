"""GSM8K (Cobbe et al., 2021): grade-school math word problems, gold = the number after `####`."""

from __future__ import annotations

from bwprune.benchmarks.base import Benchmark, Example, read_jsonl
from bwprune.scoring.math_answers import Score, score_math


def gsm8k_gold(answer: str) -> str:
    """'... #### 1,234' -> '1234'."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


class GSM8K(Benchmark):
    def examples(self) -> list[Example]:
        rows = read_jsonl(self.data_file, ("question", "answer"))
        return [
            Example(i, self.prompt.format(question=r["question"]), gsm8k_gold(r["answer"]))
            for i, r in enumerate(rows)
        ]

    def score(self, completion: str, gold: str) -> Score:
        return score_math(completion, gold)
