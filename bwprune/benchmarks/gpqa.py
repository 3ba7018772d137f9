"""GPQA-Diamond (Rein et al., 2023): 198 graduate-level science questions with four choices.

The data is gated and its authors ask that it not be published in plain text, so it is not shipped:
it is read from a local CSV/JSONL copy (`data_file`, the official `gpqa_diamond.csv` columns), or
from the hub (`hub_id`/`hub_config`) when a token and the network exist. The four choices are
shuffled with a seed drawn from (`shuffle_seed`, question text), so every run, shard and machine
shows a question with the same letters. The prompt asks for a last line `Answer: X`
(simple-evals); `letter_extraction` (strict | lenient) says whether an answer stated in words
("The answer is C.") counts too, see `bwprune.scoring.choices`.
"""

from __future__ import annotations

import random
from pathlib import Path

from bwprune.benchmarks.base import Benchmark, Example, read_csv, read_jsonl
from bwprune.errors import UserError
from bwprune.scoring.choices import LETTERS, check_extraction, score_choice
from bwprune.scoring.common import Score

FIELDS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
          "Incorrect Answer 3")  # fmt: skip
# The synthetic stand-in used by tests marks its records so; it must never be reported as GPQA.
SYNTHETIC_ID_PREFIX = "synthetic-"


def shuffled_choices(row: dict, seed: int) -> tuple[list[str], str]:
    """The four choices in a fixed per-question order, and the gold letter."""
    correct = row["Correct Answer"].strip()
    choices = [correct, *(row[f"Incorrect Answer {k}"].strip() for k in (1, 2, 3))]
    random.Random(f"{seed}\n{row['Question']}").shuffle(choices)
    return choices, LETTERS[choices.index(correct)]


class GPQA(Benchmark):
    def __init__(
        self,
        name: str,
        data_file: str | None,
        prompt: str,
        hub_id: str,
        hub_config: str,
        hub_split: str,
        letter_extraction: str,
        shuffle_seed: int = 0,
    ) -> None:
        super().__init__(name, data_file, prompt)
        self.hub = (hub_id, hub_config, hub_split)
        self.letter_extraction = check_extraction(letter_extraction)
        self.shuffle_seed = shuffle_seed

    def examples(self) -> list[Example]:
        rows = self._rows()
        if self.name == "gpqa_diamond" and any(_is_synthetic(r) for r in rows):
            raise UserError(
                f"benchmark.data_file={self.data_file!r} holds SYNTHETIC test questions, not "
                "GPQA; run it under another name (benchmark.name=gpqa_synthetic) so it is never "
                "reported as GPQA-Diamond"
            )
        examples = []
        for i, row in enumerate(rows):
            choices, gold = shuffled_choices(row, self.shuffle_seed)
            listing = "\n".join(f"{letter}) {text}" for letter, text in zip(LETTERS, choices))
            question = self.prompt.format(question=row["Question"].strip(), choices=listing)
            examples.append(Example(i, str(row.get("Record ID", i)), question, gold))
        return examples

    def score(
        self, completion: str, gold: str, finish_reason: str, think_open: bool = False
    ) -> Score:
        return score_choice(completion, gold, finish_reason, self.letter_extraction, think_open)

    def _rows(self) -> list[dict]:
        """From `data_file` when set, else from the hub when possible, else a one-line error."""
        if self.data_file:
            suffix = Path(self.data_file).suffix.lower()
            readers = {".csv": read_csv, ".jsonl": read_jsonl}
            if suffix not in readers:
                raise UserError(
                    f"benchmark.data_file={self.data_file!r}: unknown format {suffix!r}; "
                    f"choose one of {sorted(readers)}"
                )
            return readers[suffix](self.data_file, FIELDS)
        return self._hub_rows()

    def _hub_rows(self) -> list[dict]:
        from huggingface_hub import get_token

        from bwprune.models.loading import hub_reachable  # deferred: it imports torch

        hub_id, config, split = self.hub
        how = (
            "pass a local copy of gpqa_diamond.csv with benchmark.data_file=/path/to/"
            f"gpqa_diamond.csv (or .jsonl), or log in to the hub after accepting {hub_id}'s terms"
        )
        if get_token() is None or not hub_reachable():
            raise UserError(f"GPQA-Diamond is gated and not shipped with bwprune; {how}")
        import datasets

        try:
            return list(datasets.load_dataset(hub_id, config, split=split))
        except Exception as e:  # gated without access, renamed, network dropped: all user-fixable
            first_line = (str(e).strip().splitlines() or [""])[0]
            cause = f"{type(e).__name__}: {first_line}"
            raise UserError(
                f"could not load {hub_id} ({config}) from the hub ({cause}); {how}"
            ) from e


def _is_synthetic(row: dict) -> bool:
    return str(row.get("Record ID", "")).startswith(SYNTHETIC_ID_PREFIX)
